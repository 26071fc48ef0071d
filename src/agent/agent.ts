// Picks the agent a spec names. An agent works inside the episode's sandbox session until it finishes
// or its ceiling passes; what it receives and returns is in agent-context.ts.
import type { AgentSpec } from '../tasks/agent-spec.ts';
import type { Agent } from './agent-context.ts';
import { CommandAgent } from './command-agent.ts';
import { LlmAgent } from './llm-agent.ts';
import { OracleAgent } from './oracle-agent.ts';

/** The factory's callers (the episode runner) get the agent types with it. */
export type { Agent, AgentContext, AgentRun } from './agent-context.ts';

export function createAgent(spec: AgentSpec): Agent {
  switch (spec.kind) {
    case 'oracle':
      return new OracleAgent();
    case 'command':
      return new CommandAgent(spec.command);
    case 'llm':
      return new LlmAgent(spec);
    default: {
      const unreachable: never = spec;
      throw new TypeError(`unknown agent ${JSON.stringify(unreachable)}`);
    }
  }
}

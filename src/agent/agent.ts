// The agent interface: an agent works inside the episode's sandbox session until it finishes or its
// ceiling passes. Agents never create or remove sandboxes; the episode owns the session.
import type { ExecResult, SandboxSession } from '../sandbox/sandbox-session.ts';
import type { AgentSpec } from '../tasks/agent-spec.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import { CommandAgent } from './command-agent.ts';
import { LlmAgent } from './llm-agent.ts';
import type { AgentEvent } from './reference/agent-events.ts';
import type { AgentInput } from './reference/agent-input.ts';
import { OracleAgent } from './oracle-agent.ts';

export interface AgentContext {
  session: SandboxSession;
  task: TaskSpec;
  archive: TaskArchive;
  /** The agent is stopped (its whole process tree) after this long. */
  ceilingMs: number;
  /** Cap of each captured output stream. */
  outputCapBytes: number;
  signal: AbortSignal;
  /** Where the runtime generation is mounted (agents that run node in the sandbox). */
  runtimeMountPath?: string;
  /** The episode's model proxy socket, the same path inside the sandbox and out. */
  modelSocket?: string;
  /** The conversation to resume from (the latest durable checkpoint). */
  resume?: AgentInput['resume'];
  /** Every event the agent reports (model calls, tool calls, checkpoints, its ending). */
  onEvent?: (event: AgentEvent) => void;
}

/**
 * The agent's process as an exec ended: `timedOut` means the ceiling passed (the episode is still
 * verified), `aborted` that the episode's signal stopped it (cancellation, drain: not verified).
 */
export interface AgentRun extends ExecResult {
  /** Model tokens used (LLM agents). */
  usage?: { promptTokens: number; completionTokens: number; totalTokens: number };
  /** How an LLM agent ended: finished, stopped, max_turns, context or budget. */
  finalReason?: string;
}

export interface Agent {
  run(ctx: AgentContext): Promise<AgentRun>;
}

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

/** What every shell agent sees in its environment: the instruction, never a secret. */
export function agentEnv(task: TaskSpec): Record<string, string> {
  return { TASK_ID: task.id, TASK_INSTRUCTION: task.instruction };
}

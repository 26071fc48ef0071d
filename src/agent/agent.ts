// The agent interface: an agent works inside the episode's sandbox session until it finishes or its
// ceiling passes. Agents never create or remove sandboxes; the episode owns the session.
import type { CapturedOutput } from '../sandbox/captured-output.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { AgentSpec } from '../tasks/agent-spec.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import { CommandAgent } from './command-agent.ts';
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
}

export interface AgentRun {
  /** The agent process's exit code; null when it was killed. */
  exitCode: number | null;
  /** The ceiling passed and the agent was stopped; the episode is still verified. */
  timedOut: boolean;
  /** The episode's signal stopped the agent (cancellation, drain); it is not verified. */
  aborted: boolean;
  stdout: CapturedOutput;
  stderr: CapturedOutput;
  durationMs: number;
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

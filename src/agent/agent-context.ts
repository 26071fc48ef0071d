// What an agent gets (its context: the episode's sandbox session, task, ceiling, signal) and gives
// back (its run), and the interface every agent implements. Agents never create or remove sandboxes;
// the episode owns the session. Its own module so the concrete agents and the factory in agent.ts
// depend on it, not on each other.
import type { ExecResult, SandboxSession } from '../sandbox/sandbox-session.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import type { AgentEvent } from './reference/agent-events.ts';
import type { AgentInput } from './reference/agent-input.ts';

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
  /** The model the episode plays (its batch's `model.name`, else its endpoint's), when one is named. */
  modelName?: string;
  /** The phase's network (HTTP_PROXY and the rest, src/episode/phase-egress.ts) when it has one: every exec of the agent gets it. */
  networkEnv?: Record<string, string>;
  /**
   * The task's workspace as a tar for "/", not in the sandbox yet: the agent's exec unpacks it first
   * (saving the engine's put), or the agent puts it before it starts.
   */
  workspaceIn?: Buffer;
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

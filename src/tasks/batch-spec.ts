// The batch file (YAML): which task folders to run, how many samples of each, with which agent, and
// defaults for the tasks. Paths are relative to the batch file.
import { z } from 'zod';
import { AgentSpec, ModelOptions } from './agent-spec.ts';
import { TaskDefaults } from './task-spec.ts';

/** A task already packed and stored in the fleet's Redis, by the sha256 of its archive. */
export const TaskDigest = z.string().regex(/^[a-f0-9]{64}$/, 'a task digest: 64 lower-case hex digits (sha256 of the task archive)');
export const TaskDigestRef = z.strictObject({ digest: TaskDigest });

/** The reward an episode needs to pass when its batch sets no `passThreshold`. */
export const DEFAULT_PASS_THRESHOLD = 1;

/**
 * The reward at or above which a graded episode passes (status passed, and a success for pass@k and
 * the pass rate): a finite number greater than 0 (rewards are floats; Harbor's may pass 1).
 */
export const PassThreshold = z
  .number({ error: (issue) => (issue.input === undefined ? undefined : 'expected a finite number greater than 0 (the reward an episode needs to pass)') })
  .positive('expected a finite number greater than 0 (the reward an episode needs to pass)');

/** Whether a reward passes under `threshold` (the batch's, else 1). */
export function passes(reward: number | null, threshold: number | undefined): boolean {
  return reward !== null && reward >= (threshold ?? DEFAULT_PASS_THRESHOLD);
}

/** Policy versions an episode may span between its first model call and its last (0: none may change). */
export const MaxStaleness = z.number().int('expected a whole number of policy versions').min(0, 'expected 0 or more policy versions');

/** Stale restarts an episode may have before it ends with error policy_stale (src/model/policy-versions.ts). */
export const MaxStaleRestarts = z.number().int('expected a whole number of restarts').min(0, 'expected 0 or more restarts').max(20, 'expected at most 20 restarts');

/**
 * A Harbor task's agent processes when its shared verifier grades (Harbor's default mode): 'keep' as
 * Harbor does (a server or VM the agent started is still there for the tests), or 'stop' them first
 * by a restart of the sandbox (nothing the agent left runs beside the grader; its ENTRYPOINT runs
 * again). The fleet's own tasks always stop them (the sweep).
 */
export const AgentProcesses = z.enum(['keep', 'stop']);
export type AgentProcesses = z.infer<typeof AgentProcesses>;
export const DEFAULT_AGENT_PROCESSES: AgentProcesses = 'keep';

export const BatchFile = z.strictObject({
  /** Shown in status and used as the start of the batch id. @default the file's base name */
  name: z
    .string()
    .regex(/^[a-z0-9][a-z0-9_-]{0,39}$/, 'lower-case letters, digits, - and _, at most 40 characters')
    .optional(),
  /**
   * Task folders (with task.yaml), folders whose sub-folders are tasks, or tasks already packed and
   * stored (`{ digest: <sha256 hex> }`, as the API's task upload and `FleetClient.uploadTask` return).
   */
  tasks: z.array(z.union([z.string().min(1), TaskDigestRef])).min(1).max(10_000),
  /** Episodes per task. @default 1 */
  samples: z.number().int().min(1).max(10_000).default(1),
  agent: AgentSpec,
  /** What to ask of the model calls, e.g. `{ capture: tokens }`. */
  model: ModelOptions.optional(),
  /** The reward an episode needs to pass (status passed; pass@k, the pass rate). @default 1 */
  passThreshold: PassThreshold.optional(),
  /**
   * Policy versions an episode may span between its first model call and its last; a call that would
   * pass it is refused and the episode restarts from scratch (not from its checkpoint). @default no limit
   */
  maxStaleness: MaxStaleness.optional(),
  /** Stale restarts an episode may have; past them it ends with error policy_stale (kind model). @default 3 */
  maxStaleRestarts: MaxStaleRestarts.optional(),
  /** Harbor tasks graded in the agent's container: its processes 'keep' running (Harbor's way) or 'stop' first. @default keep */
  agentProcesses: AgentProcesses.optional(),
  defaults: TaskDefaults.default({}),
});
export type BatchFile = z.infer<typeof BatchFile>;

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
  defaults: TaskDefaults.default({}),
});
export type BatchFile = z.infer<typeof BatchFile>;

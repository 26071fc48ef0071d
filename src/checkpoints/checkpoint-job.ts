// The `checkpoints` queue: the background writer. The episode worker hands each checkpoint over and
// goes on; the writer persists it atomically and keeps the latest per episode. The payload only points
// at the staged checkpoint (a Redis hash with a TTL, see src/checkpoints/checkpoint-staging.ts), so
// transcripts and workspace tars never sit in job data, completed jobs included.
import type { JobsOptions } from 'bullmq';
import { z } from 'zod';
import { EpisodeId } from '../ids/episode-id.ts';

export const CHECKPOINTS_QUEUE = 'checkpoints';
export const CHECKPOINT_JOB = 'checkpoint';

export const CheckpointJob = z.strictObject({
  episodeId: EpisodeId,
  /** Increases with every checkpoint of the episode; the same seq written twice is one checkpoint. */
  seq: z.number().int().min(0),
  /** Redis key of the staged checkpoint; the writer deletes it once the checkpoint is on disk. */
  stagedKey: z.string().min(1),
  /** When the agent emitted the checkpoint. */
  createdAt: z.iso.datetime(),
});
export type CheckpointJob = z.infer<typeof CheckpointJob>;

export const CheckpointResult = z.object({
  /**
   * written: now durable; already-written: that seq was; superseded: `keep` newer ones were; fenced:
   * the episode already had its result (nothing is kept, a write that raced the result is removed again).
   */
  outcome: z.enum(['written', 'already-written', 'superseded', 'fenced']),
  /** The seq latest.json points at afterwards. */
  latest: z.number().int(),
  /** The checkpoint's folder (unless superseded). */
  dir: z.string().optional(),
  /** When the writer had it (and latest.json) durable on disk. */
  durableAt: z.iso.datetime(),
});
export type CheckpointResult = z.infer<typeof CheckpointResult>;

export const checkpointJobOptions = {
  attempts: 5,
  backoff: { type: 'exponential', delay: 200 },
  // Completed jobs are a few bytes each (the staged data is deleted once written).
  removeOnComplete: { age: 3600, count: 1_000 },
  removeOnFail: { age: 7 * 24 * 3600 },
} as const satisfies JobsOptions;

export const checkpointJobId = (episodeId: string, seq: number) => `${episodeId}.cp${seq}`;

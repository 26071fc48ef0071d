// The `checkpoints` queue: the background writer. The episode worker hands each checkpoint over and
// goes on; the writer persists it atomically and keeps the latest per episode.
import type { JobsOptions } from 'bullmq';
import { z } from 'zod';

export const CHECKPOINTS_QUEUE = 'checkpoints';

export const CheckpointJob = z.strictObject({
  episodeId: z.string().regex(/^[a-z0-9][a-z0-9_.-]{0,199}$/, 'lower-case letters, digits, ., - and _'),
  /** Increases by one per checkpoint of the episode; the same seq written twice is one checkpoint. */
  seq: z.number().int().min(0),
  /** What the agent needs to resume (transcript, counters); kept small, large parts go elsewhere. */
  state: z.record(z.string(), z.unknown()),
  createdAt: z.iso.datetime(),
});
export type CheckpointJob = z.infer<typeof CheckpointJob>;

export const CheckpointResult = z.object({ file: z.string(), latest: z.number().int() });
export type CheckpointResult = z.infer<typeof CheckpointResult>;

export const checkpointJobOptions = {
  attempts: 5,
  backoff: { type: 'exponential', delay: 200 },
  removeOnComplete: { count: 1_000 },
  removeOnFail: { age: 7 * 24 * 3600 },
} as const satisfies JobsOptions;

export const checkpointJobId = (episodeId: string, seq: number) => `${episodeId}.cp${seq}`;

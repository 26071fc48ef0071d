// The `batches` queue: one parent job per batch (BullMQ FlowProducer), its episodes the children.
// When the last child ends, the parent runs once and stores the batch summary with the results.
import type { JobsOptions } from 'bullmq';
import { z } from 'zod';

export const BATCHES_QUEUE = 'batches';

/**
 * A batch larger than one enqueue chunk is added in chunks; until the last one is in, the parent also
 * waits on its gate: a job of this queue (job id = batch id), which no worker reads and the producer
 * removes once every episode is added, so the parent cannot run on a part of its batch.
 */
export const BATCH_GATES_QUEUE = 'batch-gates';

export const BatchJob = z.strictObject({
  batchId: z.string().min(1),
  name: z.string().min(1),
  total: z.number().int().positive(),
});
export type BatchJob = z.infer<typeof BatchJob>;

export const batchJobOptions = {
  attempts: 5,
  backoff: { type: 'exponential', delay: 1_000 },
  removeOnComplete: { age: 30 * 24 * 3600 },
  removeOnFail: { age: 30 * 24 * 3600 },
} as const satisfies JobsOptions;

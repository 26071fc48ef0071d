// Thin processor of the `checkpoints` queue: parse, persist atomically, report where it landed.
import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { CheckpointStore } from '../../src/checkpoints/checkpoint-store.ts';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { CheckpointJob, type CheckpointResult } from './contract.ts';

export function checkpointProcessor(store: CheckpointStore) {
  return async (job: Job): Promise<CheckpointResult> => {
    const parsed = CheckpointJob.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(`invalid checkpoint: ${describeIssues(parsed.error, job.data).join('; ')}`);
    const { episodeId, seq } = parsed.data;
    return store.write(episodeId, seq, parsed.data);
  };
}

// Thin processor of the `batches` queue: parse, compute the summary from the results store, store it.
import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import { describeIssues } from '../../src/config/zod-issues.ts';
import type { BatchSummary } from '../../src/results/batch-summary.ts';
import type { ResultsStore } from '../../src/results/results-store.ts';
import { BatchJob } from './contract.ts';

export function batchProcessor(results: ResultsStore) {
  return async (job: Job): Promise<BatchSummary> => {
    const parsed = BatchJob.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(`invalid batch job: ${describeIssues(parsed.error, job.data).join('; ')}`);
    return results.storeSummary(parsed.data.batchId);
  };
}

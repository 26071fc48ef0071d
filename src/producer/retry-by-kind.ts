// Re-enqueue only the episodes of a batch that ended with a given failure kind (say, infra after an
// engine outage), keeping every other result as it is.
import type { Queue } from 'bullmq';
import { episodeJobOptions, type EpisodeJob } from '../../queues/episodes/contract.ts';
import type { FailureKind } from '../errors/failure-kind.ts';
import type { EpisodeControl } from '../episode/episode-control.ts';
import { resetRetryCounts } from '../episode/retry-counts.ts';
import type { ResultsStore } from '../results/results-store.ts';
import type { Redis } from 'ioredis';

export interface RetryDeps {
  queue: Queue;
  redis: Redis;
  prefix: string;
  results: ResultsStore;
  control: EpisodeControl;
}

export interface RetryReport {
  /** Episodes put back on the queue. */
  requeued: string[];
  /** Episodes of that kind whose job is no longer kept (past retention): not retried. */
  missing: string[];
}

export async function retryByKind(deps: RetryDeps, batchId: string, kind: FailureKind): Promise<RetryReport> {
  const report: RetryReport = { requeued: [], missing: [] };
  for (const result of await deps.results.results(batchId)) {
    if (result.status !== 'error' || result.error?.kind !== kind) continue;
    const job = await deps.queue.getJob(result.episodeId);
    if (job === undefined) {
      report.missing.push(result.episodeId);
      continue;
    }
    const data = job.data as EpisodeJob;
    await job.remove();
    await deps.results.forget(batchId, result.episodeId);
    await deps.control.end(result.episodeId);
    await resetRetryCounts(deps.redis, deps.prefix, result.episodeId);
    await deps.queue.add(job.name, data, { ...episodeJobOptions, jobId: result.episodeId });
    report.requeued.push(result.episodeId);
  }
  return report;
}

// Re-enqueue only the episodes of a batch that ended with a given failure kind (say, infra after an
// engine outage), keeping every other result as it is. Each episode's job is retried in place
// (BullMQ's job.retry), so it stays a child of its batch; the steps are ordered so that a crash
// between any two leaves the episode with its old result or requeued, never with neither.
import type { Job, Queue } from 'bullmq';
import type { FailureKind } from '../errors/failure-kind.ts';
import type { EpisodeControl } from '../episode/episode-control.ts';
import { resetRetryCounts, resetStallCount } from '../errors/retry-budgets.ts';
import type { ResultsStore } from '../results/results-store.ts';
import { checkpointFenceKey } from '../redis/redis-keys.ts';
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
  /** Episodes whose job is not finished (a retry already requeued it): left as they are. */
  pending: string[];
}

/**
 * Step 1: mark the result superseded and give the episode fresh budgets. A crash after this leaves
 * the result and the finished job as they were.
 */
export async function prepareRetry(deps: RetryDeps, episodeId: string): Promise<void> {
  await deps.results.markForRetry(episodeId);
  await deps.control.end(episodeId);
  await resetRetryCounts(deps.redis, deps.prefix, episodeId);
  // It runs again: its new checkpoints are welcome (the fence was for the writes of its last run).
  await deps.redis.del(checkpointFenceKey(deps.prefix, episodeId));
}

/**
 * Step 2: the finished job back to waiting, in place: same id, same data, still its batch's child.
 * A crash after this leaves the old result beside a waiting job; the worker that picks the job up
 * forgets the result (it is marked) and runs the episode. False when the job is not finished.
 */
export async function requeueInPlace(deps: RetryDeps, job: Job): Promise<boolean> {
  const state = await job.getState();
  if ((state !== 'completed' && state !== 'failed') || job.id === undefined) return false;
  // Fresh budgets, BullMQ's included: its stall count (`stc`, which job.retry keeps) would otherwise
  // end a retried worker_lost episode at its first stall. Harmless on a finished job if we crash here.
  await resetStallCount(deps.redis, deps.queue.toKey(job.id));
  await job.retry(state, { resetAttemptsMade: true });
  return true;
}

/** Step 3: forget the superseded result now, unless the worker that picked the job up already did. */
export async function forgetSuperseded(deps: RetryDeps, batchId: string, episodeId: string): Promise<void> {
  await deps.results.resultUnlessRetried(batchId, episodeId);
}

export async function retryByKind(deps: RetryDeps, batchId: string, kind: FailureKind): Promise<RetryReport> {
  const report: RetryReport = { requeued: [], missing: [], pending: [] };
  for (const result of await deps.results.results(batchId)) {
    if (result.status !== 'error' || result.error?.kind !== kind) continue;
    const job = await deps.queue.getJob(result.episodeId);
    if (job === undefined) {
      report.missing.push(result.episodeId);
      continue;
    }
    // Not finished yet (a retry already requeued it, or its worker is between recording the result and
    // completing the job): leave it alone, unmarked, its phase and counts untouched.
    const state = await job.getState();
    if (state !== 'completed' && state !== 'failed') {
      report.pending.push(result.episodeId);
      continue;
    }
    await prepareRetry(deps, result.episodeId);
    if (!(await requeueInPlace(deps, job))) {
      // It changed state in between: take the mark back, so no later pick-up forgets its result.
      await deps.results.unmarkForRetry(result.episodeId);
      report.pending.push(result.episodeId);
      continue;
    }
    await forgetSuperseded(deps, batchId, result.episodeId);
    report.requeued.push(result.episodeId);
  }
  return report;
}

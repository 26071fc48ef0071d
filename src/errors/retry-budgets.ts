// An episode's retry accounting, in one place: the budget of further attempts per failure kind, the
// failed attempts per kind counted in Redis, the stalls (lost workers) BullMQ counts on the job, and
// the resets that give a requeued episode fresh budgets. The episodes processor and the producer's
// retry by kind use it, config takes the defaults and ceiling from it; it loads no processor, episode
// runner or dockerode (the producer must not), only the key names.
import type { Redis } from 'ioredis';
import type { FailureKind } from './failure-kind.ts';
import { episodeFailuresKey } from '../redis/redis-keys.ts';

/** Further attempts allowed per failure kind; kinds not listed are never retried. */
export type RetryBudgets = Partial<Record<FailureKind, number>>;

/**
 * Further attempts per failure kind (the worker's defaults; FLEET_INFRA_RETRIES and FLEET_MODEL_RETRIES
 * override). Agent, verifier and invalid-input failures are final results, never retried.
 */
export const DEFAULT_RETRY_BUDGETS = { infra: 2, model: 2 } as const satisfies RetryBudgets;

/** The most further attempts one kind may be given: BullMQ's attempts ceiling of an episode job follows from it. */
export const MAX_RETRIES_PER_KIND = 20;

/** As long as the episode's job is kept (7 days): a job that comes back within that finds its counts. */
const COUNTS_KEEP_SEC = 7 * 24 * 3600;

export interface RetryCountsDeps {
  redis: Redis;
  prefix: string;
  retryBudgets: RetryBudgets;
}

/**
 * At pick-up of a job that lost its worker `stalls` time(s): lost workers and infra failures share the
 * infra budget (BullMQ counts only the stalls). Why the episode must end now, or undefined when the
 * budget still allows this attempt.
 */
export async function pastInfraBudget(deps: RetryCountsDeps, episodeId: string, stalls: number): Promise<string | undefined> {
  if (stalls <= 0) return undefined;
  const infra = Number((await deps.redis.hget(episodeFailuresKey(deps.prefix, episodeId), 'infra')) ?? 0);
  const budget = deps.retryBudgets.infra ?? 0;
  if (stalls + infra <= budget) return undefined;
  return `lost its worker ${stalls} time(s) after ${infra} infrastructure failure(s): past the infra retry budget of ${budget}`;
}

/**
 * Count one retryable failure of `kind` and say whether its budget allows another attempt. Stalls
 * (lost workers, `stalledCounter` of the job) were infra failures too: they count against infra's.
 */
export async function countFailure(deps: RetryCountsDeps, episodeId: string, kind: FailureKind, stalledCounter: number): Promise<boolean> {
  const key = episodeFailuresKey(deps.prefix, episodeId);
  const failures = await deps.redis.hincrby(key, kind, 1);
  await deps.redis.expire(key, COUNTS_KEEP_SEC);
  const stalls = kind === 'infra' ? stalledCounter : 0;
  return failures + stalls <= (deps.retryBudgets[kind] ?? 0);
}

/** Forget an episode's failure counts (its result is recorded, or it is requeued: fresh budgets). */
export async function resetRetryCounts(redis: Redis, prefix: string, episodeId: string): Promise<void> {
  await redis.del(episodeFailuresKey(prefix, episodeId));
}

/**
 * Forget BullMQ's stall count of a finished job (`stc` in its hash, which job.retry keeps), so a job
 * retried by kind does not end as worker_lost at its first stall. `jobKey` is queue.toKey(job.id).
 */
export async function resetStallCount(redis: Redis, jobKey: string): Promise<void> {
  await redis.hdel(jobKey, 'stc');
}

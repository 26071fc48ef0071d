// Thin processor of the `episodes` queue: parse the payload, run the episode attempt, record the final
// result exactly once. A retryable failure within its kind's budget is thrown so BullMQ retries it with
// backoff; a drained attempt goes back to the queue at once; every other outcome (passed, failed,
// timeout, cancelled, a final error) completes the job with its result.
import { WaitingError, type Job } from 'bullmq';
import { describeIssues } from '../../src/config/zod-issues.ts';
import type { FleetError } from '../../src/errors/fleet-error.ts';
import { resultWithoutRun } from '../../src/episode/episode-result.ts';
import type { EpisodePhase, RunningEpisodes } from '../../src/episode/running-episodes.ts';
import type { EpisodeDeps } from '../../src/episode/episode-attempt.ts';
import { runEpisode } from '../../src/episode/run-episode.ts';
import { Deadline, PhaseTimeout, untilAborted } from '../../src/deadlines/deadline.ts';
import { stopOf } from '../../src/errors/episode-stop.ts';
import { checkpointFenceKey, episodeStartsKey as startsKey } from '../../src/redis/redis-keys.ts';
import { countFailure, pastInfraBudget, resetRetryCounts, type RetryBudgets } from '../../src/errors/retry-budgets.ts';
import type { ResultsStore } from '../../src/results/results-store.ts';
import {
  DEFAULT_MAX_STALE_RESTARTS, countStaleRestart, episodeVersions, forgetEpisodePolicy, staleRestarts,
} from '../../src/model/policy-versions.ts';
import { environmentCost, type ResourceBudget } from '../../src/episode/resource-budget.ts';
import { EpisodeJob, type EpisodeResult } from './contract.ts';
import { DEFAULT_ENDPOINT } from '../../src/config/model-endpoints.ts';

export interface EpisodeProcessorDeps extends EpisodeDeps {
  results: ResultsStore;
  running: RunningEpisodes;
  retryBudgets: RetryBudgets;
  /** What the environments running at once may cost (src/episode/resource-budget.ts). @default unlimited */
  budget?: ResourceBudget;
}

/** Thrown to BullMQ for a failure another attempt may fix; carries the fleet error. */
export class RetryableEpisodeError extends Error {
  override readonly name = 'RetryableEpisodeError';
  constructor(readonly fleetError: FleetError) {
    super(`${fleetError.outcome.kind}/${fleetError.code}: ${fleetError.message}`, { cause: fleetError });
  }
}

const KEEP_SEC = 7 * 24 * 3600;
/** How long recording a result waits for the removal of the episode's checkpoints (a slow store). */
const CHECKPOINT_REMOVAL_WAIT_MS = 5_000;

/**
 * The one place an episode's final result is recorded: stored once (a second result is refused), its
 * retry counts, control keys and checkpoints forgotten. The processor and the failed listener call it.
 */
async function recordFinal(deps: EpisodeProcessorDeps, ran: EpisodeResult, jobData: unknown): Promise<EpisodeResult> {
  const { episodeId } = ran;
  const result = await withPolicyVersions(deps, ran, jobData);
  if (!(await deps.results.record(result))) deps.log.warn({ episodeId }, 'episode already had a result; this one is not recorded');
  await resetRetryCounts(deps.redis, deps.prefix, episodeId);
  await forgetEpisodePolicy(deps.redis, deps.prefix, episodeId);
  await deps.control.end(episodeId);
  // The episode is over: its checkpoints served their purpose (a requeue by kind starts afresh). The
  // fence first, so a writer that is late (a slow queue, another host) removes what it writes after.
  await deps.redis.set(checkpointFenceKey(deps.prefix, episodeId), '1', 'EX', KEEP_SEC + 24 * 3600);
  // Waited for a little (the next episode waits on this slot), then left to finish in the background.
  const removal = deps.checkpoints.store.remove(episodeId).catch((err: unknown) => deps.log.warn({ episodeId, err: String(err) }, 'checkpoints not removed'));
  await untilAborted(removal, AbortSignal.timeout(CHECKPOINT_REMOVAL_WAIT_MS)).catch(() => deps.log.warn({ episodeId }, 'checkpoint removal still under way; not waited for'));
  return result;
}

/** The result with the policy versions its conversation saw and the stale restarts it took (both kept in Redis across attempts). */
async function withPolicyVersions(deps: EpisodeProcessorDeps, result: EpisodeResult, jobData: unknown): Promise<EpisodeResult> {
  const endpoint = (jobData as { model?: { endpoint?: string } } | undefined)?.model?.endpoint ?? DEFAULT_ENDPOINT;
  const [versions, stale] = await Promise.all([
    episodeVersions(deps.redis, deps.prefix, result.episodeId, endpoint),
    staleRestarts(deps.redis, deps.prefix, result.episodeId),
  ]);
  return { ...result, ...(versions && { policyVersions: versions }), ...(stale.restarts > 0 && { staleRestarts: stale.restarts }) };
}

/**
 * An attempt stopped as stale: restart the episode from scratch at once (its versions and, when the
 * store allows, its checkpoints forgotten, and no checkpoint from before now resumed), or, past its
 * batch's maxStaleRestarts, end it with the attempt's error policy_stale. Undefined: restarted.
 */
async function restartStale(deps: EpisodeProcessorDeps, job: Job, token: string | undefined, data: EpisodeJob, outcome: { result: EpisodeResult }): Promise<EpisodeResult> {
  const { episodeId } = data;
  const bound = data.maxStaleRestarts ?? DEFAULT_MAX_STALE_RESTARTS;
  const { restarts } = await staleRestarts(deps.redis, deps.prefix, episodeId);
  if (restarts >= bound) {
    const message = `a model call would have taken the episode past its batch's maxStaleness of ${data.maxStaleness ?? '-'} policy version(s), after ${restarts} stale restart(s): past its maxStaleRestarts of ${bound}`;
    deps.log.warn({ episodeId, restarts, bound }, 'episode past its stale restarts');
    return recordFinal(deps, { ...outcome.result, status: 'error', reward: null, error: { kind: 'model', code: 'policy_stale', message } }, data);
  }
  const now = await countStaleRestart(deps.redis, deps.prefix, episodeId);
  deps.log.info({ episodeId, staleRestarts: now, bound }, 'episode grew too stale: restarting it from scratch');
  // Its checkpoints hold the dropped conversation: removed (best effort; resume skips any from before the restart anyway).
  const removal = deps.checkpoints.store.remove(episodeId).catch((err: unknown) => deps.log.warn({ episodeId, err: String(err) }, 'checkpoints of a stale episode not removed'));
  await untilAborted(removal, AbortSignal.timeout(CHECKPOINT_REMOVAL_WAIT_MS)).catch(() => undefined);
  await deps.control.release(episodeId);
  await job.moveToWait(token);
  throw new WaitingError();
}

/**
 * The `failed` listener of the episodes Worker. The processor records every outcome it sees; this
 * records what it never saw (a job that stalled too often, a crash outside the processor) once BullMQ
 * gives up on the job, so the episode still ends with a result.
 */
export function episodeFailedListener(deps: EpisodeProcessorDeps) {
  return (job: Job | undefined, err: Error): void => {
    if (job === undefined) return;
    const final = job.attemptsMade >= (job.opts.attempts ?? 1) || err.name === 'UnrecoverableError';
    deps.log.warn({ jobId: job.id, attemptsMade: job.attemptsMade, final, err: err.message }, 'episode attempt failed');
    if (!final) return;
    const fleetError = err instanceof RetryableEpisodeError ? err.fleetError : undefined;
    const error = fleetError
      ? { kind: fleetError.outcome.kind, code: fleetError.code, message: fleetError.message }
      : { kind: 'infra' as const, code: 'worker_lost', message: err.message };
    recordFinal(deps, resultWithoutRun(job, { status: 'error', error }, deps.workerId), job.data)
      .catch((e: unknown) => deps.log.error({ jobId: job.id, err: String(e) }, 'recording a failed episode failed'));
  };
}

export function episodeProcessor(deps: EpisodeProcessorDeps) {
  return async (job: Job, token?: string, signal?: AbortSignal): Promise<EpisodeResult> => {
    const parsed = EpisodeJob.safeParse(job.data);
    if (!parsed.success) {
      const message = `invalid episode payload: ${describeIssues(parsed.error, job.data).join('; ')}`;
      deps.log.warn({ jobId: job.id, err: message }, 'episode rejected');
      const result = resultWithoutRun(job, { status: 'error', error: { kind: 'invalid', code: 'invalid_payload', message } }, deps.workerId);
      // As at any pick-up: a result a retry superseded is forgotten first, so this one is recorded.
      const prior = await deps.results.resultUnlessRetried(result.batchId, result.episodeId);
      return prior ?? (await recordFinal(deps, result, job.data));
    }
    const { episodeId, batchId } = parsed.data;
    const episodeSignal = deps.running.start(episodeId, signal, { batchId, taskId: parsed.data.task.id });
    // Its environment's cost (every container of it at its limits) must fit the worker's budget beside
    // the running ones' before its set-up starts: the wait is not set-up time.
    const release = await roomFor(deps, parsed.data, episodeSignal).catch((err: unknown) => {
      deps.running.finish(episodeId, episodeSignal);
      throw err;
    });
    // The set-up reserve starts at pick-up: the Redis steps here count against it like the set-up's own.
    // A Harbor environment the engine lacks is built in set-up: its build_timeout_sec is set-up time
    // on top of the reserve (never the agent's: the agent's ceiling does not depend on set-up's length).
    const { task } = parsed.data;
    const setUp = new Deadline('set-up', (task.reserves.setupSec + (task.harbor?.build?.timeoutSec ?? 0) + (task.harbor?.separateVerifier?.build?.timeoutSec ?? 0)) * 1000, episodeSignal);
    try {
      let attempt: number | undefined;
      try {
        // A job that comes back after its result was recorded (its worker died before completing it, or
        // the batch was enqueued again) ends with that result: the episode never runs twice. A result a
        // retry by kind superseded is forgotten here instead, and the episode runs again.
        const prior = await setUp.run('checking for a recorded result', () => deps.results.resultUnlessRetried(batchId, episodeId));
        if (prior) return prior;
        // Lost workers (stalls) and infra failures share the infra budget; BullMQ counts only the stalls.
        const stalls = job.stalledCounter ?? 0;
        if (stalls > 0) {
          const message = await setUp.run('reading the retry counts', () => pastInfraBudget(deps, episodeId, stalls));
          if (message !== undefined) {
            return await recordFinal(deps, resultWithoutRun(job, { status: 'error', error: { kind: 'infra', code: 'worker_lost', message } }, deps.workerId), parsed.data);
          }
        }
        if ((await setUp.run('marking the episode running', () => deps.control.markRunning(episodeId))) === 'cancelled') {
          return await recordFinal(deps, resultWithoutRun(job, { status: 'cancelled' }, deps.workerId), parsed.data);
        }
        // Numbered across retries, stalls, drains and requeues, so every attempt has its own evidence.
        attempt = await setUp.run('numbering the attempt', () => deps.redis.incr(startsKey(deps.prefix, episodeId)));
        void deps.redis.expire(startsKey(deps.prefix, episodeId), KEEP_SEC).catch(() => undefined);
      } catch (err) {
        // Redis did not answer within the set-up reserve: the attempt runs on, its set-up fails at once
        // with that timeout, and it ends as an infrastructure failure with its evidence. A cancel or a
        // drain during pick-up goes the same way: the attempt ends cancelled or is handed back.
        if (!(err instanceof PhaseTimeout) && stopOf(episodeSignal) === undefined) throw err;
        if (attempt === undefined) {
          // Counted all the same once Redis answers, so the next attempt does not reuse this number;
          // meanwhile a number no evidence folder of this host has used yet.
          void deps.redis.incr(startsKey(deps.prefix, episodeId)).catch(() => undefined);
          attempt = await deps.evidence.unusedAttempt(episodeId, Math.max(1, job.attemptsStarted));
        }
      }
      const onPhase = (phase: EpisodePhase) => deps.running.setPhase(episodeId, episodeSignal, phase);
      const onStale = () => {
        if (deps.running.stop(episodeId, 'stale')) deps.log.info({ episodeId }, 'episode stopped: its policy grew too stale');
      };
      const outcome = await runEpisode({ job: parsed.data, attempt, signal: episodeSignal, setUp, onPhase, onStale }, deps);
      if (outcome.handBack) {
        // Draining: back to the queue now, for another worker, without waiting for a stall timeout.
        await deps.control.release(episodeId);
        await job.moveToWait(token);
        throw new WaitingError();
      }
      if (outcome.staleRestart === true) return await restartStale(deps, job, token, parsed.data, outcome);
      if (outcome.retry && outcome.error) {
        if (await countFailure(deps, episodeId, outcome.error.outcome.kind, job.stalledCounter)) {
          await deps.control.release(episodeId);
          throw new RetryableEpisodeError(outcome.error);
        }
      }
      return await recordFinal(deps, outcome.result, parsed.data);
    } finally {
      setUp.dispose();
      release?.();
      deps.running.finish(episodeId, episodeSignal);
    }
  };
}

/**
 * Wait until the episode's environment fits the worker's budget; its release, or undefined without a
 * budget. A stop (cancel, drain) while waiting ends the wait without room: the attempt then ends as
 * the stop says, before it creates anything.
 */
async function roomFor(deps: EpisodeProcessorDeps, job: EpisodeJob, signal: AbortSignal): Promise<(() => void) | undefined> {
  if (deps.budget === undefined) return undefined;
  const cost = environmentCost(job.task);
  const started = performance.now();
  try {
    const release = await deps.budget.acquire(cost, signal);
    const waitedMs = Math.round(performance.now() - started);
    if (waitedMs >= 50) deps.log.info({ episodeId: job.episodeId, cost, waitedMs }, 'episode waited for room in the worker\'s budget');
    return release;
  } catch (err) {
    if (signal.aborted) return undefined;
    throw err;
  }
}

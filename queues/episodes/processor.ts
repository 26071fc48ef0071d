// Thin processor of the `episodes` queue: parse the payload, run the episode attempt, record the final
// result exactly once. A retryable failure with attempts left is thrown so BullMQ retries it with
// backoff; every other outcome (passed, failed, timeout, a final error) completes the job with its result.
import type { Job } from 'bullmq';
import { describeIssues } from '../../src/config/zod-issues.ts';
import type { FleetError } from '../../src/errors/fleet-error.ts';
import { runEpisode, type EpisodeDeps } from '../../src/episode/run-episode.ts';
import type { ResultsStore } from '../../src/results/results-store.ts';
import { EpisodeJob, type EpisodeResult, episodeJobOptions } from './contract.ts';

export interface EpisodeProcessorDeps extends EpisodeDeps {
  results: ResultsStore;
}

/** Thrown to BullMQ for a failure another attempt may fix; carries the fleet error. */
export class RetryableEpisodeError extends Error {
  override readonly name = 'RetryableEpisodeError';
  constructor(readonly fleetError: FleetError) {
    super(`${fleetError.outcome.kind}/${fleetError.code}: ${fleetError.message}`, { cause: fleetError });
  }
}

function idOf(value: unknown, fallback: string): string {
  return typeof value === 'string' && /^[a-z0-9][a-z0-9_.-]{0,199}$/.test(value) ? value : fallback;
}

/** The result of a job whose payload is not an episode: it fails alone, never retried. */
export function invalidPayloadResult(job: Job, message: string, workerId: string): EpisodeResult {
  const data = (job.data ?? {}) as Record<string, unknown>;
  const now = new Date().toISOString();
  return {
    episodeId: idOf(job.id, 'unknown'),
    batchId: idOf(data.batchId, 'unknown'),
    taskId: typeof (data.task as { id?: unknown } | undefined)?.id === 'string' ? String((data.task as { id: string }).id) : 'unknown',
    sample: typeof data.sample === 'number' ? data.sample : 0,
    status: 'error',
    error: { kind: 'invalid', code: 'invalid_payload', message },
    reward: null,
    attempts: job.attemptsMade + 1,
    workerId,
    timings: { totalMs: 0 },
    provenance: { taskDigest: typeof data.taskDigest === 'string' ? data.taskDigest : 'unknown', image: 'unknown', agent: { kind: 'oracle' } },
    startedAt: now,
    endedAt: now,
  };
}

export function episodeProcessor(deps: EpisodeProcessorDeps) {
  return async (job: Job, _token?: string, signal?: AbortSignal): Promise<EpisodeResult> => {
    const parsed = EpisodeJob.safeParse(job.data);
    if (!parsed.success) {
      const message = `invalid episode payload: ${describeIssues(parsed.error, job.data).join('; ')}`;
      deps.log.warn({ jobId: job.id, err: message }, 'episode rejected');
      const result = invalidPayloadResult(job, message, deps.workerId);
      await deps.results.record(result);
      return result;
    }
    const attempt = job.attemptsMade + 1;
    const outcome = await runEpisode({ job: parsed.data, attempt, signal: signal ?? new AbortController().signal }, deps);
    const maxAttempts = job.opts.attempts ?? episodeJobOptions.attempts;
    if (outcome.retry && outcome.error && attempt < maxAttempts) throw new RetryableEpisodeError(outcome.error);
    const first = await deps.results.record(outcome.result);
    if (!first) deps.log.warn({ episodeId: parsed.data.episodeId }, 'episode already had a result; this one is not recorded');
    return outcome.result;
  };
}

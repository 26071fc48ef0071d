// Results of episodes that never ran a sandbox (a malformed payload, a cancel while waiting, a job
// lost outside the processor): built from whatever of the payload can be trusted.
import type { Job } from 'bullmq';
import { EpisodeJob, type EpisodeResult } from './episode-job.ts';
import { EPISODE_ID_PATTERN } from '../ids/episode-id.ts';

const idOf = (value: unknown, fallback: string) => (typeof value === 'string' && EPISODE_ID_PATTERN.test(value) ? value : fallback);

export function resultWithoutRun(
  job: Pick<Job, 'id' | 'data' | 'attemptsStarted'>,
  outcome: Pick<EpisodeResult, 'status' | 'error'>,
  workerId: string,
): EpisodeResult {
  const now = new Date().toISOString();
  const parsed = EpisodeJob.safeParse(job.data);
  const data = (job.data ?? {}) as Record<string, unknown>;
  const task = (data.task ?? {}) as Record<string, unknown>;
  return {
    episodeId: idOf(job.id, 'unknown'),
    batchId: idOf(data.batchId, 'unknown'),
    taskId: idOf(task.id, 'unknown'),
    sample: typeof data.sample === 'number' ? data.sample : 0,
    status: outcome.status,
    ...(outcome.error && { error: outcome.error }),
    reward: null,
    attempts: Math.max(1, job.attemptsStarted ?? 0),
    workerId,
    timings: { totalMs: 0 },
    provenance: parsed.success
      ? { taskDigest: parsed.data.taskDigest, image: parsed.data.task.image, agent: parsed.data.agent }
      : { taskDigest: typeof data.taskDigest === 'string' ? data.taskDigest : 'unknown', image: 'unknown', agent: { kind: 'oracle' } },
    startedAt: now,
    endedAt: now,
  };
}

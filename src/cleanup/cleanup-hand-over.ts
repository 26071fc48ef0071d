// The hand-over of a sandbox's removal to the cleanup queue, so a close never waits on a slow engine:
// a remove-sandbox job named by episode and container (a second hand-over of the same one adds
// nothing), tagged with the engine that runs it so a worker of that engine removes it. An episode's
// environment lease (src/sandbox/environment-lease.ts) calls it when the episode closes.
import type { Queue } from 'bullmq';
import { engineId, type Docker } from '../sandbox/docker-client.ts';
import { CleanupJob, REMOVE_SANDBOX_JOB, cleanupJobId, cleanupJobOptions } from './cleanup-job.ts';

/** Hand one episode's sandbox to the cleanup queue (what EpisodeDeps.scheduleCleanup is). */
export type CleanupHandOver = (episodeId: string, containerId: string, environment?: string) => Promise<void>;

/** The hand-over onto `queue` (the cleanup queue) of sandboxes of `docker`'s engine. */
export function cleanupHandOver(queue: Queue, docker: Docker, callTimeoutMs: number): CleanupHandOver {
  return async (episodeId, containerId, environment) => {
    const data: CleanupJob = CleanupJob.parse({ episodeId, containerId, ...(environment !== undefined && { environment }), engineId: await engineId(docker, { timeoutMs: callTimeoutMs }) });
    await queue.add(REMOVE_SANDBOX_JOB, data, { ...cleanupJobOptions, jobId: cleanupJobId(episodeId, containerId) });
  };
}

// The `cleanup` queue: removal of one episode's sandbox, with its own budget and retries, so a close
// never waits on a slow engine. The scheduled reaper (REAP_JOB) of orphans and old runtime generations runs on it too.
import type { JobsOptions } from 'bullmq';
import { z } from 'zod';

export const CLEANUP_QUEUE = 'cleanup';
/** Remove one episode's sandbox (payload: CleanupJob). */
export const REMOVE_SANDBOX_JOB = 'remove-sandbox';
/** The scheduled reaper (no payload). */
export const REAP_JOB = 'reap';
export const REAPER_SCHEDULER_ID = 'reaper';

export const CleanupJob = z.strictObject({
  episodeId: z.string().min(1),
  containerId: z.string().regex(/^[0-9a-f]{12,64}$/, 'a container id'),
  /**
   * The environment key of a sandbox with task services (src/sandbox/task-services.ts): every part
   * labelled with it is removed even when the container named is gone already (a removal cut short,
   * its worker killed between parts, is retried). Absent: the container's own label says.
   */
  environment: z.string().regex(/^[A-Za-z0-9_.-]{1,200}$/, 'an environment key').optional(),
  /** Budget of one removal attempt. */
  timeoutMs: z.number().int().positive().default(30_000),
  /**
   * The engine that runs the sandbox (docker-client.ts's engineId). A worker of another engine (another
   * host) leaves the job for a later attempt, which another worker may take. Absent: any engine.
   */
  engineId: z.string().min(1).optional(),
});
export type CleanupJob = z.infer<typeof CleanupJob>;

export const CleanupResult = z.object({ removed: z.string() });
export type CleanupResult = z.infer<typeof CleanupResult>;

export const cleanupJobOptions = {
  attempts: 8,
  backoff: { type: 'exponential', delay: 1_000 },
  removeOnComplete: { age: 24 * 3600, count: 10_000 },
  removeOnFail: { age: 7 * 24 * 3600 },
} as const satisfies JobsOptions;

export const cleanupJobId = (episodeId: string, containerId: string) => `${episodeId}.${containerId.slice(0, 12)}`;

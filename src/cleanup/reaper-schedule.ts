// The reaper's schedule: one job scheduler on the cleanup queue, upserted by every worker as it starts.
// Its id is the fleet's, not the worker's, so however many workers start (or died) one reap runs per
// interval, on whichever live worker takes it.
import type { Queue } from 'bullmq';
import { REAPER_SCHEDULER_ID, REAP_JOB } from './cleanup-job.ts';

/** Run the reaper every `everyMs` on `queue` (the cleanup queue); the last worker to start sets the interval. */
export async function scheduleReaper(queue: Queue, everyMs: number): Promise<void> {
  await queue.upsertJobScheduler(REAPER_SCHEDULER_ID, { every: everyMs }, {
    name: REAP_JOB,
    data: {},
    opts: { removeOnComplete: 50, removeOnFail: 50 },
  });
}

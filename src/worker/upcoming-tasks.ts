// Which tasks wait in the episodes queue, as the warm pool asks it (src/sandbox/sandbox-pool.ts): the
// first LOOK_AHEAD waiting episodes (samples of a task are enqueued together, so a GRPO group's
// are there), read at most once per FRESH_MS whoever asks, one read at a time; an episode that asked
// since counts as started, not waiting. A queue that cannot be
// read answers "none waiting": the episode then takes a sandbox for any task, as without seeding.
import type { Queue } from 'bullmq';
import type { Logger } from 'pino';
import type { TaskLookahead } from '../sandbox/sandbox-pool.ts';

/** Waiting episodes looked at (each is one job hash read). */
export const LOOK_AHEAD = 32;
/** How old a look may be before the next question reads the queue again. */
export const FRESH_MS = 500;
/** How long one read may take before it counts as unread. */
export const READ_BOUND_MS = 1_000;

export class UpcomingTasks implements TaskLookahead {
  /** Waiting episodes by task digest, and their ids. */
  private waiting = new Map<string, Set<string>>();
  /** Episodes that asked since the last read: started here, so not waiting any more whatever it said. */
  private started = new Set<string>();
  private readAt = -Infinity;
  private reading: Promise<void> | undefined;

  constructor(private readonly queue: Pick<Queue, 'getJobs'>, private readonly log: Logger, private readonly freshMs = FRESH_MS) {}

  async moreOf(taskDigest: string, episodeId: string): Promise<boolean> {
    if (Date.now() - this.readAt >= this.freshMs) {
      this.reading ??= this.read().finally(() => (this.reading = undefined));
      await this.reading;
    }
    this.started.add(episodeId);
    for (const id of this.waiting.get(taskDigest) ?? []) if (!this.started.has(id)) return true;
    return false;
  }

  private async read(): Promise<void> {
    const waiting = new Map<string, Set<string>>();
    try {
      // A slow Redis holds no claim back: past READ_BOUND_MS the look is "none waiting" this time.
      let bound: NodeJS.Timeout | undefined;
      const jobs = await Promise.race([
        this.queue.getJobs(['waiting', 'prioritized'], 0, LOOK_AHEAD - 1, true),
        new Promise<never>((_, reject) => (bound = setTimeout(() => reject(new Error(`no answer in ${READ_BOUND_MS} ms`)), READ_BOUND_MS))),
      ]).finally(() => clearTimeout(bound));
      for (const job of jobs) {
        const data: unknown = job?.data;
        if (typeof data !== 'object' || data === null) continue;
        const { taskDigest, episodeId } = data as { taskDigest?: unknown; episodeId?: unknown };
        if (typeof taskDigest !== 'string' || typeof episodeId !== 'string') continue;
        let ids = waiting.get(taskDigest);
        if (ids === undefined) waiting.set(taskDigest, (ids = new Set()));
        ids.add(episodeId);
      }
    } catch (err) {
      this.log.debug({ err: String(err) }, 'the waiting episodes not read; no sandbox seeded meanwhile');
    }
    this.waiting = waiting;
    this.started = new Set();
    this.readAt = Date.now();
  }
}

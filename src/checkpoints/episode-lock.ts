// Serializes the short critical section of a checkpoint write (compare and move latest.json, prune)
// per episode. Several writer processes may share one data folder (every worker runs a writer, plus
// `rollout-fleet checkpoint-writer`), and rename has no compare-and-swap, so without it two writers
// could move latest.json backwards. In-process: a promise chain; across processes: the fleet's Redis
// token lock, not renewed (the section is short), so it expires by itself when its holder is killed.
import type { Redis } from 'ioredis';
import { checkpointLockKey } from '../redis/redis-keys.ts';
import { waitForLock, type HeldLock } from '../redis/token-lock.ts';

/** Gives up the lock; returns at once (a remote release goes out in the background). */
export type ReleaseLock = () => void;

export interface EpisodeLock {
  /** Resolves once this caller holds the episode's lock. */
  acquire(episodeId: string): Promise<ReleaseLock>;
}

/** Mutual exclusion within this process only. */
export function processEpisodeLock(): EpisodeLock {
  const tails = new Map<string, Promise<void>>();
  return {
    async acquire(episodeId: string): Promise<ReleaseLock> {
      const before = tails.get(episodeId) ?? Promise.resolve();
      let done!: () => void;
      const tail = before.then(() => new Promise<void>((resolve) => (done = resolve)));
      tails.set(episodeId, tail);
      await before;
      return () => {
        done();
        if (tails.get(episodeId) === tail) tails.delete(episodeId);
      };
    },
  };
}

export interface RedisEpisodeLockOptions {
  /** The lease: a holder killed inside the critical section blocks others this long at most. @default 5000 */
  ttlMs?: number;
  /** Give up (the job is retried) after waiting this long. @default 30000 */
  waitMs?: number;
}

/** Mutual exclusion across processes sharing `redis` and `prefix` (and within this one). */
export function redisEpisodeLock(redis: Redis, prefix: string, opts: RedisEpisodeLockOptions = {}): EpisodeLock {
  const ttlMs = opts.ttlMs ?? 5_000;
  const waitMs = opts.waitMs ?? 30_000;
  const local = processEpisodeLock();
  return {
    async acquire(episodeId: string): Promise<ReleaseLock> {
      const releaseLocal = await local.acquire(episodeId);
      let lock: HeldLock;
      try {
        lock = await waitForLock(redis, checkpointLockKey(prefix, episodeId), { ttlMs, waitMs });
      } catch (err) {
        releaseLocal();
        throw err;
      }
      return () => {
        // Sent before anything this process sends afterwards on the same connection, so a local
        // waiter's SET NX (next in line) always finds the key gone; if the release is lost, the lease expires.
        lock.release().catch(() => undefined);
        releaseLocal();
      };
    },
  };
}

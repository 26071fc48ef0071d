// Serializes the short critical section of a checkpoint write (compare and move latest.json, prune)
// per episode. Several writer processes may share one data folder (every worker runs a writer, plus
// `rollout-fleet checkpoint-writer`), and rename has no compare-and-swap, so without it two writers
// could move latest.json backwards. In-process: a promise chain; across processes: a Redis lease
// (SET NX PX) that expires by itself when its holder is killed.
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { checkpointLockKey } from '../redis/redis-keys.ts';

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

const RELEASE = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`;

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
      const key = checkpointLockKey(prefix, episodeId);
      const token = randomBytes(8).toString('hex');
      const until = Date.now() + waitMs;
      try {
        while ((await redis.set(key, token, 'PX', ttlMs, 'NX')) !== 'OK') {
          if (Date.now() > until) throw new Error(`checkpoint lock of ${episodeId} not acquired within ${waitMs} ms`);
          await new Promise((r) => setTimeout(r, 5 + Math.random() * 20));
        }
      } catch (err) {
        releaseLocal();
        throw err;
      }
      return () => {
        // Sent before anything this process sends afterwards on the same connection, so a local
        // waiter's SET NX (next in line) always finds the key gone; if the release is lost, the lease expires.
        redis.eval(RELEASE, 1, key, token).catch(() => undefined);
        releaseLocal();
      };
    },
  };
}

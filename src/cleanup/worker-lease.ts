// A worker's lease in Redis: a key with an expiry, renewed by a heartbeat. While it exists, the
// sandboxes labelled with this worker id are its own; once it expires (the worker died), the reaper
// may remove them. It lives here, beside the reaper that reads it: the worker that holds one imports
// it from cleanup, so cleanup never reaches up into the worker that assembles it.
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { leaseKey } from '../redis/redis-keys.ts';

export interface Lease {
  stop(): Promise<void>;
}

export async function startLease(redis: Redis, prefix: string, workerId: string, ttlMs: number, log: Logger): Promise<Lease> {
  const key = leaseKey(prefix, workerId);
  const value = JSON.stringify({ workerId, pid: process.pid, startedAt: new Date().toISOString() });
  await redis.set(key, value, 'PX', ttlMs);
  const timer = setInterval(() => {
    redis.set(key, value, 'PX', ttlMs).catch((err: unknown) => log.warn({ err: String(err) }, 'lease heartbeat failed'));
  }, Math.max(100, Math.floor(ttlMs / 3)));
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      await redis.del(key).catch(() => undefined);
    },
  };
}

/** Which of these worker ids still hold a lease. */
export async function liveWorkers(redis: Redis, prefix: string, workerIds: readonly string[]): Promise<Set<string>> {
  if (workerIds.length === 0) return new Set();
  const values = await redis.mget(...workerIds.map((id) => leaseKey(prefix, id)));
  return new Set(workerIds.filter((_, i) => values[i] !== null));
}

/** How many workers of the fleet hold a lease now. */
export async function countLeases(redis: Redis, prefix: string): Promise<number> {
  let count = 0;
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', leaseKey(prefix, '*'), 'COUNT', 500);
    count += keys.length;
    cursor = next;
  } while (cursor !== '0');
  return count;
}

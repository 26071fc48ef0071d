// A Redis lock per runtime generation, so worker processes sharing a Docker engine install a generation
// once: SET NX PX with a random token, renewed while held, released only by its holder (compare and
// delete). A holder that dies simply stops renewing; the lock expires and a waiter takes over.
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { FleetError } from '../errors/fleet-error.ts';

/**
 * Extend the lock if it is still ours.
 * KEYS[1] lock key; ARGV[1] token; ARGV[2] TTL in ms.
 * Returns 1 when extended, 0 when the key is gone or holds another token.
 */
const RENEW_SCRIPT = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end`;

/**
 * Delete the lock if it is still ours.
 * KEYS[1] lock key; ARGV[1] token.
 * Returns 1 when deleted, 0 when the key is gone or holds another token (nothing is touched).
 */
const RELEASE_SCRIPT = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`;

export interface HeldLock {
  readonly token: string;
  /** Aborts if the lock is lost (a renewal found another token or none): stop writing at once. */
  readonly signal: AbortSignal;
  /** Ask Redis whether the lock is still ours (a fence before the step that must not happen twice). */
  stillHeld(): Promise<boolean>;
  /** Stop renewing and delete the lock if it is still ours. Idempotent. */
  release(): Promise<void>;
}

/** Take the lock if nobody holds it; undefined when somebody does. */
export async function tryLock(redis: Redis, key: string, ttlMs: number, log: Logger): Promise<HeldLock | undefined> {
  const token = randomBytes(16).toString('hex');
  if ((await redis.set(key, token, 'PX', ttlMs, 'NX')) !== 'OK') return undefined;
  const lost = new AbortController();
  let released = false;
  const renew = async () => {
    try {
      if (Number(await redis.eval(RENEW_SCRIPT, 1, key, token, String(ttlMs))) !== 1) {
        lost.abort(new FleetError('runtime_unavailable', `lost the runtime install lock ${key}`));
      }
    } catch (err) {
      // One failed renewal is not a lost lock yet: the TTL leaves two more tries.
      log.warn({ key, err: (err as Error).message }, 'renewing the runtime install lock failed');
    }
  };
  const timer = setInterval(() => void renew(), Math.max(1, Math.floor(ttlMs / 3)));
  timer.unref();
  lost.signal.addEventListener('abort', () => clearInterval(timer), { once: true });
  return {
    token,
    signal: lost.signal,
    async stillHeld() {
      return !lost.signal.aborted && (await redis.get(key)) === token;
    },
    async release() {
      if (released) return;
      released = true;
      clearInterval(timer);
      await redis.eval(RELEASE_SCRIPT, 1, key, token);
    },
  };
}

/** Whether anybody holds the lock. */
export async function isLocked(redis: Redis, key: string): Promise<boolean> {
  return (await redis.exists(key)) === 1;
}

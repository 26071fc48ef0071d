// The fleet's one Redis lock: SET NX PX with a random token, so only its holder can extend or delete
// it (compare and act in one script). The TTL is a lease: a holder that is killed simply stops
// renewing (or never renews, for short critical sections) and the key expires, so a waiter takes over
// without anybody cleaning up. Used for runtime generation installs and checkpoint writes.
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { luaScript } from './lua-script.ts';

/** Extend the lock if it is still ours: 1, else 0 (src/redis/lua/lock-renew-1.lua). */
const RENEW = luaScript<[key: string], [token: string, ttlMs: string], 0 | 1>('lock-renew-1');
/** Delete the lock if it is still ours: 1, else 0 (src/redis/lua/lock-release-1.lua). */
const RELEASE = luaScript<[key: string], [token: string], 0 | 1>('lock-release-1');

export interface TokenLockOptions {
  /** The lease: the key expires this long after it was taken or last renewed. */
  ttlMs: number;
  /**
   * Renew the lease every third of `ttlMs` while held, and abort `signal` when a renewal finds the lock
   * lost; a failed renewal is only logged (the TTL leaves two more tries). Without it (short critical
   * sections), a holder stalled past the TTL loses the lock without being told.
   */
  renew?: { log: Logger; lostReason?: (key: string) => Error };
}

export interface HeldLock {
  readonly key: string;
  readonly token: string;
  /** Aborts if a renewal finds the lock lost (another token or none): stop writing at once. */
  readonly signal: AbortSignal;
  /** Ask Redis whether the lock is still ours (a fence before the step that must not happen twice). */
  stillHeld(): Promise<boolean>;
  /**
   * Stop renewing and delete the lock if it is still ours. Idempotent. The delete is sent before this
   * returns its promise, so it reaches Redis before anything the caller sends afterwards on the same
   * connection.
   */
  release(): Promise<void>;
}

/** Take the lock if nobody holds it; undefined when somebody does. */
export async function tryLock(redis: Redis, key: string, opts: TokenLockOptions): Promise<HeldLock | undefined> {
  const { ttlMs, renew } = opts;
  const token = randomBytes(16).toString('hex');
  if ((await redis.set(key, token, 'PX', ttlMs, 'NX')) !== 'OK') return undefined;
  const lost = new AbortController();
  let released = false;
  let timer: NodeJS.Timeout | undefined;
  if (renew) {
    const renewOnce = async () => {
      try {
        if (Number(await RENEW.run(redis, [key], [token, String(ttlMs)])) !== 1) {
          lost.abort(renew.lostReason?.(key) ?? new Error(`lost the lock ${key}`));
        }
      } catch (err) {
        // One failed renewal is not a lost lock yet: the TTL leaves two more tries.
        renew.log.warn({ key, err: (err as Error).message }, 'renewing a lock failed');
      }
    };
    timer = setInterval(() => void renewOnce(), Math.max(1, Math.floor(ttlMs / 3)));
    timer.unref();
    lost.signal.addEventListener('abort', () => clearInterval(timer), { once: true });
  }
  return {
    key,
    token,
    signal: lost.signal,
    async stillHeld() {
      return !lost.signal.aborted && (await redis.get(key)) === token;
    },
    async release() {
      if (released) return;
      released = true;
      clearInterval(timer);
      await RELEASE.run(redis, [key], [token]);
    },
  };
}

export interface WaitForLockOptions extends TokenLockOptions {
  /** Give up after waiting this long: throws. */
  waitMs: number;
}

/** Take the lock, retrying every few milliseconds (jittered, so waiters do not move in step) until `waitMs` passes. */
export async function waitForLock(redis: Redis, key: string, opts: WaitForLockOptions): Promise<HeldLock> {
  const until = Date.now() + opts.waitMs;
  for (;;) {
    const lock = await tryLock(redis, key, opts);
    if (lock) return lock;
    if (Date.now() > until) throw new Error(`lock ${key} not acquired within ${opts.waitMs} ms`);
    await new Promise((r) => setTimeout(r, 5 + Math.random() * 20));
  }
}

/** Whether anybody holds the lock. */
export async function isLocked(redis: Redis, key: string): Promise<boolean> {
  return (await redis.exists(key)) === 1;
}

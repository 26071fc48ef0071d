// Every host prunes its own engine: the fleet's job schedulers run a job on whichever worker takes it,
// which would prune one engine per interval, not each. So every worker runs this timer against its own
// engine, and a Redis key per engine with the interval as its TTL (SET NX) lets one worker of each
// engine run per interval however many that engine has. What an image last served is in Redis (per
// engine, written when an episode or `prepare` asks for it), so a restart loses nothing.
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { envPruneRanKey } from '../redis/redis-keys.ts';
import { engineId, type Docker } from '../sandbox/docker-client.ts';
import { pruneEnvironmentImages, type PruneResult } from './prune-images.ts';

export interface PruneScheduleOptions {
  docker: Docker;
  redis: Redis;
  prefix: string;
  log: Logger;
  budgetBytes: number;
  /** How often; 0: never (the handle's runNow still prunes). */
  everyMs: number;
  minIdleMs: number;
  callTimeoutMs: number;
}

export interface PruneSchedule {
  /** Prune now if no worker of this engine did within the interval; undefined when one did (or one runs here). */
  runNow(opts?: { force?: boolean }): Promise<PruneResult | undefined>;
  stop(): Promise<void>;
}

export function startPruneSchedule(opts: PruneScheduleOptions): PruneSchedule {
  let running: Promise<PruneResult | undefined> | undefined;
  let stopped = false;
  const once = async (force: boolean): Promise<PruneResult | undefined> => {
    const engine = await engineId(opts.docker, { timeoutMs: opts.callTimeoutMs });
    const key = envPruneRanKey(opts.prefix, engine);
    // Claimed for most of an interval: the next tick of any worker of this engine finds it gone.
    const ttlMs = Math.max(1_000, Math.floor((opts.everyMs || 60_000) * 0.9));
    if (force) await opts.redis.set(key, String(Date.now()), 'PX', ttlMs);
    else if ((await opts.redis.set(key, String(Date.now()), 'PX', ttlMs, 'NX')) === null) return undefined;
    const result = await pruneEnvironmentImages(opts, { budgetBytes: opts.budgetBytes, minIdleMs: opts.minIdleMs, callTimeoutMs: opts.callTimeoutMs });
    opts.log.info({ engine, removed: result.removed.length, freedBytes: result.freedBytes, keptBytes: result.keptBytes, budgetBytes: opts.budgetBytes }, 'environment images pruned');
    return result;
  };
  const runNow = (o: { force?: boolean } = {}) => {
    if (stopped) return Promise.resolve(undefined);
    if (running) return running.then(() => undefined);
    running = once(o.force ?? false).finally(() => (running = undefined));
    return running;
  };
  const tick = () => void runNow().catch((err: unknown) => opts.log.warn({ err: String(err) }, 'pruning environment images failed; next interval tries again'));
  const timer = opts.everyMs > 0 ? setInterval(tick, opts.everyMs) : undefined;
  timer?.unref();
  // A first run soon after start, not a whole interval later (a host that restarts often still prunes).
  const first = opts.everyMs > 0 ? setTimeout(tick, Math.min(opts.everyMs, 5_000)) : undefined;
  first?.unref();
  return {
    runNow,
    async stop() {
      stopped = true;
      clearInterval(timer);
      clearTimeout(first);
      await running?.catch(() => undefined);
    },
  };
}

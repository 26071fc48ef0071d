// Cross-process control of running episodes through Redis: which phase an episode is in, cancel
// requests (a flag plus a pub/sub message to whichever worker runs it), and the atomic hand-over to
// the close phase, so a cancel that arrives while an episode is closing is refused, never half-done.
import type { Redis } from 'ioredis';
import { episodeCancelChannel, episodeCancelKey, episodePhaseKey } from '../redis/redis-keys.ts';

/** Control keys outlive any episode: the longest deadline a task may have (7 days) and a day more. */
const TTL_SEC = 8 * 24 * 3600;

/**
 * Atomically: refuse when closing; otherwise flag the cancel and tell the running worker.
 * KEYS[1] phase key; KEYS[2] cancel key; ARGV[1] cancel channel; ARGV[2] episode id; ARGV[3] TTL in s.
 * Returns 'closing' (nothing touched), 'running' (flagged and published) or 'not-running' (flagged only).
 */
const REQUEST_CANCEL = `
local phase = redis.call('GET', KEYS[1])
if phase == 'closing' then return 'closing' end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[3])
if phase then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 'running'
end
return 'not-running'`;

/**
 * Atomically: a flagged cancel wins; otherwise the episode is closing from now on.
 * KEYS[1] phase key; KEYS[2] cancel key; ARGV[1] TTL in s.
 * Returns 'cancelled' (nothing touched) or 'closing' (phase set).
 */
const BEGIN_CLOSE = `
if redis.call('EXISTS', KEYS[2]) == 1 then return 'cancelled' end
redis.call('SET', KEYS[1], 'closing', 'EX', ARGV[1])
return 'closing'`;

/**
 * Atomically: mark running, unless a cancel was flagged before the episode started.
 * KEYS[1] phase key; KEYS[2] cancel key; ARGV[1] TTL in s.
 * Returns 'cancelled' (nothing touched) or 'running' (phase set).
 */
const MARK_RUNNING = `
if redis.call('EXISTS', KEYS[2]) == 1 then return 'cancelled' end
redis.call('SET', KEYS[1], 'running', 'EX', ARGV[1])
return 'running'`;

export type CancelAnswer = 'closing' | 'running' | 'not-running';

export class EpisodeControl {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {}

  get channel(): string {
    return episodeCancelChannel(this.prefix);
  }

  private keys(episodeId: string): [string, string] {
    return [episodePhaseKey(this.prefix, episodeId), episodeCancelKey(this.prefix, episodeId)];
  }

  async markRunning(episodeId: string): Promise<'running' | 'cancelled'> {
    return (await this.redis.eval(MARK_RUNNING, 2, ...this.keys(episodeId), TTL_SEC)) as 'running' | 'cancelled';
  }

  async beginClose(episodeId: string): Promise<'closing' | 'cancelled'> {
    return (await this.redis.eval(BEGIN_CLOSE, 2, ...this.keys(episodeId), TTL_SEC)) as 'closing' | 'cancelled';
  }

  async requestCancel(episodeId: string): Promise<CancelAnswer> {
    return (await this.redis.eval(REQUEST_CANCEL, 2, ...this.keys(episodeId), this.channel, episodeId, TTL_SEC)) as CancelAnswer;
  }

  /** The attempt is over (ended, retried or handed back): forget its phase and any cancel flag. */
  async end(episodeId: string): Promise<void> {
    await this.redis.del(...this.keys(episodeId));
  }

  /** The attempt is over but the episode goes on elsewhere: forget its phase, keep a cancel flag. */
  async release(episodeId: string): Promise<void> {
    await this.redis.del(this.keys(episodeId)[0]);
  }
}

// Cross-process control of running episodes through Redis: which phase an episode is in, cancel
// requests (a flag plus a pub/sub message to whichever worker runs it), and the atomic hand-over to
// the close phase, so a cancel that arrives while an episode is closing is refused, never half-done.
import type { Redis } from 'ioredis';
import { luaScript } from '../redis/lua-script.ts';
import { episodeCancelChannel, episodeCancelKey, episodePhaseKey } from '../redis/redis-keys.ts';

/** Control keys outlive any episode: the longest deadline a task may have (7 days) and a day more. */
const TTL_SEC = 8 * 24 * 3600;

/** Refuse when closing, else flag the cancel and tell the worker (src/redis/lua/episode-request-cancel-2.lua). */
const REQUEST_CANCEL = luaScript<[phase: string, cancel: string], [channel: string, episodeId: string, ttlSec: number], CancelAnswer>('episode-request-cancel-2');
/** A flagged cancel wins, else the episode is closing (src/redis/lua/episode-begin-close-2.lua). */
const BEGIN_CLOSE = luaScript<[phase: string, cancel: string], [ttlSec: number], 'closing' | 'cancelled'>('episode-begin-close-2');
/** Mark running unless a cancel came first (src/redis/lua/episode-mark-running-2.lua). */
const MARK_RUNNING = luaScript<[phase: string, cancel: string], [ttlSec: number], 'running' | 'cancelled'>('episode-mark-running-2');

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
    return await MARK_RUNNING.run(this.redis, this.keys(episodeId), [TTL_SEC]);
  }

  async beginClose(episodeId: string): Promise<'closing' | 'cancelled'> {
    return await BEGIN_CLOSE.run(this.redis, this.keys(episodeId), [TTL_SEC]);
  }

  async requestCancel(episodeId: string): Promise<CancelAnswer> {
    return await REQUEST_CANCEL.run(this.redis, this.keys(episodeId), [this.channel, episodeId, TTL_SEC]);
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

// Fleet-wide limits of one model endpoint, kept in Redis so that every proxy of every worker and host
// shares them: concurrent requests, requests per minute, tokens per minute, and an adaptive allowance
// factor (AIMD) that upstream's 429s and 503s cut and its successes raise back. Every decision is one
// atomic Lua script on Redis's own clock (TIME), never a caller's.
//
// A turn, as the scripts hand it out:
//  - concurrency: a sorted set of leases (lease id -> expiry). A holder that dies never releases; its
//    lease expires after `leaseMs` and the slot comes back. Waiters for a slot are served first come,
//    first served: each registers in a queue by arrival and may take a slot only when it is among the
//    first `free` of the queue (a waiter that stops asking drops out of the queue after a few seconds).
//  - requests per minute: GCRA (a token bucket kept as one "theoretical arrival time"), with a burst of
//    one second's worth (at least 1). A caller does not poll for its request: it reserves the next free
//    slot, up to `maxReserveMs` ahead (and no further than `maxWaitMs` of acquire, when given), and
//    sleeps until it. So waiters are served in order, without a thundering herd at each refill. A caller
//    aborted while sleeping gives its slot back when nobody reserved after it.
//  - tokens per minute: a token allowance of one minute's worth, refilled continuously, charged after
//    each answer (`release({ tokens })`); while it is in debt no new request starts.
//    A caller holds its concurrency slot from the moment it reserves its request slot.
//  - a Retry-After from upstream pauses every new turn fleet-wide until then (up to `maxPauseMs`); a
//    caller that wakes for a reserved slot during a pause gives it up and asks again after the pause.
// Adaptive allowance (shared in Redis): the endpoint's factor multiplies requestsPerMinute and
// maxConcurrent. A 429 or 503 cuts it (x`decrease`, not below `floor`), at most once per
// `cutIntervalMs`, so the 429s of the requests already in flight count as one congestion event; each
// success adds `increasePerSuccess` back, up to 1. A 429 also says upstream's own bucket is empty, so
// ours is emptied too (no burst left, the next turns come at the steady pace): with requestsPerMinute
// equal to the endpoint's true limit, upstream's bucket then refills during the first pause and keeps
// that cushion, and jitter in arrival times no longer makes 429s.
//
// Metrics (in flight, waiting, 429s and 503s, tokens of the last minute, factor, pause) live in the
// same keys, so any process (the dashboard) reads them with `readEndpointLimitMetrics`. Every key is
// renewed with a TTL (`idleTtlMs`) by each script that touches it: a retired endpoint leaves nothing.
//
// When Redis does not answer, acquire waits for it (ioredis queues the command) until the signal
// aborts; release gives up after a few seconds (the lease then expires by itself).
import { createHash, randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { untilAborted } from '../deadlines/deadline.ts';
import { luaScript } from '../redis/lua-script.ts';
import {
  modelLimitLeasesKey,
  modelLimitQueueKey,
  modelLimitStateKey,
  modelLimitTokensKey,
  modelLimitWaitersKey,
  modelLimitsIndexKey,
} from '../redis/redis-keys.ts';
import { RateLimitWaitAborted, UNLIMITED, type AttemptOutcome, type EndpointLimiter, type EndpointPermit } from './endpoint-limiter.ts';

export interface FleetLimits {
  /** Concurrent requests across the fleet. Unset: no limit. */
  maxConcurrent?: number | undefined;
  /** Requests per minute across the fleet (bursts of about one second's worth). Unset: no limit. */
  requestsPerMinute?: number | undefined;
  /** Tokens per minute across the fleet, charged after each answer. Unset: no limit. */
  tokensPerMinute?: number | undefined;
}

/**
 * The adaptive allowance. The defaults, and why:
 *  - decrease 0.7: a 429 of a rate limit is a precise signal (we were at most a little over), so a
 *    gentle cut (as CUBIC's 0.7, not TCP Reno's 0.5) clears it while losing little throughput;
 *  - floor 0.1: a long run of 429s (a shared key, a smaller limit than configured) still lets a tenth
 *    through, so the fleet notices when it clears;
 *  - increasePerSuccess 0.01: 30 successes bring 0.7 back to 1, about 4 s at 600 requests a minute:
 *    slow enough that a cut is not undone by the answers still in flight, fast enough to lose little;
 *  - cutIntervalMs 2000: longer than one round of 429s of requests already under way (they come back
 *    within a request's latency), short enough that a limit still too high is cut again soon;
 *  - maxPauseMs 60000: a Retry-After beyond a minute is not believed (it stops the whole fleet).
 */
export interface AimdOptions {
  decrease?: number;
  floor?: number;
  increasePerSuccess?: number;
  cutIntervalMs?: number;
  maxPauseMs?: number;
}

export const DEFAULT_AIMD: Required<AimdOptions> = { decrease: 0.7, floor: 0.1, increasePerSuccess: 0.01, cutIntervalMs: 2_000, maxPauseMs: 60_000 };

export interface FleetLimiterOptions {
  redis: Redis;
  /** The fleet prefix (FLEET_PREFIX). */
  prefix: string;
  /** The endpoint's base URL; credentials in it are never stored, logged or hashed. */
  endpoint: string;
  /**
   * The endpoint's name in the workers' table (FLEET_MODEL_ENDPOINTS; `default` for MODEL_BASE_URL):
   * part of its keys, so two endpoints of one base URL keep separate limits. Unset: the URL alone.
   */
  name?: string | undefined;
  limits: FleetLimits;
  aimd?: AimdOptions;
  log: Logger;
  /** A concurrency slot whose holder never released it comes back after this long. @default 330000 (the default MODEL_REQUEST_TIMEOUT_MS + 30 s) */
  leaseMs?: number;
  /** Burst of the requests-per-minute allowance, in seconds of it (at least one request). @default 1 */
  burstSeconds?: number;
  /** How far ahead a caller may reserve its request's slot; further back in line it asks again later. @default 5000 */
  maxReserveMs?: number;
  /** Keys of an endpoint nobody used for this long expire. @default max(1 hour, 2 x leaseMs) */
  idleTtlMs?: number;
}

export interface AcquireOptions {
  /**
   * The longest this caller will wait (e.g. what is left of its deadline): no request slot is
   * reserved further ahead than this, so a caller that will give up does not hold a slot it will not
   * use. Without it, a slot is reserved up to `maxReserveMs` ahead and an abort gives it back.
   */
  maxWaitMs?: number;
}

/** This process's view of its own turns (the fleet-wide numbers are in `snapshot()`). */
export interface FleetLimiterStats {
  granted: number;
  aborted: number;
  waiting: number;
  inFlight: number;
  /** Sum and maximum of the waits for a turn that was granted, in ms. */
  waitMsTotal: number;
  waitMsMax: number;
}

/** One endpoint's fleet-wide numbers, as kept in Redis. */
export interface EndpointLimitMetrics {
  /** Short sha256 of the base URL without credentials. */
  endpoint: string;
  /** host[:port] of the base URL (no credentials). */
  host: string;
  inFlight: number;
  /** Callers waiting for a turn, including those sleeping until their reserved slot. */
  waiting: number;
  /** 429 answers reported, since the endpoint's keys were created. */
  rateLimited: number;
  /** 503 answers reported, since the endpoint's keys were created. */
  unavailable: number;
  tokensLastMinute: number;
  allowanceFactor: number;
  /** How long new turns are still paused by a Retry-After, in ms (0: none). */
  pausedMs: number;
}

export interface FleetLimiter extends EndpointLimiter {
  readonly endpointId: string;
  readonly host: string;
  acquire(signal: AbortSignal, opts?: AcquireOptions): Promise<EndpointPermit>;
  stats(): FleetLimiterStats;
  /** The endpoint's fleet-wide numbers, read from Redis. */
  snapshot(): Promise<EndpointLimitMetrics>;
}

/**
 * The endpoint's key id and host, for keys and labels: a short sha256 of the URL without user:password,
 * after the endpoint's name when it has one (`fast.3f9a...`), so each named endpoint has its own limits.
 */
export function endpointIdentity(baseUrl: string, name?: string): { id: string; host: string } {
  const u = new URL(baseUrl);
  u.username = '';
  u.password = '';
  const bare = u.href.replace(/\/+$/, '');
  const digest = createHash('sha256').update(bare).digest('hex').slice(0, 12);
  return { id: name === undefined ? digest : `${name}.${digest}`, host: u.host };
}

// ---- the scripts (src/redis/lua/model-limit-*.lua) ------------------------------------------------

type AcquireReply = [granted: 0, delayMs: string, reservedTat: string, T: string] | [wait: 1, hintMs: string, reason: string];
type MetricsReply = [host: string, inFlight: number, waiting: number, rateLimited: number, unavailable: number, tokensLastMinute: number, factor: string, pausedMs: string];

const ACQUIRE = luaScript<
  [state: string, leases: string, queue: string, waiters: string, index: string],
  [id: string, leaseMs: number, maxConcurrent: number, rpm: number, tpm: number, horizonMs: number, aliveMs: number, ttlMs: number, endpointId: string, host: string, burstSeconds: number],
  AcquireReply
>('model-limit-acquire-5');
const LEAVE = luaScript<[state: string, leases: string, queue: string, waiters: string], [id: string, reservedTat: string, T: string], 1>('model-limit-leave-4');
const PAUSE_LEFT = luaScript<[state: string], [], string>('model-limit-pause-left-1');
const RELEASE = luaScript<
  [state: string, leases: string, tokens: string],
  [
    id: string, status: number | '', retryAfterMs: number | '', tokens: number | '', rpm: number, tpm: number, burstSeconds: number,
    decrease: number, floor: number, increase: number, cutIntervalMs: number, maxPauseMs: number, ttlMs: number,
  ],
  1
>('model-limit-release-3');
const METRICS = luaScript<[state: string, leases: string, waiters: string, tokens: string], [], MetricsReply | null>('model-limit-metrics-4');

// ---- the limiter ---------------------------------------------------------------------------------

/** A waiter that stops asking for this long is dropped from the queue (it sleeps at most POLL_MAX_MS between asks). */
const WAITER_ALIVE_MS = 5_000;
const POLL_MIN_MS = 5;
const POLL_MAX_MS = 1_000;
/** A release waits this long for Redis, then gives up (the lease expires by itself). */
const RELEASE_PATIENCE_MS = 5_000;
/** An aborted caller waits this long for Redis to take its leave. */
const LEAVE_PATIENCE_MS = 1_000;

const positive = (name: string, v: number | undefined) => {
  if (v !== undefined && !(Number.isFinite(v) && v > 0)) throw new TypeError(`Expected \`${name}\` to be a number above 0, got \`${String(v)}\` (${typeof v})`);
  return v;
};

const jittered = (ms: number) => Math.min(POLL_MAX_MS, Math.max(POLL_MIN_MS, ms)) * (0.8 + 0.4 * Math.random());

export function createFleetLimiter(opts: FleetLimiterOptions): FleetLimiter {
  const { redis, prefix, log: parentLog } = opts;
  const maxConcurrent = positive('limits.maxConcurrent', opts.limits.maxConcurrent);
  const rpm = positive('limits.requestsPerMinute', opts.limits.requestsPerMinute);
  const tpm = positive('limits.tokensPerMinute', opts.limits.tokensPerMinute);
  const aimd = { ...DEFAULT_AIMD, ...opts.aimd };
  if (!(aimd.decrease > 0 && aimd.decrease < 1)) throw new TypeError(`Expected \`aimd.decrease\` to be above 0 and below 1, got ${aimd.decrease}`);
  if (!(aimd.floor > 0 && aimd.floor <= 1)) throw new TypeError(`Expected \`aimd.floor\` to be above 0 and at most 1, got ${aimd.floor}`);
  const leaseMs = Math.ceil(positive('leaseMs', opts.leaseMs) ?? 330_000);
  const burstSeconds = positive('burstSeconds', opts.burstSeconds) ?? 1;
  const maxReserveMs = positive('maxReserveMs', opts.maxReserveMs) ?? 5_000;
  const idleTtlMs = Math.ceil(positive('idleTtlMs', opts.idleTtlMs) ?? Math.max(3_600_000, 2 * leaseMs));
  const { id: endpointId, host } = endpointIdentity(opts.endpoint, opts.name);
  const log = parentLog.child({ component: 'fleet-limits', endpoint: endpointId, host });
  const state = modelLimitStateKey(prefix, endpointId);
  const leases = modelLimitLeasesKey(prefix, endpointId);
  const queue = modelLimitQueueKey(prefix, endpointId);
  const waiters = modelLimitWaitersKey(prefix, endpointId);
  const tokens = modelLimitTokensKey(prefix, endpointId);
  const index = modelLimitsIndexKey(prefix);
  const local: FleetLimiterStats = { granted: 0, aborted: 0, waiting: 0, inFlight: 0, waitMsTotal: 0, waitMsMax: 0 };

  interface Grant {
    delayMs: number;
    reservedTat: string;
    T: string;
  }
  const parseGrant = (r: AcquireReply): Grant | undefined => (r[0] === 0 ? { delayMs: Number(r[1]), reservedTat: r[2], T: r[3] } : undefined);

  /** Take an aborted caller's leave (bounded: a Redis that does not answer must not hold the abort up). */
  async function leave(id: string, grant: Grant | undefined): Promise<void> {
    const done = LEAVE.run(redis, [state, leases, queue, waiters], [id, grant?.reservedTat ?? '', grant?.T ?? '0']).then(
      () => undefined,
      (err: unknown) => log.warn({ err }, 'could not give back an aborted turn; it expires by itself'),
    );
    await Promise.race([done, sleep(LEAVE_PATIENCE_MS)]);
  }

  function permit(id: string): EndpointPermit {
    let released = false;
    local.inFlight += 1;
    return {
      async release(outcome: AttemptOutcome) {
        if (released) return;
        released = true;
        local.inFlight -= 1;
        const done = RELEASE
          .run(redis, [state, leases, tokens], [
            id,
            outcome.status ?? '', outcome.retryAfterMs ?? '', outcome.tokens === undefined ? '' : Math.max(0, Math.round(outcome.tokens)),
            rpm ?? 0, tpm ?? 0, burstSeconds,
            aimd.decrease, aimd.floor, aimd.increasePerSuccess, aimd.cutIntervalMs, aimd.maxPauseMs, idleTtlMs,
          ])
          .then(
            () => {
              if (outcome.status === 429 || outcome.status === 503) log.debug({ status: outcome.status, retryAfterMs: outcome.retryAfterMs }, 'endpoint congested');
            },
            (err: unknown) => log.warn({ err }, 'could not release a turn of the model endpoint; its lease expires by itself'),
          );
        await Promise.race([done, sleep(RELEASE_PATIENCE_MS)]);
      },
    };
  }

  async function acquire(signal: AbortSignal, acquireOpts: AcquireOptions = {}): Promise<EndpointPermit> {
    const started = performance.now();
    const waited = () => Math.round(performance.now() - started);
    if (signal.aborted) {
      local.aborted += 1;
      throw new RateLimitWaitAborted(0, signal.reason);
    }
    const id = randomBytes(12).toString('base64url');
    let grant: Grant | undefined;
    local.waiting += 1;
    try {
      for (;;) {
        const left = acquireOpts.maxWaitMs === undefined ? Infinity : acquireOpts.maxWaitMs - (performance.now() - started);
        const horizonMs = Math.floor(Math.max(0, Math.min(maxReserveMs, left)));
        const answer = await untilAborted(
          ACQUIRE.run(
            redis,
            [state, leases, queue, waiters, index],
            [id, leaseMs, maxConcurrent ?? 0, rpm ?? 0, tpm ?? 0, horizonMs, WAITER_ALIVE_MS, idleTtlMs, endpointId, host, burstSeconds],
          ),
          signal,
          // A grant that comes after the abort is given back.
          (late) => void leave(id, parseGrant(late)),
        );
        grant = parseGrant(answer);
        if (grant === undefined) {
          await sleep(jittered(Number(answer[1])), undefined, { signal });
          continue;
        }
        // Granted in the very moment the signal aborted: the caller gets no turn, the grant goes back (catch).
        signal.throwIfAborted();
        if (grant.delayMs > 0) {
          await sleep(grant.delayMs, undefined, { signal });
          // A Retry-After that came while this caller slept for its slot holds it too. Its slot fell in
          // the pause: it gives it up and asks again, so the callers reserved during a pause do not all
          // start at once when it ends (the 429 spent the allowance; turns resume at the steady pace).
          const pausedMs = Number(await untilAborted(PAUSE_LEFT.run(redis, [state], []), signal));
          if (pausedMs > 0) {
            const dropped = grant;
            grant = undefined;
            await leave(id, dropped);
            await sleep(jittered(pausedMs), undefined, { signal });
            continue;
          }
        }
        const ms = waited();
        local.granted += 1;
        local.waitMsTotal += ms;
        local.waitMsMax = Math.max(local.waitMsMax, ms);
        return permit(id);
      }
    } catch (err) {
      // An abort during any wait (for Redis, through untilAborted, or a sleep) rejects with the signal's
      // reason: the caller gives its turn up. Anything else (Redis failing) is the caller's error.
      if (!signal.aborted) throw err;
      local.aborted += 1;
      await leave(id, grant);
      throw new RateLimitWaitAborted(waited(), signal.reason);
    } finally {
      local.waiting -= 1;
    }
  }

  log.info({ limits: { maxConcurrent, requestsPerMinute: rpm, tokensPerMinute: tpm }, aimd, leaseMs }, 'fleet-wide limits of the model endpoint');
  return {
    endpointId,
    host,
    acquire,
    stats: () => ({ ...local }),
    async snapshot() {
      return (await readOne(redis, prefix, endpointId)) ?? { endpoint: endpointId, host, inFlight: 0, waiting: 0, rateLimited: 0, unavailable: 0, tokensLastMinute: 0, allowanceFactor: 1, pausedMs: 0 };
    },
  };
}

async function readOne(redis: Redis, prefix: string, endpointId: string): Promise<EndpointLimitMetrics | undefined> {
  const r = await METRICS.run(
    redis,
    [modelLimitStateKey(prefix, endpointId), modelLimitLeasesKey(prefix, endpointId), modelLimitWaitersKey(prefix, endpointId), modelLimitTokensKey(prefix, endpointId)],
    [],
  );
  if (r === null) return undefined;
  const [host, inFlight, waiting, rateLimited, unavailable, tokensLastMinute, factor, pausedMs] = r;
  return { endpoint: endpointId, host, inFlight, waiting, rateLimited, unavailable, tokensLastMinute, allowanceFactor: Number(factor), pausedMs: Number(pausedMs) };
}

/** Every endpoint's fleet-wide numbers (endpoints whose keys expired are dropped from the list). */
export async function readEndpointLimitMetrics(redis: Redis, prefix: string): Promise<EndpointLimitMetrics[]> {
  const ids = await redis.zrange(modelLimitsIndexKey(prefix), 0, -1);
  const out: EndpointLimitMetrics[] = [];
  for (const id of ids) {
    const m = await readOne(redis, prefix, id);
    if (m === undefined) await redis.zrem(modelLimitsIndexKey(prefix), id);
    else out.push(m);
  }
  return out;
}

/**
 * The endpoint's limiter (MODEL_MAX_CONCURRENT, MODEL_REQUESTS_PER_MINUTE and MODEL_TOKENS_PER_MINUTE
 * for `default`, the table's maxConcurrent, requestsPerMinute and tokensPerMinute for the others, keyed
 * by `name` when given); `UNLIMITED` when no limit is set. A concurrency slot of a dead holder comes
 * back after the request's deadline + 30 s.
 */
export function endpointLimiter(endpoint: string, limits: FleetLimits, requestTimeoutMs: number, deps: { redis: Redis; prefix: string; log: Logger }, name?: string): EndpointLimiter {
  if (Object.values(limits).every((v) => v === undefined)) return UNLIMITED;
  return createFleetLimiter({ ...deps, endpoint, name, limits, leaseMs: requestTimeoutMs + 30_000 });
}

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

/** The endpoint's key id (a short sha256 of the URL without user:password) and host, for keys and labels. */
export function endpointIdentity(baseUrl: string): { id: string; host: string } {
  const u = new URL(baseUrl);
  u.username = '';
  u.password = '';
  const bare = u.href.replace(/\/+$/, '');
  return { id: createHash('sha256').update(bare).digest('hex').slice(0, 12), host: u.host };
}

// ---- the scripts ---------------------------------------------------------------------------------

const NOW = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
`;

/** Wait before a request at `now`: GCRA's emission interval and tolerance at the current factor. */
const GCRA = `local function gcra(rpm, factor, burstS)
  local perS = rpm * factor / 60
  local T = 1000 / perS
  local burst = math.max(1, math.floor(perS * burstS))
  return T, (burst - 1) * T
end
`;

// KEYS: state, leases, queue, waiters, index
// ARGV: id, leaseMs, maxConcurrent, rpm, tpm, horizonMs, aliveMs, ttlMs, endpointId, host, burstSeconds
// -> {0, delayMs, reservedTat, T} granted (sleep delayMs first) | {1, hintMs, reason} wait
const ACQUIRE = `${NOW}${GCRA}
local id = ARGV[1]
local leaseMs, maxC, rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local horizon, aliveMs, ttl, burstS = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[11])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for i = 1, #gone do redis.call('ZREM', KEYS[3], gone[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
redis.call('ZADD', KEYS[3], 'NX', now, id)
redis.call('ZADD', KEYS[4], now + aliveMs, id)
redis.call('HSET', KEYS[1], 'host', ARGV[10], 'lease_ms', leaseMs)
redis.call('ZADD', KEYS[5], now, ARGV[9])
local function touch()
  for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
local s = redis.call('HMGET', KEYS[1], 'factor', 'tat', 'pause_until', 'tok_allow', 'tok_at')
local factor = tonumber(s[1]) or 1
local function wait(ms, why)
  touch()
  return {1, tostring(math.ceil(ms)), why}
end
local pauseUntil = tonumber(s[3]) or 0
if pauseUntil > now then return wait(pauseUntil - now, 'paused') end
if tpm > 0 and s[4] then
  local rate = tpm / 60000
  local allow = math.min(tpm, tonumber(s[4]) + (now - tonumber(s[5])) * rate)
  if allow < 0 then return wait(-allow / rate, 'tokens') end
end
if maxC > 0 then
  local cap = math.max(1, math.floor(maxC * factor))
  local free = cap - redis.call('ZCARD', KEYS[2])
  local rank = redis.call('ZRANK', KEYS[3], id)
  if rank >= free then return wait(math.min(250, 10 * (rank - math.max(free, 0) + 1)), 'busy') end
end
local delay, reserved, T = 0, '', 0
if rpm > 0 then
  local tau
  T, tau = gcra(rpm, factor, burstS)
  local start = math.max(tonumber(s[2]) or 0, now)
  local slot = math.max(now, start - tau)
  if slot - now > horizon then return wait(slot - now - horizon, 'rate') end
  reserved = string.format('%.3f', start + T)
  redis.call('HSET', KEYS[1], 'tat', reserved)
  delay = slot - now
end
redis.call('ZADD', KEYS[2], now + delay + leaseMs, id)
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
touch()
return {0, tostring(math.ceil(delay)), reserved, string.format('%.3f', T)}
`;

// KEYS: state, leases, queue, waiters
// ARGV: id, reservedTat ('' when none), T
// An aborted caller leaves: out of the queue, its lease freed, its reserved slot given back when it
// was the last one reserved.
const LEAVE = `
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'tat') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'tat', string.format('%.3f', tonumber(ARGV[2]) - tonumber(ARGV[3])))
end
return 1
`;

// KEYS: state -> ms the endpoint is still paused (0: not)
const PAUSE_LEFT = `${NOW}
local p = tonumber(redis.call('HGET', KEYS[1], 'pause_until') or '0')
return tostring(math.max(0, math.ceil(p - now)))
`;

// KEYS: state, leases, tokens
// ARGV: id, status, retryAfterMs, tokens, rpm, tpm, burstSeconds, decrease, floor, increase, cutIntervalMs, maxPauseMs, ttlMs
const RELEASE = `${NOW}${GCRA}
redis.call('ZREM', KEYS[2], ARGV[1])
local status, retryAfter, tokens = tonumber(ARGV[2]) or 0, tonumber(ARGV[3]) or 0, tonumber(ARGV[4]) or 0
local rpm, tpm, burstS = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local decrease, floor, increase = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local cutInterval, maxPause, ttl = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local s = redis.call('HMGET', KEYS[1], 'factor', 'cut_at', 'pause_until', 'tat', 'tok_allow', 'tok_at')
local factor = tonumber(s[1]) or 1
if status == 429 or status == 503 then
  redis.call('HINCRBY', KEYS[1], 'n' .. status, 1)
  if now - (tonumber(s[2]) or 0) >= cutInterval then
    factor = math.max(floor, factor * decrease)
    redis.call('HSET', KEYS[1], 'factor', string.format('%.6f', factor), 'cut_at', string.format('%.3f', now))
  end
  local pauseUntil = tonumber(s[3]) or 0
  if retryAfter > 0 and now + math.min(retryAfter, maxPause) > pauseUntil then
    pauseUntil = now + math.min(retryAfter, maxPause)
    redis.call('HSET', KEYS[1], 'pause_until', string.format('%.3f', pauseUntil))
  end
  if status == 429 and rpm > 0 then
    local T, tau = gcra(rpm, factor, burstS)
    local emptied = math.max(now, pauseUntil) + tau
    if emptied > (tonumber(s[4]) or 0) then redis.call('HSET', KEYS[1], 'tat', string.format('%.3f', emptied)) end
  end
elseif status >= 200 and status < 300 and factor < 1 then
  redis.call('HSET', KEYS[1], 'factor', string.format('%.6f', math.min(1, factor + increase)))
end
if tokens > 0 then
  local sec = math.floor(now / 1000)
  redis.call('HINCRBY', KEYS[3], sec, tokens)
  local fields = redis.call('HKEYS', KEYS[3])
  for i = 1, #fields do
    if tonumber(fields[i]) < sec - 60 then redis.call('HDEL', KEYS[3], fields[i]) end
  end
  redis.call('PEXPIRE', KEYS[3], ttl)
  if tpm > 0 then
    local allow = tpm
    if s[5] then allow = math.min(tpm, tonumber(s[5]) + (now - tonumber(s[6])) * tpm / 60000) end
    redis.call('HSET', KEYS[1], 'tok_allow', string.format('%.3f', allow - tokens), 'tok_at', string.format('%.3f', now))
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
`;

// KEYS: state, leases, waiters, tokens -> false when the endpoint's state is gone, else its numbers
const METRICS = `${NOW}
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local s = redis.call('HMGET', KEYS[1], 'host', 'lease_ms', 'n429', 'n503', 'factor', 'pause_until')
local leaseMs = tonumber(s[2]) or 0
local inFlight = redis.call('ZCOUNT', KEYS[2], '(' .. now, now + leaseMs)
local reserved = redis.call('ZCOUNT', KEYS[2], '(' .. (now + leaseMs), '+inf')
local waiting = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf') + reserved
local sec = math.floor(now / 1000)
local tokens = 0
local buckets = redis.call('HGETALL', KEYS[4])
for i = 1, #buckets, 2 do
  if tonumber(buckets[i]) > sec - 60 then tokens = tokens + tonumber(buckets[i + 1]) end
end
return {s[1] or '', inFlight, waiting, tonumber(s[3]) or 0, tonumber(s[4]) or 0, tokens, s[5] or '1', tostring(math.max(0, math.ceil((tonumber(s[6]) or 0) - now)))}
`;

const SCRIPTS = {
  rfModelLimitAcquire: { numberOfKeys: 5, lua: ACQUIRE },
  rfModelLimitLeave: { numberOfKeys: 4, lua: LEAVE },
  rfModelLimitPauseLeft: { numberOfKeys: 1, lua: PAUSE_LEFT },
  rfModelLimitRelease: { numberOfKeys: 3, lua: RELEASE },
  rfModelLimitMetrics: { numberOfKeys: 4, lua: METRICS },
} as const;

type Script = (...args: (string | number)[]) => Promise<unknown>;

/** The scripts as commands of this connection (EVALSHA, loaded on first use). */
function scripts(redis: Redis): Record<keyof typeof SCRIPTS, Script> {
  for (const [name, def] of Object.entries(SCRIPTS)) {
    if (typeof (redis as unknown as Record<string, unknown>)[name] !== 'function') redis.defineCommand(name, def);
  }
  return redis as unknown as Record<keyof typeof SCRIPTS, Script>;
}

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

class Aborted extends Error {}

/** Settle with `p`, or reject with Aborted when `signal` aborts first (then `late` gets what `p` brings). */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal, late: (value: T) => void): Promise<T> {
  if (signal.aborted) {
    p.then(late, () => undefined);
    return Promise.reject(new Aborted());
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      p.then(late, () => undefined);
      reject(new Aborted());
    };
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        // Aborted first: onAbort rejected and handed `v` to `late` already.
        if (!signal.aborted) resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}

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
  const { id: endpointId, host } = endpointIdentity(opts.endpoint);
  const log = parentLog.child({ component: 'fleet-limits', endpoint: endpointId, host });
  const cmd = scripts(redis);
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
  const parseGrant = (r: unknown): Grant | undefined => {
    const [kind, ms, reservedTat, T] = r as [number, string, string, string];
    return kind === 0 ? { delayMs: Number(ms), reservedTat, T } : undefined;
  };

  /** Take an aborted caller's leave (bounded: a Redis that does not answer must not hold the abort up). */
  async function leave(id: string, grant: Grant | undefined): Promise<void> {
    const done = cmd.rfModelLimitLeave(state, leases, queue, waiters, id, grant?.reservedTat ?? '', grant?.T ?? '0').then(
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
        const done = cmd
          .rfModelLimitRelease(
            state, leases, tokens, id,
            outcome.status ?? '', outcome.retryAfterMs ?? '', outcome.tokens === undefined ? '' : Math.max(0, Math.round(outcome.tokens)),
            rpm ?? 0, tpm ?? 0, burstSeconds,
            aimd.decrease, aimd.floor, aimd.increasePerSuccess, aimd.cutIntervalMs, aimd.maxPauseMs, idleTtlMs,
          )
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
          cmd.rfModelLimitAcquire(
            state, leases, queue, waiters, index,
            id, leaseMs, maxConcurrent ?? 0, rpm ?? 0, tpm ?? 0, horizonMs, WAITER_ALIVE_MS, idleTtlMs, endpointId, host, burstSeconds,
          ),
          signal,
          (late) => void leave(id, parseGrant(late)),
        );
        grant = parseGrant(answer);
        if (grant === undefined) {
          await sleep(jittered(Number((answer as unknown[])[1])), undefined, { signal });
          continue;
        }
        if (grant.delayMs > 0) {
          await sleep(grant.delayMs, undefined, { signal });
          // A Retry-After that came while this caller slept for its slot holds it too. Its slot fell in
          // the pause: it gives it up and asks again, so the callers reserved during a pause do not all
          // start at once when it ends (the 429 spent the allowance; turns resume at the steady pace).
          const pausedMs = Number(await untilAborted(cmd.rfModelLimitPauseLeft(state), signal, () => undefined));
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
      if (!signal.aborted && !(err instanceof Aborted)) throw err;
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
  const r = (await scripts(redis).rfModelLimitMetrics(
    modelLimitStateKey(prefix, endpointId),
    modelLimitLeasesKey(prefix, endpointId),
    modelLimitWaitersKey(prefix, endpointId),
    modelLimitTokensKey(prefix, endpointId),
  )) as [string, number, number, number, number, number, string, string] | null;
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
 * The limiter of MODEL_BASE_URL under MODEL_MAX_CONCURRENT, MODEL_REQUESTS_PER_MINUTE and
 * MODEL_TOKENS_PER_MINUTE; `UNLIMITED` when none is set (or there is no endpoint). A concurrency slot
 * of a dead holder comes back after MODEL_REQUEST_TIMEOUT_MS + 30 s.
 */
/** The endpoint's limiter: UNLIMITED when no limit is set. A slot's lease outlives the request's deadline by 30 s. */
export function endpointLimiter(endpoint: string, limits: FleetLimits, requestTimeoutMs: number, deps: { redis: Redis; prefix: string; log: Logger }): EndpointLimiter {
  if (Object.values(limits).every((v) => v === undefined)) return UNLIMITED;
  return createFleetLimiter({ ...deps, endpoint, limits, leaseMs: requestTimeoutMs + 30_000 });
}

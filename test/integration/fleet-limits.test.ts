// The fleet-wide limits of a model endpoint on a real Redis, with several limiter instances on their
// own connections as several worker processes would have them: the concurrency cap, the requests per
// minute, a dead holder's lease coming back, the adaptive allowance and Retry-After, aborted waits,
// and the limiter in front of the scripted model stub's own rate limit over real HTTP.
import { setMaxListeners } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createFleetMetrics } from '../../src/dashboard/fleet-metrics.ts';
import { RateLimitWaitAborted, UNLIMITED, type EndpointPermit } from '../../src/model/endpoint-limiter.ts';
import { modelSettings } from '../../src/cli/worker-command.ts';
import { createFleetLimiter, endpointIdentity, endpointLimiter, readEndpointLimitMetrics, type FleetLimiter, type FleetLimiterOptions } from '../../src/model/fleet-limits.ts';
import { STUB_STATS_PATH, startModelStub } from '../../src/model/model-stub.ts';
import { loadConfig } from '../../src/config/config.ts';
import { fleetKeyPattern } from '../../src/redis/redis-keys.ts';
import { silentLog, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS, TOOLS, bodyOf, chat, conversation, request } from '../helpers/model.ts';

describe('fleet-wide model endpoint limits', () => {
  let env: FleetEnv;
  const connections: Redis[] = [];
  let n = 0;

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(connections.map((c) => c.quit()));
    await env?.close();
  });

  /** A fresh endpoint (its own keys) and `count` limiters of it, each on its own connection. */
  function limiters(count: number, opts: Omit<FleetLimiterOptions, 'redis' | 'prefix' | 'endpoint' | 'log'> & { endpoint?: string }): FleetLimiter[] {
    const endpoint = opts.endpoint ?? `http://user:secret@endpoint-${n++}.test:8000/v1`;
    return Array.from({ length: count }, () => {
      const redis = new Redis(env.redis.url, { maxRetriesPerRequest: null });
      connections.push(redis);
      return createFleetLimiter({ ...opts, redis, prefix: env.prefix, endpoint, log: silentLog });
    });
  }

  const never = () => new AbortController().signal;

  it('hold the concurrency cap across three instances on three connections', async () => {
    const ls = limiters(3, { limits: { maxConcurrent: 5 } });
    let holders = 0;
    let most = 0;
    await Promise.all(Array.from({ length: 12 }, async (_, i) => {
      const limiter = ls[i % 3]!;
      for (let k = 0; k < 12; k++) {
        const permit = await limiter.acquire(never());
        holders += 1;
        most = Math.max(most, holders);
        await sleep(5 + Math.random() * 20);
        holders -= 1;
        await permit.release({ status: 200 });
      }
    }));
    expect(most).toBe(5);
    expect(await ls[0]!.snapshot()).toMatchObject({ inFlight: 0, waiting: 0, allowanceFactor: 1 });
  });

  it('hold the requests per minute across three instances: the limit, and never more than a burst over it', async () => {
    const rpm = 600;
    const burst = rpm / 60;
    const ls = limiters(3, { limits: { requestsPerMinute: rpm } });
    const runMs = 4_000;
    const stop = new AbortController();
    setMaxListeners(50, stop.signal);
    const grants: number[] = [];
    const t0 = performance.now();
    setTimeout(() => stop.abort(), runMs);
    await Promise.all(Array.from({ length: 12 }, async (_, i) => {
      while (!stop.signal.aborted) {
        const permit = await ls[i % 3]!.acquire(stop.signal).catch((err: unknown) => {
          if (err instanceof RateLimitWaitAborted) return undefined;
          throw err;
        });
        if (permit === undefined) return;
        grants.push(performance.now() - t0);
        await permit.release({ status: 200 });
      }
    }));
    grants.sort((a, b) => a - b);
    // The burst at once, then the steady pace: measured after the burst.
    const steady = grants.slice(burst);
    const measuredRpm = ((steady.length - 1) / (steady.at(-1)! - steady[0]!)) * 60_000;
    console.log(`requests per minute: ${grants.length} turns in ${runMs} ms, steady pace ${measuredRpm.toFixed(1)}/min against ${rpm}`);
    expect(measuredRpm).toBeGreaterThan(rpm * 0.97);
    expect(measuredRpm).toBeLessThan(rpm * 1.03);
    expect(grants.length).toBeLessThanOrEqual(burst + (rpm / 60_000) * runMs + 1);
    // In any second: at most a second's worth plus the burst (+1 for a timer that fired late next to one on time).
    for (let i = 0; i < grants.length; i++) {
      const inWindow = grants.filter((t) => t >= grants[i]! && t < grants[i]! + 1_000).length;
      expect(inWindow).toBeLessThanOrEqual(rpm / 60 + burst + 1);
    }
    expect(await ls[0]!.snapshot()).toMatchObject({ inFlight: 0, waiting: 0 });
  });

  it('give back the slot of a holder that died after leaseMs', async () => {
    const [a, b] = limiters(2, { limits: { maxConcurrent: 2 }, leaseMs: 800 });
    // Taken and never released, as by a worker killed mid-request.
    await a!.acquire(never());
    await a!.acquire(never());
    const t0 = performance.now();
    const third = b!.acquire(never());
    // Checked in one snapshot: a second look could come after the leases expired (a loaded machine).
    await waitFor('the third caller to wait behind the two held slots', async () => {
      const m = await b!.snapshot();
      return m.waiting === 1 && m.inFlight === 2;
    }, 5_000, 20);
    const permit = await third;
    const waited = performance.now() - t0;
    expect(waited).toBeGreaterThan(600);
    expect(waited).toBeLessThan(3_000);
    // The dead holder's two leases were taken a moment apart: the second expires a moment later.
    await waitFor('both dead slots given back, one taken by the third caller', async () => {
      const m = await b!.snapshot();
      return m.inFlight === 1 && m.waiting === 0;
    }, 3_000, 20);
    await permit.release({ status: 200 });
  });

  it('cut the allowance once for a burst of 429s, raise it back with successes, and pause everyone for a Retry-After', async () => {
    const [a, b] = limiters(2, { limits: { maxConcurrent: 10, requestsPerMinute: 60_000 } });
    const permits = await Promise.all(Array.from({ length: 5 }, () => a!.acquire(never())));
    await Promise.all(permits.map((p) => p.release({ status: 429 })));
    let m = await b!.snapshot();
    expect(m.allowanceFactor).toBeCloseTo(0.7, 6);
    expect(m.rateLimited).toBe(5);
    // Cut to 0.7 of 10: 7 at once now, the eighth waits.
    const seven = await Promise.all(Array.from({ length: 7 }, () => b!.acquire(never())));
    await expect(b!.acquire(AbortSignal.timeout(300))).rejects.toBeInstanceOf(RateLimitWaitAborted);
    await Promise.all(seven.map((p) => p.release({ status: 200 })));
    let successes = 7;
    while ((m = await a!.snapshot()).allowanceFactor < 1 && successes < 100) {
      await (await a!.acquire(never())).release({ status: 200 });
      successes += 1;
    }
    expect(m.allowanceFactor).toBe(1);
    expect(successes).toBeGreaterThanOrEqual(30);
    expect(successes).toBeLessThanOrEqual(32);

    // A Retry-After holds every new turn, of every instance, until then.
    const [c, d] = limiters(2, { limits: { requestsPerMinute: 6_000 } });
    await (await c!.acquire(never())).release({ status: 429, retryAfterMs: 1_000 });
    const t0 = performance.now();
    expect((await d!.snapshot()).pausedMs).toBeGreaterThan(800);
    const [p1, p2] = await Promise.all([d!.acquire(never()), c!.acquire(never())]);
    expect(performance.now() - t0).toBeGreaterThan(850);
    await Promise.all([p1!.release({ status: 200 }), p2!.release({ status: 200 })]);
  });

  it('hold callers sleeping until a reserved slot through a Retry-After, then resume at the steady pace, not all at once', async () => {
    const [a, b] = limiters(2, { limits: { requestsPerMinute: 600 } });
    // The burst (10) at once, then 10 more reserve the slots of the next second.
    const burst = await Promise.all(Array.from({ length: 10 }, () => a!.acquire(never())));
    const t0 = performance.now();
    const starts: number[] = [];
    const reserved = Array.from({ length: 10 }, () => b!.acquire(never()).then((p) => {
      starts.push(performance.now() - t0);
      return p;
    }));
    await waitFor('ten reservations', async () => (await b!.snapshot()).waiting === 10, 5_000, 10);
    await burst[0]!.release({ status: 429, retryAfterMs: 1_000 });
    await Promise.all(burst.slice(1).map((p) => p.release({ status: 200 })));
    await Promise.all((await Promise.all(reserved)).map((p) => p.release({ status: 200 })));
    starts.sort((x, y) => x - y);
    console.log(`after a Retry-After of 1 s: reserved callers started at ${starts.map((t) => t.toFixed(0)).join(', ')} ms`);
    expect(starts[0]).toBeGreaterThan(900);
    // At the cut pace (0.7 of 10 a second: one every ~143 ms) with no burst left: 9 intervals.
    expect(starts.at(-1)! - starts[0]!).toBeGreaterThan(9 * 143 * 0.8);
  });

  it('reject an aborted or aborting wait promptly, leaving no slot or reservation taken', async () => {
    const [a, b] = limiters(2, { limits: { maxConcurrent: 1 } });
    const held = await a!.acquire(never());
    const pre = new AbortController();
    pre.abort(new Error('gone'));
    await expect(b!.acquire(pre.signal)).rejects.toMatchObject({ name: 'RateLimitWaitAborted', waitedMs: 0 });
    const t0 = performance.now();
    const err = await b!.acquire(AbortSignal.timeout(200)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RateLimitWaitAborted);
    expect(performance.now() - t0).toBeLessThan(500);
    expect(await b!.snapshot()).toMatchObject({ inFlight: 1, waiting: 0 });
    await held.release({});
    await (await b!.acquire(AbortSignal.timeout(1_000))).release({});
    expect(b!.stats()).toMatchObject({ aborted: 2, granted: 1, waiting: 0, inFlight: 0 });

    // A caller aborted while sleeping until its reserved slot gives the slot back: the next caller gets it.
    const [r1, r2] = limiters(2, { limits: { requestsPerMinute: 60 } });
    const first = await r1!.acquire(never());
    const tFirst = performance.now();
    await first.release({ status: 200 });
    const gaveUp = new AbortController();
    const reserved = r2!.acquire(gaveUp.signal);
    await waitFor('the reservation', async () => (await r2!.snapshot()).waiting === 1, 5_000, 10);
    gaveUp.abort();
    await expect(reserved).rejects.toBeInstanceOf(RateLimitWaitAborted);
    expect(await r2!.snapshot()).toMatchObject({ waiting: 0, inFlight: 0 });
    const next = await r1!.acquire(never());
    expect(performance.now() - tFirst).toBeLessThan(1_500);
    await next.release({ status: 200 });
  });

  it('charge tokens after the answer and hold new turns while the allowance is in debt', async () => {
    const [a, b] = limiters(2, { limits: { tokensPerMinute: 6_000 } });
    // A minute's worth plus 100 tokens (one second's refill): in debt for about a second.
    await (await a!.acquire(never())).release({ status: 200, tokens: 6_100 });
    expect((await b!.snapshot()).tokensLastMinute).toBe(6_100);
    const t0 = performance.now();
    await (await b!.acquire(never())).release({ status: 200, tokens: 10 });
    expect(performance.now() - t0).toBeGreaterThan(800);
    expect((await a!.snapshot()).tokensLastMinute).toBe(6_110);
  });

  it('keep up with the stub limited to the same rate: >= 95% of it, < 2% of 429s once adapted', async () => {
    const rpm = 1_200;
    const stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, rateLimitRpm: rpm, log: silentLog });
    try {
      const ls = limiters(3, { limits: { requestsPerMinute: rpm }, endpoint: stub.baseUrl! });
      const runMs = 14_000;
      const warmMs = 4_000;
      const stop = new AbortController();
      setMaxListeners(50, stop.signal);
      const calls: { at: number; status: number }[] = [];
      const t0 = performance.now();
      setTimeout(() => stop.abort(), runMs);
      await Promise.all(Array.from({ length: 12 }, async (_, i) => {
        const limiter = ls[i % 3]!;
        while (!stop.signal.aborted) {
          let permit: EndpointPermit;
          try {
            permit = await limiter.acquire(stop.signal);
          } catch (err) {
            if (err instanceof RateLimitWaitAborted) return;
            throw err;
          }
          const answer = await chat({ baseUrl: stub.baseUrl! }, { messages: conversation('Solve the task.'), tools: TOOLS }, { 'x-rollout-task': 'fix-greeting', 'x-rollout-episode': `limits-${i}` });
          const retryAfter = answer.headers['retry-after'];
          await permit.release({
            status: answer.status,
            retryAfterMs: typeof retryAfter === 'string' ? Number(retryAfter) * 1000 : undefined,
            tokens: answer.status === 200 ? bodyOf(answer).usage?.total_tokens : undefined,
          });
          calls.push({ at: performance.now() - t0, status: answer.status });
        }
      }));
      const stats = (await request({ baseUrl: stub.baseUrl! }, 'GET', STUB_STATS_PATH)).json as { answered: number; rateLimited: number };
      expect(stats.answered + stats.rateLimited).toBe(calls.length);
      expect(stats.rateLimited).toBe(calls.filter((c) => c.status === 429).length);
      const late = calls.filter((c) => c.at >= warmMs && c.at < runMs);
      const ok = late.filter((c) => c.status === 200).length;
      const limited = late.filter((c) => c.status === 429).length;
      const expected = (rpm / 60_000) * (runMs - warmMs);
      const m = await ls[0]!.snapshot();
      console.log(`stub at ${rpm}/min: after ${warmMs} ms, ${ok} answered of ${expected} allowed (${((100 * ok) / expected).toFixed(1)}%), ${limited} 429s (${((100 * limited) / late.length).toFixed(2)}%); overall ${stats.rateLimited} 429s of ${calls.length}; factor now ${m.allowanceFactor}`);
      expect(late.every((c) => c.status === 200 || c.status === 429)).toBe(true);
      expect(ok).toBeGreaterThanOrEqual(0.95 * expected);
      expect(limited / late.length).toBeLessThan(0.02);
      expect(m.tokensLastMinute).toBeGreaterThan(0);
      expect(m.host).toBe(new URL(stub.baseUrl!).host);
    } finally {
      await stub.close();
    }
  });

  it('show on /metrics from Redis, with keys that all expire, and UNLIMITED when no limit is set', async () => {
    const [a] = limiters(1, { limits: { maxConcurrent: 3 }, endpoint: 'https://key:sk-secret@models.example.com/v1' });
    const held = await a!.acquire(never());
    const [z] = limiters(1, { limits: { requestsPerMinute: 6_000 }, endpoint: 'http://metrics-429.test:8000/v1' });
    await Promise.all([await z!.acquire(never()), await z!.acquire(never())].map((p) => p.release({ status: 429 })));
    const all = await readEndpointLimitMetrics(env.client, env.prefix);
    const id = endpointIdentity('https://models.example.com/v1').id;
    expect(a!.endpointId).toBe(id);
    expect(all.find((m) => m.endpoint === id)).toMatchObject({ host: 'models.example.com', inFlight: 1, waiting: 0, allowanceFactor: 1 });

    const metrics = createFleetMetrics({ queues: [], results: env.results, activeLeases: async () => 0, reapedSandboxes: async () => 0, modelEndpoints: () => readEndpointLimitMetrics(env.client, env.prefix) });
    const text = await metrics.render();
    expect(text).toContain(`rollout_fleet_model_endpoint_in_flight{endpoint="${id}",host="models.example.com"} 1`);
    expect(text).toMatch(/rollout_fleet_model_endpoint_rate_limited_total\{endpoint="[0-9a-f]{12}",host="endpoint-3\.test:8000"\} 5/);
    expect(text).toMatch(/rollout_fleet_model_endpoint_allowance_factor\{endpoint="[0-9a-f]{12}",host="endpoint-3\.test:8000"\} 1/);
    expect(text).not.toMatch(/secret/);
    await held.release({ status: 200 });

    const keys = await env.client.keys(fleetKeyPattern(env.prefix));
    const limitKeys = keys.filter((k) => k.includes(':model-limit'));
    expect(limitKeys.length).toBeGreaterThan(5);
    expect((await Promise.all(limitKeys.map((k) => env.client.pttl(k)))).every((ttl) => ttl > 0)).toBe(true);
    expect(JSON.stringify(await Promise.all(limitKeys.map((k) => env.client.type(k).then(async (t) => (t === 'hash' ? env.client.hgetall(k) : env.client.zrange(k, 0, -1))))))).not.toMatch(/secret/);

    const base = { REDIS_URL: env.redis.url, MODEL_BASE_URL: 'http://127.0.0.1:1/v1' };
    const limiterOf = (vars: Record<string, string>) => {
      const settings = modelSettings(loadConfig(vars), base.MODEL_BASE_URL);
      return endpointLimiter(settings.baseUrl!, settings.limits ?? {}, settings.requestTimeoutMs, { redis: env.client, prefix: env.prefix, log: silentLog });
    };
    expect(limiterOf(base)).toBe(UNLIMITED);
    expect(limiterOf({ ...base, MODEL_REQUESTS_PER_MINUTE: '60' })).not.toBe(UNLIMITED);
  });
});

// The fleet-wide limiter of a model endpoint against an endpoint's own rate limit: the scripted model
// stub limited to N requests a minute (429 + Retry-After beyond it), and `processes` child processes,
// each with its own Redis connection and limiter set to the same N, each running `concurrency` loops of
// "wait for a turn, call the stub over HTTP, report the outcome". Prints the throughput as a share of
// N (overall, and of the turns granted after a warm-up), the 429 share (overall and after the first adaptation, i.e. of the
// calls that started after the first 429 was reported) and the wait for a turn (p50, p99). Figures,
// not pass/fail. The limiter alone; bench/model-rate-limit-fleet.ts drives real workers and their proxies.
// Run: npx tsx bench/model-rate-limit.ts [--rpm 1200] [--limiter-rpm N] [--seconds 20] [--warm-up 5] [--processes 3]
//      [--concurrency 4] [--delay-ms 0]
import { spawn } from 'node:child_process';
import { once, setMaxListeners } from 'node:events';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { RateLimitWaitAborted, type EndpointPermit } from '../src/model/endpoint-limiter.ts';
import { createFleetLimiter, readEndpointLimitMetrics } from '../src/model/fleet-limits.ts';
import { startModelStub } from '../src/model/model-stub.ts';

const { values } = parseArgs({
  options: {
    rpm: { type: 'string', default: '1200' },
    /** The limiter's requests per minute, when not the stub's (e.g. above it, to watch the adaptation). */
    'limiter-rpm': { type: 'string' },
    seconds: { type: 'string', default: '20' },
    'warm-up': { type: 'string', default: '5' },
    processes: { type: 'string', default: '3' },
    concurrency: { type: 'string', default: '4' },
    'delay-ms': { type: 'string', default: '0' },
    // The child's own arguments.
    child: { type: 'string' },
  },
});
const num = (name: keyof typeof values, min = 1) => {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < min) throw new TypeError(`--${name}: expected an integer from ${min} up, got ${JSON.stringify(values[name])}`);
  return n;
};
const rpm = num('rpm');
const limiterRpm = values['limiter-rpm'] === undefined ? rpm : num('limiter-rpm');
const seconds = num('seconds');
const concurrency = num('concurrency');
const silent = pino({ level: 'silent' });

interface Call {
  /** ms since the epoch: asked for a turn, got it, got the answer. */
  asked: number;
  granted: number;
  answered: number;
  status: number;
}
interface ChildArgs {
  redisUrl: string;
  prefix: string;
  baseUrl: string;
  /** ms since the epoch: when the loops start (all children together) and stop. */
  start: number;
  until: number;
}

/** One process: `concurrency` loops until `until`, printing its calls as JSON on stdout. */
async function child(args: ChildArgs): Promise<void> {
  const redis = new Redis(args.redisUrl, { maxRetriesPerRequest: null });
  const limiter = createFleetLimiter({ redis, prefix: args.prefix, endpoint: args.baseUrl, limits: { requestsPerMinute: limiterRpm }, log: silent });
  await new Promise((r) => setTimeout(r, Math.max(0, args.start - Date.now())));
  const stop = new AbortController();
  setMaxListeners(concurrency * 4, stop.signal);
  setTimeout(() => stop.abort(), Math.max(0, args.until - Date.now()));
  const calls: Call[] = [];
  const body = JSON.stringify({ model: 'any', messages: [{ role: 'user', content: 'Solve the task.' }] });
  await Promise.all(Array.from({ length: concurrency }, async (_, i) => {
    while (!stop.signal.aborted) {
      const asked = Date.now();
      let permit: EndpointPermit;
      try {
        permit = await limiter.acquire(stop.signal);
      } catch (err) {
        if (err instanceof RateLimitWaitAborted) return;
        throw err;
      }
      const granted = Date.now();
      const res = await fetch(`${args.baseUrl}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-rollout-task': 'fix-greeting', 'x-rollout-episode': `bench-${process.pid}-${i}` },
        body,
      });
      const json = (await res.json()) as { usage?: { total_tokens?: number } };
      const retryAfter = res.headers.get('retry-after');
      await permit.release({ status: res.status, retryAfterMs: retryAfter === null ? undefined : Number(retryAfter) * 1000, tokens: json.usage?.total_tokens });
      calls.push({ asked, granted, answered: Date.now(), status: res.status });
    }
  }));
  process.stdout.write(JSON.stringify(calls));
  await redis.quit();
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
};
const share = (a: number, b: number) => (b === 0 ? 'n/a' : `${((100 * a) / b).toFixed(1)}%`);

async function main(): Promise<void> {
  const processes = num('processes');
  const warmUpMs = num('warm-up', 0) * 1000;
  const delayMs = num('delay-ms', 0);
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null });
  const tasksDir = fileURLToPath(new URL('../examples/tasks', import.meta.url));
  const stub = await startModelStub({ tasksDir, listen: { port: 0 }, rateLimitRpm: rpm, delayMs, log: silent });
  const prefix = `bench${Date.now().toString(36)}`;
  try {
    // The children start together, a little after all of them are up.
    const start = Date.now() + 3_000;
    const args: ChildArgs = { redisUrl: redis.url, prefix, baseUrl: stub.baseUrl!, start, until: start + seconds * 1000 };
    const self = fileURLToPath(import.meta.url);
    const children = Array.from({ length: processes }, () => {
      const c = spawn(process.execPath, [...process.execArgv, self, '--child', JSON.stringify(args), '--rpm', String(rpm), '--limiter-rpm', String(limiterRpm), '--concurrency', String(concurrency)], {
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      let out = '';
      c.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      return once(c, 'close').then(([code]) => {
        if (code !== 0) throw new Error(`a child exited ${String(code)}`);
        return JSON.parse(out) as Call[];
      });
    });
    const calls = (await Promise.all(children)).flat().sort((a, b) => a.granted - b.granted);
    const t0 = start;
    const end = t0 + seconds * 1000;
    const runMs = Math.max(...calls.map((c) => c.answered)) - t0;
    const ok = calls.filter((c) => c.status === 200);
    const limited = calls.filter((c) => c.status === 429);
    const steady = calls.filter((c) => c.granted >= t0 + warmUpMs && c.granted < end);
    const steadyOk = steady.filter((c) => c.status === 200).length;
    const first429 = limited.length === 0 ? undefined : Math.min(...limited.map((c) => c.answered));
    const adapted = first429 === undefined ? calls : calls.filter((c) => c.asked > first429);
    const waits = calls.map((c) => c.granted - c.asked);
    const [m] = await readEndpointLimitMetrics(client, prefix);
    const perMs = rpm / 60_000;

    console.log(`model endpoint limited to ${rpm}/min (stub), limiter at ${limiterRpm}/min: ${processes} processes x ${concurrency} loops, ${seconds} s${delayMs > 0 ? `, answers after ${delayMs} ms` : ''}`);
    console.log(`calls                             ${calls.length} (${ok.length} answered, ${limited.length} 429, ${calls.length - ok.length - limited.length} other)`);
    console.log(`throughput overall                ${((ok.length / runMs) * 60_000).toFixed(0)}/min = ${share(ok.length, perMs * runMs)} of N (the first second's burst included)`);
    console.log(`throughput after ${warmUpMs / 1000} s warm-up       ${((steadyOk / (seconds * 1000 - warmUpMs)) * 60_000).toFixed(0)}/min = ${share(steadyOk, perMs * (seconds * 1000 - warmUpMs))} of N`);
    console.log(`429 share overall                 ${share(limited.length, calls.length)}`);
    console.log(`429 share after first adaptation  ${share(adapted.filter((c) => c.status === 429).length, adapted.length)} of ${adapted.length} calls${first429 === undefined ? ' (no 429 at all)' : ` started after the first 429 at +${first429 - t0} ms`}`);
    console.log(`wait for a turn                   p50 ${pct(waits, 50).toFixed(0)} ms   p99 ${pct(waits, 99).toFixed(0)} ms   max ${Math.max(...waits)} ms`);
    if (m) console.log(`in Redis now                      factor ${m.allowanceFactor}, 429s ${m.rateLimited}, tokens last minute ${m.tokensLastMinute}, in flight ${m.inFlight}, waiting ${m.waiting}`);
  } finally {
    await stub.close();
    await client.quit();
    await redis.stop();
  }
}

if (values.child !== undefined) await child(JSON.parse(values.child) as ChildArgs);
else await main();

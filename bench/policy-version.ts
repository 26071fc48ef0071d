// How soon a policy version the trainer sets is seen: the time from `set version` to the first model
// call stamped with it, on each of 2 worker processes (their own Redis connections, PolicyStamper and
// model proxies, as in a worker), p50/p99 over the rounds; and how many calls that started after `set`
// returned still carried an older version (the design says none can: each call reads the version in
// Redis at its start). Each worker keeps `--loops` episodes calling the scripted policy server (its
// own process) through their proxies back to back; the trainer (this process) sets a new version every
// 20-50 ms. The same run then measures the calls with stamping off: the ratio is what stamping costs a
// call. A call's start is the moment its proxy stamps it (wall clock, shared by the processes).
// Run: npm run build && npx tsx bench/policy-version.ts [--rounds 200] [--loops 4]
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import pino from 'pino';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy, type ModelProxy } from '../src/model/model-proxy.ts';
import { PolicyStamper, setPolicyVersion, type EpisodePolicy } from '../src/model/policy-versions.ts';

const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));
const TASKS = fileURLToPath(new URL('../examples/tasks', import.meta.url));
const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '200' },
    loops: { type: 'string', default: '4' },
    child: { type: 'string' },
  },
});
const rounds = Number(values.rounds);
const loops = Number(values.loops);
if (!Number.isInteger(rounds) || rounds < 1) throw new TypeError(`--rounds: expected an integer from 1 up, got ${values.rounds}`);
if (!Number.isInteger(loops) || loops < 1) throw new TypeError(`--loops: expected an integer from 1 up, got ${values.loops}`);

const wallNow = () => performance.timeOrigin + performance.now();
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? Number.NaN : s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
};
const BODY = JSON.stringify({ model: 'bench', messages: [{ role: 'system', content: 'You are an agent.' }, { role: 'user', content: 'Fix greet.sh.' }] });

function call(socketPath: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, path: '/v1/chat/completions', method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(BODY) } }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`status ${res.statusCode}`))));
    });
    req.on('error', reject);
    req.end(BODY);
  });
}

interface ChildArgs { redisUrl: string; prefix: string; stubUrl: string; worker: string; stamp: boolean }
interface ChildReport { stamps: Array<[number, number]>; callMs: number[]; stampMs: number[] }

/** A worker: `loops` episodes, each a proxy called back to back until stdin closes; reports every stamp and call time. */
async function child(args: ChildArgs): Promise<void> {
  const log = pino({ level: 'silent' });
  const redis = new Redis(args.redisUrl, { maxRetriesPerRequest: null });
  const stamper = new PolicyStamper(redis, args.prefix, log);
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-pv-'));
  const stamps: Array<[number, number]> = [];
  const callMs: number[] = [];
  const stampMs: number[] = [];
  const proxies: ModelProxy[] = [];
  for (let i = 0; i < loops; i++) {
    const episodeId = `bench.${args.worker}.${i}`;
    const inner = stamper.forEpisode('default', episodeId, undefined);
    // The moment the proxy stamps the call is its start; the version it got is what it carries.
    const policy: EpisodePolicy = {
      endpoint: inner.endpoint,
      stamp: async () => {
        const t = wallNow();
        const s = await inner.stamp();
        stampMs.push(wallNow() - t);
        stamps.push([t, s?.version ?? -1]);
        return s;
      },
    };
    proxies.push(await startModelProxy({
      socketPath: modelSocketPath(dir, `${args.worker}-${i}`), upstreamBaseUrl: args.stubUrl, budget: { maxCalls: 10_000_000, maxTokens: 1e12 },
      evidenceFile: path.join(dir, `${i}`, MODEL_CALLS_FILE), episodeId, taskId: 'fix-greeting', log, ...(args.stamp && { policy }),
    }));
  }
  let stopping = false;
  process.stdin.on('end', () => (stopping = true));
  process.stdin.resume();
  process.stdout.write('ready\n');
  await Promise.all(proxies.map(async (p) => {
    while (!stopping) {
      const t = performance.now();
      await call(p.socketPath);
      callMs.push(performance.now() - t);
    }
  }));
  await Promise.all(proxies.map((p) => p.close()));
  await redis.quit();
  const report: ChildReport = { stamps, callMs, stampMs };
  // A report of some 100 kB to a pipe: written out before the process exits (process.exit would cut it).
  await new Promise<void>((resolve, reject) => process.stdout.write(`${JSON.stringify(report)}\n`, (err) => (err ? reject(err) : resolve())));
}

if (values.child !== undefined) {
  await child(JSON.parse(values.child) as ChildArgs);
  process.exit(0);
}

async function lines(c: ChildProcess): Promise<AsyncIterator<string>> {
  return createInterface({ input: c.stdout! })[Symbol.asyncIterator]();
}

/** Run 2 workers; with `trainer`, set a version every 20-50 ms for `rounds` rounds; their reports, and each round's set times. */
async function phase(redisUrl: string, prefix: string, stubUrl: string, stamp: boolean, trainer: Redis | undefined, from: number) {
  const children = ['w1', 'w2'].map((worker) => spawn(process.execPath, [...process.execArgv, fileURLToPath(import.meta.url), '--loops', String(loops), '--child', JSON.stringify({ redisUrl, prefix, stubUrl, worker, stamp })], { stdio: ['pipe', 'pipe', 'inherit'] }));
  const readers = await Promise.all(children.map(lines));
  for (const r of readers) if ((await r.next()).value !== 'ready') throw new Error('a bench worker did not start');
  const sets: Array<{ version: number; start: number; returned: number }> = [];
  await sleep(300); // warm-up: both workers calling
  for (let i = 0; i < rounds; i++) {
    await sleep(20 + Math.random() * 30);
    if (trainer === undefined) continue;
    const version = from + i;
    const start = wallNow();
    await setPolicyVersion(trainer, prefix, 'default', version);
    sets.push({ version, start, returned: wallNow() });
  }
  await sleep(100);
  for (const c of children) c.stdin!.end();
  const reports = await Promise.all(readers.map(async (r) => JSON.parse((await r.next()).value as string) as ChildReport));
  await Promise.all(children.map((c) => (c.exitCode !== null ? undefined : once(c, 'exit'))));
  return { reports, sets };
}

const redis = await startPrivateRedis();
const stub = spawn(process.execPath, [BIN, 'model-stub', '--port', '0', '--tasks', TASKS], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, LOG_LEVEL: 'warn' } });
try {
  const stubUrl = ((await (await lines(stub)).next()).value as string).trim();
  const prefix = 'bench-pv';
  const trainer = new Redis(redis.url, { maxRetriesPerRequest: null });
  await setPolicyVersion(trainer, prefix, 'default', 0);
  const stamped = await phase(redis.url, prefix, stubUrl, true, trainer, 1);
  const plain = await phase(redis.url, prefix, stubUrl, false, undefined, 0);
  await trainer.quit();

  // Per round and worker: the first call stamped with the round's version (or a later one).
  const fromStart: number[] = [];
  const fromReturn: number[] = [];
  let violations = 0;
  let stampedCalls = 0;
  for (const { stamps } of stamped.reports) {
    stampedCalls += stamps.length;
    for (const s of stamped.sets) {
      const first = stamps.filter(([, v]) => v >= s.version).reduce((m, [t]) => Math.min(m, t), Number.POSITIVE_INFINITY);
      if (Number.isFinite(first)) {
        fromStart.push(first - s.start);
        fromReturn.push(Math.max(0, first - s.returned));
      }
      violations += stamps.filter(([t, v]) => t > s.returned && v < s.version).length;
    }
  }
  const setMs = stamped.sets.map((s) => s.returned - s.start);
  const callStamped = stamped.reports.flatMap((r) => r.callMs);
  const callPlain = plain.reports.flatMap((r) => r.callMs);
  const f = (x: number) => x.toFixed(2);
  const stampMs = stamped.reports.flatMap((r) => r.stampMs);
  console.log(`policy versions: ${rounds} sets, 2 worker processes x ${loops} episodes calling back to back (${stampedCalls} stamped calls); load average ${os.loadavg()[0]!.toFixed(1)} on ${os.availableParallelism()} cores`);
  console.log(`set -> first call stamped with it, per worker: p50 ${f(pct(fromStart, 50))} ms, p99 ${f(pct(fromStart, 99))} ms, max ${f(Math.max(...fromStart))} ms (n ${fromStart.length}; goal p99 < 100 ms)`);
  console.log(`  counted from when set returned:                p50 ${f(pct(fromReturn, 50))} ms, p99 ${f(pct(fromReturn, 99))} ms`);
  console.log(`set itself (one Lua step):                       p50 ${f(pct(setMs, 50))} ms, p99 ${f(pct(setMs, 99))} ms`);
  console.log(`the stamp of one call (one Lua step in Redis): p50 ${f(pct(stampMs, 50))} ms, p99 ${f(pct(stampMs, 99))} ms`);
  console.log(`calls started after set returned with an older version: ${violations}`);
  console.log(`chat call through the proxy, p50: stamped ${f(pct(callStamped, 50))} ms vs unstamped ${f(pct(callPlain, 50))} ms (ratio ${(pct(callStamped, 50) / pct(callPlain, 50)).toFixed(2)}x); p99 ${f(pct(callStamped, 99))} vs ${f(pct(callPlain, 99))} ms (${callStamped.length} vs ${callPlain.length} calls)`);
} finally {
  stub.kill('SIGTERM');
  await redis.stop();
}

// The HTTP API against Redis read directly, in the same run, on a private loopback redis-server. No Docker.
//  1. Delivery latency of the result stream: from an episode's result recorded (the moment
//     ResultsStore.record is called, as a worker calls it) to the event received and parsed by a
//     consumer. This process records synthetic results of one batch (`--episodes` episodes, `--samples`
//     per task, in a shuffled order) at a steady `--rate`; the API (createApiApp with its FleetClient)
//     runs in a child process of its own, as `rollout-fleet api` does, and each consumer in another one:
//     (a) `GET /v1/batches/:id/results` as Server-Sent Events over HTTP; (b) the baseline, a raw Redis
//     reader: XREAD BLOCK on the batch's completion stream and the HGET of each result, parsed. The
//     processes' clocks (timeOrigin + performance.now()) are aligned over IPC before the run (the
//     offsets are printed). The first `--warmup` results are not counted. p50/p90/p99/max of both, the
//     ratio, and whether p99 is under 100 ms. `--other-streams N` keeps N more SSE clients of the same
//     API following other batches that get no results meanwhile (as other trainers would).
//  2. Throughput creating batches: `--batches` batches of 1 task x `--batch-samples` samples (the example
//     tasks, stored once) created with `POST /v1/batches` (JSON over HTTP with keep-alive, to the API's
//     process) and with `FleetClient.enqueue({ name, tasks: [{ digest }], samples, agent })` in this
//     process, at each `--concurrency` (batches in flight), in `--rounds` rounds alternating which goes
//     first; every batch has its own name, so each is new. Nothing runs the episodes (no worker).
// Prints a markdown table for docs/PERFORMANCE.md at the end.
// Run: npx tsx bench/api-stream.ts [--episodes 1000] [--rate 50] [--samples 20] [--warmup 50]
//      [--redis durable|volatile] [--other-streams 0] [--batches 50] [--batch-samples 20]
//      [--concurrency 1,4] [--rounds 5] [--skip-stream] [--skip-create]
import { fork, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import type { EpisodeResult } from '../queues/episodes/contract.ts';
import { createApiApp } from '../src/api/api-server.ts';
import { FleetClient } from '../src/client/fleet-client.ts';
import { startPrivateRedis, type PrivateRedis } from '../src/cli/private-redis.ts';
import { batchCompletionsKey, batchResultsKey } from '../src/redis/redis-keys.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { intOption } from './command-batch.ts';

const SELF = fileURLToPath(import.meta.url);
const TASKS = fileURLToPath(new URL('../examples/tasks', import.meta.url));
const TOKEN = 'bench-api-stream-token-5e1d';
const PREFIX = 'bench';

const { values } = parseArgs({
  options: {
    episodes: { type: 'string', default: '1000' },
    rate: { type: 'string', default: '50' },
    samples: { type: 'string', default: '20' },
    warmup: { type: 'string', default: '50' },
    /** durable: AOF with fsync always, as production should run; volatile: no AOF. */
    redis: { type: 'string', default: 'durable' },
    'other-streams': { type: 'string', default: '0' },
    batches: { type: 'string', default: '50' },
    'batch-samples': { type: 'string', default: '20' },
    concurrency: { type: 'string', default: '1,4' },
    rounds: { type: 'string', default: '5' },
    'skip-stream': { type: 'boolean', default: false },
    'skip-create': { type: 'boolean', default: false },
    // Internal: the role of a child process, and what it needs.
    role: { type: 'string' },
    'redis-url': { type: 'string' },
    url: { type: 'string' },
    batch: { type: 'string' },
    count: { type: 'string' },
  },
});

/** Wall-clock milliseconds with sub-millisecond resolution, comparable across processes once aligned. */
const clock = () => performance.timeOrigin + performance.now();
const silent = pino({ level: 'silent' });

type ToParent =
  | { kind: 'pong'; now: number }
  | { kind: 'listening'; port: number }
  | { kind: 'ready' }
  | { kind: 'done'; received: [string, number][]; events: number }
  | { kind: 'failed'; message: string }
  | { kind: 'stats'; loopP99Ms: number; loopMaxMs: number };
type ToChild = { kind: 'ping' } | { kind: 'stats' } | { kind: 'stop' };

const send = (m: ToParent) => process.send!(m);

/** Every child answers clock pings, and exits when its parent goes away. */
function childBasics(onStop: () => Promise<void> | void = () => process.exit(0)): void {
  process.on('message', (m: ToChild) => {
    if (m.kind === 'ping') send({ kind: 'pong', now: clock() });
    if (m.kind === 'stop') void Promise.resolve(onStop()).finally(() => process.exit(0));
  });
  process.on('disconnect', () => process.exit(0));
}

// ---- child: the API, as `rollout-fleet api` runs it ---------------------------------------------------
async function apiRole(): Promise<void> {
  const client = await FleetClient.connect({ redisUrl: values['redis-url']!, prefix: PREFIX });
  const server = createApiApp({ client, token: TOKEN, log: silent }).listen(0, '127.0.0.1');
  await once(server, 'listening');
  const loop = monitorEventLoopDelay({ resolution: 1 });
  loop.enable();
  childBasics(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    await client.close();
  });
  process.on('message', (m: ToChild) => {
    if (m.kind === 'stats') {
      send({ kind: 'stats', loopP99Ms: loop.percentile(99) / 1e6, loopMaxMs: loop.max / 1e6 });
      loop.reset();
    }
  });
  send({ kind: 'listening', port: (server.address() as AddressInfo).port });
}

// ---- child: a trainer reading the stream as Server-Sent Events ----------------------------------------
function sseRole(): void {
  childBasics();
  const received: [string, number][] = [];
  let events = 0;
  let finished = false;
  const req = http.get(values.url!, { headers: { accept: 'text/event-stream', authorization: `Bearer ${TOKEN}` } }, (res) => {
    if (res.statusCode !== 200) {
      send({ kind: 'failed', message: `SSE: status ${res.statusCode}` });
      return;
    }
    send({ kind: 'ready' });
    let buffer = '';
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      buffer += chunk;
      let end: number;
      while ((end = buffer.indexOf('\n\n')) !== -1) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        events += 1;
        let event = '';
        let data = '';
        for (const line of block.split('\n')) {
          if (line.startsWith('event: ')) event = line.slice(7);
          else if (line.startsWith('data: ')) data = line.slice(6);
        }
        if (event === 'result') {
          const { result } = JSON.parse(data) as { result: EpisodeResult };
          received.push([result.episodeId, clock()]);
        } else if (event === 'end') {
          finished = true;
          send({ kind: 'done', received, events });
        }
      }
    });
    res.on('end', () => finished || send({ kind: 'failed', message: `SSE ended after ${events} events without an end event` }));
  });
  req.on('error', (err) => send({ kind: 'failed', message: `SSE: ${err.message}` }));
}

// ---- child: the baseline, a raw Redis reader of the same stream -------------------------------------
async function rawRole(): Promise<void> {
  childBasics();
  const redis = new Redis(values['redis-url']!, { maxRetriesPerRequest: null });
  await redis.ping();
  const batchId = values.batch!;
  const streamKey = batchCompletionsKey(PREFIX, batchId);
  const resultsKey = batchResultsKey(PREFIX, batchId);
  const want = Number(values.count);
  const received: [string, number][] = [];
  send({ kind: 'ready' });
  let cursor = '0';
  while (received.length < want) {
    const reply = (await redis.xread('COUNT', 500, 'BLOCK', 1_000, 'STREAMS', streamKey, cursor)) as [string, [string, string[]][]][] | null;
    for (const [id, fields] of reply?.[0]?.[1] ?? []) {
      cursor = id;
      const episodeId = fields[fields.indexOf('episodeId') + 1]!;
      const result = JSON.parse((await redis.hget(resultsKey, episodeId))!) as EpisodeResult;
      received.push([result.episodeId, clock()]);
    }
  }
  send({ kind: 'done', received, events: received.length });
  await redis.quit();
}

if (values.role !== undefined) {
  if (values.role === 'api') await apiRole();
  else if (values.role === 'sse') sseRole();
  else if (values.role === 'raw') await rawRole();
  else throw new TypeError(`--role: unknown ${values.role}`);
} else {
  await main();
}

// ---- the bench ------------------------------------------------------------------------------------
async function main(): Promise<void> {
  const num = (name: keyof typeof values & string, min = 1) => intOption(values, name, min);
  const episodes = num('episodes');
  const rate = num('rate');
  const samples = num('samples');
  const warmup = num('warmup', 0);
  const otherStreams = num('other-streams', 0);
  const batches = num('batches');
  const batchSamples = num('batch-samples');
  const rounds = num('rounds');
  const concurrencies = values.concurrency!.split(',').map((c) => Number(c));
  if (concurrencies.some((c) => !Number.isInteger(c) || c < 1)) throw new TypeError(`--concurrency: expected integers from 1 up, separated by commas, got ${JSON.stringify(values.concurrency)}`);
  if (values.redis !== 'durable' && values.redis !== 'volatile') throw new TypeError(`--redis: expected durable or volatile, got ${JSON.stringify(values.redis)}`);
  if (warmup >= episodes) throw new TypeError(`--warmup: expected fewer than --episodes (${episodes}), got ${warmup}`);
  const durable = values.redis === 'durable';

  const pct = (xs: number[], p: number) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
  };
  const ms = (x: number) => (x < 10 ? `${x.toFixed(2)} ms` : `${x.toFixed(1)} ms`);
  const out = (s = '') => process.stdout.write(`${s}\n`);

  // ---- set-up and clean-up (also on Ctrl-C) ---------------------------------------------------------
  const children: ChildProcess[] = [];
  const sockets: http.ClientRequest[] = [];
  let redis: PrivateRedis | undefined;
  let conn: Redis | undefined;
  let client: FleetClient | undefined;
  let dataDir: string | undefined;
  let cleaned: Promise<void> | undefined;
  const cleanup = () => (cleaned ??= (async () => {
    for (const s of sockets) s.destroy();
    await Promise.all(children.map(async (c) => {
      if (c.exitCode !== null || c.signalCode !== null) return;
      const exited = once(c, 'exit');
      if (c.connected) c.send({ kind: 'stop' } satisfies ToChild);
      const timer = setTimeout(() => c.kill('SIGKILL'), 3_000);
      await exited;
      clearTimeout(timer);
    }));
    await client?.close().catch(() => undefined);
    await conn?.quit().catch(() => conn?.disconnect());
    await redis?.stop();
    if (dataDir !== undefined) await rm(dataDir, { recursive: true, force: true });
  })());
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => void cleanup().finally(() => process.exit(130)));
  }

  /** A child process of this script in a role; its messages go to `onMessage` as well as `next`. */
  const spawnRole = (role: string, args: string[]) => {
    const child = fork(SELF, ['--role', role, ...args], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    children.push(child);
    const waiting: ((m: ToParent) => boolean)[] = [];
    child.on('message', (m: ToParent) => {
      const i = waiting.findIndex((w) => w(m));
      if (i !== -1) waiting.splice(i, 1);
    });
    /** The next message of `kind` (a 'failed' one, or the child's exit, rejects). */
    const next = <K extends ToParent['kind']>(kind: K, timeoutMs = 30_000) => new Promise<Extract<ToParent, { kind: K }>>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${role}: no ${kind} within ${timeoutMs} ms`)), timeoutMs);
      const onExit = (code: number | null) => reject(new Error(`${role}: exited (${code}) before ${kind}`));
      child.once('exit', onExit);
      waiting.push((m) => {
        if (m.kind !== kind && m.kind !== 'failed') return false;
        clearTimeout(timer);
        child.off('exit', onExit);
        if (m.kind === 'failed') reject(new Error(`${role}: ${m.message}`));
        else resolve(m as Extract<ToParent, { kind: K }>);
        return true;
      });
    });
    /** The child's clock minus this one's, from the ping with the shortest round trip of 20. */
    const offset = async () => {
      let best = { rtt: Infinity, offset: 0 };
      for (let i = 0; i < 20; i++) {
        const t0 = clock();
        child.send({ kind: 'ping' } satisfies ToChild);
        const { now } = await next('pong');
        const t1 = clock();
        if (t1 - t0 < best.rtt) best = { rtt: t1 - t0, offset: now - (t0 + t1) / 2 };
      }
      return best;
    };
    return { child, next, offset };
  };

  try {
    redis = await startPrivateRedis({ durable });
    conn = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench-producer' });
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-api-'));
    const redisVersion = /redis_version:(\S+)/.exec(await conn.info('server'))?.[1] ?? '?';
    const machine = `${os.cpus().length} cores (${os.cpus()[0]?.model.trim() ?? '?'}), Node ${process.version}, Redis ${redisVersion} ${durable ? 'with AOF fsync always' : 'without AOF'}`;
    out(`${machine}; load average ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}`);

    const api = spawnRole('api', ['--redis-url', redis.url]);
    const { port } = await api.next('listening');
    const base = `http://127.0.0.1:${port}`;
    const table: string[] = [];

    // ---- 1. delivery latency ---------------------------------------------------------------------------
    if (!values['skip-stream']) {
      const store = new ResultsStore(conn, PREFIX, dataDir);
      const batchId = 'api-stream-bench';
      const tasks = Math.ceil(episodes / samples);
      const ids = Array.from({ length: episodes }, (_, i) => `${batchId}.task-${String(Math.floor(i / samples)).padStart(4, '0')}.${i % samples}`);
      await store.putManifest({ batchId, name: 'api-stream-bench', createdAt: new Date().toISOString(), episodeIds: ids });
      // Results finish in no particular order: a seeded shuffle, the same every run.
      let seed = 42;
      const random = () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31);
      const order = [...ids];
      for (let i = order.length - 1; i > 0; i--) {
        const j = Math.floor(random() * (i + 1));
        [order[i], order[j]] = [order[j]!, order[i]!];
      }
      // Other trainers following batches of their own through the same API, which get no results now.
      for (let k = 0; k < otherStreams; k++) {
        const other = `api-stream-idle-${k}`;
        await store.putManifest({ batchId: other, name: other, createdAt: new Date().toISOString(), episodeIds: [`${other}.task.0`] });
        const req = http.get(`${base}/v1/batches/${other}/results`, { headers: { accept: 'text/event-stream', authorization: `Bearer ${TOKEN}` } }, (res) => res.resume());
        req.on('error', () => undefined);
        sockets.push(req);
      }
      const sse = spawnRole('sse', ['--url', `${base}/v1/batches/${batchId}/results`]);
      const raw = spawnRole('raw', ['--redis-url', redis.url, '--batch', batchId, '--count', String(episodes)]);
      await Promise.all([sse.next('ready'), raw.next('ready')]);
      const sseClock = await sse.offset();
      const rawClock = await raw.offset();
      const apiClock = await api.offset();
      api.child.send({ kind: 'stats' } satisfies ToChild);
      await api.next('stats'); // resets the API's event-loop histogram

      const seconds = episodes / rate;
      out(`\n1. delivery latency: ${episodes} results of one batch (${tasks} tasks x ${samples} samples, shuffled) recorded at ${rate}/s (${seconds.toFixed(0)} s), the first ${warmup} not counted; ${otherStreams} other SSE stream(s) open on the API`);
      out(`   clock offsets (child - this, from the fastest of 20 IPC pings): SSE reader ${sseClock.offset.toFixed(3)} ms (rtt ${sseClock.rtt.toFixed(3)}), raw reader ${rawClock.offset.toFixed(3)} ms (rtt ${rawClock.rtt.toFixed(3)}), API ${apiClock.offset.toFixed(3)} ms`);
      const sseDone = sse.next('done', (seconds + 60) * 1_000);
      const rawDone = raw.next('done', (seconds + 60) * 1_000);
      const recordedAt = new Map<string, number>();
      const recordCallMs: number[] = [];
      const records: Promise<void>[] = [];
      const startedAt = new Date().toISOString();
      const t0 = performance.now() + 50;
      for (let i = 0; i < episodes; i++) {
        const wait = t0 + (i * 1000) / rate - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        const episodeId = order[i]!;
        const passed = i % 3 !== 0;
        const result: EpisodeResult = {
          episodeId, batchId, taskId: episodeId.split('.')[1]!, sample: Number(episodeId.split('.')[2]),
          status: passed ? 'passed' : 'failed', reward: passed ? 1 : 0, attempts: 1, workerId: 'bench-producer',
          timings: { setupMs: 800, agentMs: 5_000, verifyMs: 300, closeMs: 200, totalMs: 6_300 },
          provenance: { taskDigest: '0'.repeat(64), image: 'busybox:1.36', agent: { kind: 'command', command: 'true' } },
          agent: { exitCode: 0, timedOut: false, durationMs: 5_000 },
          verifier: { exitCode: passed ? 0 : 1, timedOut: false, durationMs: 300 },
          startedAt, endedAt: new Date().toISOString(),
        };
        const at = clock();
        recordedAt.set(episodeId, at);
        // Not awaited: a slow record does not shift the schedule (workers record independently).
        records.push(store.record(result).then((first) => {
          if (!first) throw new Error(`${episodeId}: recorded twice`);
          recordCallMs.push(clock() - at);
        }));
      }
      await Promise.all(records);
      const [sseOut, rawOut] = await Promise.all([sseDone, rawDone]);
      api.child.send({ kind: 'stats' } satisfies ToChild);
      const apiLoop = await api.next('stats');
      for (const s of sockets.splice(0)) s.destroy();

      const counted = new Set(order.slice(warmup));
      const latencies = (received: [string, number][], offset: number) => {
        const seen = new Set<string>();
        const xs: number[] = [];
        for (const [id, at] of received) {
          if (seen.has(id)) throw new Error(`${id}: received twice`);
          seen.add(id);
          if (counted.has(id)) xs.push(at - offset - recordedAt.get(id)!);
        }
        if (seen.size !== episodes) throw new Error(`received ${seen.size} of ${episodes} results`);
        return xs;
      };
      const viaSse = latencies(sseOut.received, sseClock.offset);
      const viaRaw = latencies(rawOut.received, rawClock.offset);
      const row = (label: string, xs: number[]) => out(`   ${label.padEnd(36)} p50 ${ms(pct(xs, 50)).padStart(9)}   p90 ${ms(pct(xs, 90)).padStart(9)}   p99 ${ms(pct(xs, 99)).padStart(9)}   max ${ms(Math.max(...xs)).padStart(9)}   n=${xs.length}`);
      row('baseline: raw XREAD BLOCK + HGET', viaRaw);
      row('API: SSE over HTTP', viaSse);
      const ratio = (p: number) => pct(viaSse, p) / pct(viaRaw, p);
      out(`   ratio API / raw: p50 ${ratio(50).toFixed(2)}x, p90 ${ratio(90).toFixed(2)}x, p99 ${ratio(99).toFixed(2)}x; added at p50 ${ms(pct(viaSse, 50) - pct(viaRaw, 50))}, at p99 ${ms(pct(viaSse, 99) - pct(viaRaw, 99))}`);
      out(`   record() call (EVAL, result file, summary check) p50 ${ms(pct(recordCallMs, 50))}, p99 ${ms(pct(recordCallMs, 99))}; API event-loop delay p99 ${ms(apiLoop.loopP99Ms)}, max ${ms(apiLoop.loopMaxMs)}; SSE events ${sseOut.events} (results, ${tasks} groups, end)`);
      const goal = pct(viaSse, 99) < 100;
      out(`   goal p99 under 100 ms at ${rate} results/s: ${goal ? 'met' : 'NOT met'} (${ms(pct(viaSse, 99))})`);
      const cells = (xs: number[]) => [50, 90, 99].map((p) => ms(pct(xs, p))).concat(ms(Math.max(...xs)));
      table.push(
        `| delivery at ${rate}/s, recorded to received (n=${viaSse.length}${otherStreams > 0 ? `, ${otherStreams} other streams open` : ''}) | p50 | p90 | p99 | max |`,
        '|---|---|---|---|---|',
        `| baseline: raw Redis (XREAD BLOCK + HGET) | ${cells(viaRaw).join(' | ')} |`,
        `| API: SSE over HTTP | ${cells(viaSse).join(' | ')} |`,
        `| **ratio API / raw** | ${ratio(50).toFixed(2)}x | ${ratio(90).toFixed(2)}x | **${ratio(99).toFixed(2)}x** | |`,
        `| goal: API p99 under 100 ms | | | **${goal ? 'met' : 'not met'}** | |`,
        '',
      );
    }

    // ---- 2. throughput creating batches ---------------------------------------------------------------
    if (!values['skip-create']) {
      client = await FleetClient.connect({ redisUrl: redis.url, prefix: PREFIX, dataDir });
      const digests: string[] = [];
      for (const name of ['fix-greeting', 'js-median', 'reverse-lines', 'set-port', 'sum-column']) digests.push((await client.uploadTask(path.join(TASKS, name))).digest);
      const agent = { kind: 'command' as const, command: 'true' };
      const agentHttp = new http.Agent({ keepAlive: true, maxSockets: Math.max(...concurrencies) });
      let serial = 0;
      type Variant = 'api' | 'enqueue';
      /** Create one new batch; returns its milliseconds. */
      const create = async (variant: Variant): Promise<number> => {
        const n = serial++;
        const name = `${variant}-${n}`;
        const digest = digests[n % digests.length]!;
        const t = performance.now();
        if (variant === 'enqueue') {
          const plan = await client!.enqueue({ name, tasks: [{ digest }], samples: batchSamples, agent });
          if (!plan.added || plan.jobs.length !== batchSamples) throw new Error(`enqueue ${name}: added ${plan.added}, ${plan.jobs.length} jobs`);
        } else {
          const body = JSON.stringify({ name, tasks: [digest], samples: batchSamples, agent });
          const { status, text } = await new Promise<{ status: number; text: string }>((resolve, reject) => {
            const req = http.request(`${base}/v1/batches`, { method: 'POST', agent: agentHttp, headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
              let text = '';
              res.setEncoding('utf8');
              res.on('data', (c: string) => (text += c));
              res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
            });
            req.on('error', reject);
            req.end(body);
          });
          if (status !== 201 || (JSON.parse(text) as { episodes: number }).episodes !== batchSamples) throw new Error(`POST /v1/batches ${name}: ${status} ${text.slice(0, 300)}`);
        }
        return performance.now() - t;
      };
      /** `n` batches, `concurrency` in flight; wall milliseconds. */
      const segment = async (variant: Variant, n: number, concurrency: number, times: number[]) => {
        let left = n;
        const t = performance.now();
        await Promise.all(Array.from({ length: concurrency }, async () => {
          while (left > 0) {
            left -= 1;
            times.push(await create(variant));
          }
        }));
        return performance.now() - t;
      };
      // Warm-up (not counted): JIT, connections, the API's first requests.
      for (const v of ['api', 'enqueue'] as const) await segment(v, 5, 1, []);
      const perRound = Math.ceil(batches / rounds);
      out(`\n2. creating batches: ${perRound * rounds} batches each way of 1 task x ${batchSamples} samples (the example tasks, stored once), ${rounds} rounds alternating which goes first; no worker runs`);
      const rate2 = (n: number, wallMs: number) => (n * 1000) / wallMs;
      table.push(
        `| creating batches of 1 task x ${batchSamples} samples (${perRound * rounds} each way) | baseline: \`enqueue\` (TS client) | API: \`POST /v1/batches\` | ratio API / enqueue |`,
        '|---|---|---|---|',
      );
      for (const concurrency of concurrencies) {
        const wall = { api: 0, enqueue: 0 };
        const times = { api: [] as number[], enqueue: [] as number[] };
        for (let r = 0; r < rounds; r++) {
          const first: Variant[] = r % 2 === 0 ? ['enqueue', 'api'] : ['api', 'enqueue'];
          for (const v of first) wall[v] += await segment(v, perRound, concurrency, times[v]);
        }
        const n = perRound * rounds;
        const b = { api: rate2(n, wall.api), enqueue: rate2(n, wall.enqueue) };
        const f = (v: Variant) => `${b[v].toFixed(1).padStart(6)} batches/s ${(b[v] * batchSamples).toFixed(0).padStart(5)} episodes/s   per batch p50 ${ms(pct(times[v], 50)).padStart(9)} p99 ${ms(pct(times[v], 99)).padStart(9)}`;
        out(`   concurrency ${concurrency}:`);
        out(`     baseline: enqueue (TS client)   ${f('enqueue')}`);
        out(`     API: POST /v1/batches           ${f('api')}`);
        out(`     ratio API / enqueue: ${(b.api / b.enqueue).toFixed(2)}x the throughput; per batch p50 ${(pct(times.api, 50) / pct(times.enqueue, 50)).toFixed(2)}x the time`);
        const cell = (v: Variant) => `${b[v].toFixed(1)} batches/s (${(b[v] * batchSamples).toFixed(0)} episodes/s), p50 ${ms(pct(times[v], 50))}`;
        table.push(`| ${concurrency} in flight | ${cell('enqueue')} | ${cell('api')} | ${(b.api / b.enqueue).toFixed(2)}x |`);
      }
      agentHttp.destroy();
      table.push('');
    }

    out(`\nfor docs/PERFORMANCE.md (${new Date().toISOString().slice(0, 10)}, ${machine}, load average ${os.loadavg().map((l) => l.toFixed(1)).join(' ')} at the end):\n`);
    out(table.join('\n'));
  } finally {
    await cleanup();
  }
}

// The fleet at the scale of 100,000 episodes, each figure against a baseline in the same run, on a
// private loopback redis-server (no Docker, except for --rss):
//  1. Enqueue: `--episodes` episodes (100,000) as one batch (`--tasks` small command-agent tasks x
//     episodes/tasks samples) and as `--batches` batches (100 of 1,000: one task each), through
//     `FleetClient.enqueue(<batch file>)` (load, pack, plan, store, add), against raw BullMQ
//     `Queue.addBulk` of the same job payloads (built with `planBatch` beforehand, so the baseline times
//     the Redis writes only) with the same job options. Each run is a process of its own (so its peak
//     RSS is its own) on an emptied Redis; `--rounds` alternate which goes first; medians. Prints the
//     time, episodes/s, the ratio to addBulk (goal: at most 2x) and each process's peak RSS.
//  2. Redis memory: used_memory (INFO memory) after each enqueue minus before, per episode job, with
//     MEMORY USAGE of one job's hash; then `--episodes` synthetic results of one batch recorded with
//     `ResultsStore.record` (as workers record them, 32 at a time), per result, with MEMORY USAGE of
//     the batch's result keys.
//  3. Reading that batch of `--episodes` results, each a whole process timed from spawn to its last
//     byte, `--reads` times in alternating order, medians: the baseline (a node process that HGETALLs
//     the results hash and JSON.parses every result), `rollout-fleet status <batch>` computed (the
//     summary an earlier reader kept is deleted first, as any change of the results makes it stale)
//     and as it runs on an unchanged batch (goal: under 1 s), `rollout-fleet status --json`,
//     `rollout-fleet results <batch>` (JSON lines) and the dashboard's batch page (`rollout-fleet
//     dashboard` with Basic auth, GET /batches/<id> to the last byte).
//  4. `--rss` (Docker; several minutes): one `rollout-fleet worker --concurrency 4` runs
//     `--rss-episodes` (1,000) trivial command-agent episodes; its VmRSS (/proc/<pid>/status) is sampled
//     as results come in; the mean over the first 100 episodes against the mean over the last 100
//     (goal: within 10%), and the mean per tenth of the episodes.
// Prints a markdown table for docs/PERFORMANCE.md at the end.
// Run: npm run build && npx tsx bench/scale.ts [--episodes 100000] [--tasks 100] [--batches 100]
//      [--rounds 1] [--reads 5] [--redis volatile|durable] [--data-dir /dev/shm] [--skip-enqueue]
//      [--skip-read] [--rss] [--rss-episodes 1000] [--rss-concurrency 4]
import { fork, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { CLEANUP_QUEUE } from '../queues/cleanup/contract.ts';
import { EPISODES_QUEUE, episodeJobOptions, type EpisodeResult } from '../queues/episodes/contract.ts';
import { FleetClient } from '../src/client/fleet-client.ts';
import { freePort, startPrivateRedis, type PrivateRedis } from '../src/cli/private-redis.ts';
import type { FailureKind } from '../src/errors/failure-kind.ts';
import { planBatch } from '../src/producer/enqueue-batch.ts';
import { batchCompletionsKey, batchResultsKey, batchSummaryCacheKey, bullmqJobKey } from '../src/redis/redis-keys.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { LABEL } from '../src/sandbox/labels.ts';
import { loadBatch } from '../src/tasks/load-task.ts';
import { intOption, poll, writeCommandBatch } from './command-batch.ts';

const SELF = fileURLToPath(import.meta.url);
const ROOT = fileURLToPath(new URL('..', import.meta.url));
/** The compiled CLI (`npm run build`), as people and workers run it. */
const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));
const PREFIX = 'bench';
const DASH_USER = 'bench';
const DASH_PASSWORD = 'bench-scale-5c2e';

const { values } = parseArgs({
  options: {
    episodes: { type: 'string', default: '100000' },
    tasks: { type: 'string', default: '100' },
    batches: { type: 'string', default: '100' },
    rounds: { type: 'string', default: '1' },
    reads: { type: 'string', default: '5' },
    /** durable: AOF with fsync always, as production should run; volatile: no AOF. */
    redis: { type: 'string', default: 'volatile' },
    /** Where record() writes its result files (one per result): tmpfs keeps 100,000 fsyncs short. */
    'data-dir': { type: 'string' },
    'skip-enqueue': { type: 'boolean', default: false },
    'skip-read': { type: 'boolean', default: false },
    rss: { type: 'boolean', default: false },
    'rss-episodes': { type: 'string', default: '1000' },
    'rss-concurrency': { type: 'string', default: '4' },
    // Internal: a child process enqueueing (see enqueueRole).
    role: { type: 'string' },
    variant: { type: 'string' },
    'redis-url': { type: 'string' },
    files: { type: 'string' },
  },
});

type Variant = 'raw' | 'fleet';
interface EnqueueReport {
  ms: number;
  episodes: number;
  /** KiB, from getrusage: the whole process's peak. */
  peakRssKb: number;
  /** KiB, RSS when the timed part began. */
  startRssKb: number;
  sampleEpisodeId: string;
}

// ---- child: one enqueue run --------------------------------------------------------------------------
async function enqueueRole(): Promise<void> {
  const variant = values.variant as Variant;
  const files = values.files!.split(',');
  const redisUrl = values['redis-url']!;
  let report: EnqueueReport;
  if (variant === 'raw') {
    // The same payloads and options as the fleet's, built before the clock starts.
    const payloads = [];
    for (const file of files) {
      const plan = await planBatch(await loadBatch(file));
      payloads.push(plan.jobs.map((data) => ({ name: data.task.id, data, opts: { ...episodeJobOptions, jobId: data.episodeId } })));
    }
    const conn = new Redis(redisUrl, { maxRetriesPerRequest: null });
    const queue = new Queue(EPISODES_QUEUE, { connection: conn, prefix: PREFIX });
    await queue.waitUntilReady();
    const startRssKb = process.memoryUsage().rss / 1024;
    const t = performance.now();
    for (const jobs of payloads) await queue.addBulk(jobs);
    const ms = performance.now() - t;
    report = { ms, episodes: payloads.reduce((n, p) => n + p.length, 0), peakRssKb: process.resourceUsage().maxRSS, startRssKb, sampleEpisodeId: payloads[0]![0]!.data.episodeId };
    await queue.close();
    await conn.quit();
  } else {
    const client = await FleetClient.connect({ redisUrl, prefix: PREFIX, dataDir: os.tmpdir() });
    const startRssKb = process.memoryUsage().rss / 1024;
    const t = performance.now();
    let episodes = 0;
    let sampleEpisodeId = '';
    for (const file of files) {
      const plan = await client.enqueue(file);
      if (!plan.added) throw new Error(`${file}: not added (enqueued before?)`);
      episodes += plan.jobs.length;
      sampleEpisodeId ||= plan.jobs[0]!.episodeId;
    }
    const ms = performance.now() - t;
    report = { ms, episodes, peakRssKb: process.resourceUsage().maxRSS, startRssKb, sampleEpisodeId };
    await client.close();
  }
  await new Promise<void>((resolve, reject) => process.send!(report, undefined, {}, (err) => (err ? reject(err) : resolve())));
}

if (values.role === 'enqueue') {
  await enqueueRole();
  process.exit(0);
} else if (values.role !== undefined) {
  throw new TypeError(`--role: unknown ${values.role}`);
} else {
  await main();
}

// ---- the bench ------------------------------------------------------------------------------------
async function main(): Promise<void> {
  const num = (name: keyof typeof values & string, min = 1) => intOption(values, name, min);
  const episodes = num('episodes');
  const tasks = num('tasks');
  const batches = num('batches');
  const rounds = num('rounds');
  const reads = num('reads');
  const rssEpisodes = num('rss-episodes', 200);
  const rssConcurrency = num('rss-concurrency');
  if (episodes % tasks !== 0 || episodes / tasks > 10_000) throw new TypeError(`--tasks: expected a divisor of --episodes (${episodes}) giving at most 10,000 samples per task, got ${tasks}`);
  if (episodes % batches !== 0 || episodes / batches > 10_000) throw new TypeError(`--batches: expected a divisor of --episodes (${episodes}) giving at most 10,000 episodes per batch, got ${batches}`);
  if (values.redis !== 'durable' && values.redis !== 'volatile') throw new TypeError(`--redis: expected durable or volatile, got ${JSON.stringify(values.redis)}`);
  const durable = values.redis === 'durable';
  if (!existsSync(BIN)) throw new Error(`${BIN}: missing; run npm run build first`);

  const out = (s = '') => process.stdout.write(`${s}\n`);
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
  };
  const fmtMs = (ms: number) => (ms < 1000 ? `${ms.toFixed(0)} ms` : `${(ms / 1000).toFixed(2)} s`);
  const mb = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;
  const int = (n: number) => Math.round(n).toLocaleString('en-US');
  const load = () => os.loadavg().map((l) => l.toFixed(1)).join(' ');

  // ---- set-up and clean-up (also on Ctrl-C) ---------------------------------------------------------
  const children = new Set<ChildProcess>();
  let redis: PrivateRedis | undefined;
  let conn: Redis | undefined;
  let scratch: string | undefined;
  let dataDir: string | undefined;
  let cleaned: Promise<void> | undefined;
  const cleanup = () => (cleaned ??= (async () => {
    await Promise.all([...children].map(async (c) => {
      if (c.exitCode !== null || c.signalCode !== null) return;
      const exited = once(c, 'exit');
      c.kill('SIGTERM');
      const timer = setTimeout(() => c.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    }));
    await conn?.quit().catch(() => conn?.disconnect());
    await redis?.stop();
    for (const dir of [scratch, dataDir]) if (dir !== undefined) await rm(dir, { recursive: true, force: true });
  })());
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => void cleanup().finally(() => process.exit(130)));
  }
  const track = (child: ChildProcess) => {
    children.add(child);
    child.once('exit', () => children.delete(child));
    return child;
  };

  const table: string[] = [];
  try {
    redis = await startPrivateRedis({ durable });
    conn = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench-scale' });
    const env = { ...process.env, REDIS_URL: redis.url, FLEET_PREFIX: PREFIX, LOG_LEVEL: 'warn' };
    scratch = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-scale-'));
    const shm = existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir();
    dataDir = await mkdtemp(path.join(values['data-dir'] ?? shm, 'rf-bench-scale-data-'));
    const redisVersion = /redis_version:(\S+)/.exec(await conn.info('server'))?.[1] ?? '?';
    const machine = `${os.cpus().length} cores (${os.cpus()[0]?.model.trim() ?? '?'}), Node ${process.version}, Redis ${redisVersion} ${durable ? 'with AOF fsync always' : 'without AOF'}`;
    out(`${machine}; load average ${load()}`);
    const usedMemory = async () => Number(/used_memory:(\d+)/.exec(await conn!.info('memory'))![1]);
    const emptyRedis = async () => {
      await conn!.flushall();
      return usedMemory();
    };

    // ---- 1. enqueue -------------------------------------------------------------------------------------
    if (!values['skip-enqueue']) {
      // `tasks` small task folders (the throughput bench's task, one id each), one batch of all of them,
      // and `batches` batches of one task each.
      const taskDirs: string[] = [];
      for (let i = 0; i < tasks; i++) {
        const id = `t${String(i).padStart(3, '0')}`;
        const dir = path.join(scratch, 'tasks', id);
        await mkdir(path.join(dir, 'workspace'), { recursive: true });
        await mkdir(path.join(dir, 'tests'), { recursive: true });
        await writeFile(path.join(dir, 'workspace', 'state.txt'), 'broken\n');
        await writeFile(path.join(dir, 'tests', 'test.sh'), 'grep -qx fixed state.txt\n');
        await writeFile(path.join(dir, 'task.yaml'), `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: sh /tests/test.sh\n  timeoutSec: 20\ndeadlineSec: 300\n`);
        taskDirs.push(dir);
      }
      const agent = 'agent: { kind: command, command: "echo fixed > state.txt" }\n';
      const oneFile = path.join(scratch, 'scale-one.yaml');
      await writeFile(oneFile, `name: scale-one\ntasks: [tasks]\nsamples: ${episodes / tasks}\n${agent}`);
      const manyFiles: string[] = [];
      for (let b = 0; b < batches; b++) {
        const file = path.join(scratch, `scale-many-${String(b).padStart(3, '0')}.yaml`);
        await writeFile(file, `name: scale-many-${String(b).padStart(3, '0')}\ntasks: [${JSON.stringify(path.relative(scratch, taskDirs[b % tasks]!))}]\nsamples: ${episodes / batches}\n${agent}`);
        manyFiles.push(file);
      }
      const layouts = [
        { key: 'one', label: `1 batch of ${int(episodes)} (${tasks} tasks x ${int(episodes / tasks)})`, files: [oneFile] },
        { key: 'many', label: `${batches} batches of ${int(episodes / batches)} (1 task each)`, files: manyFiles },
      ] as const;

      const runEnqueue = async (variant: Variant, files: readonly string[]) => {
        const before = await emptyRedis();
        const child = track(fork(SELF, ['--role', 'enqueue', '--variant', variant, '--redis-url', redis!.url, '--files', files.join(',')], {
          stdio: ['ignore', 'inherit', 'inherit', 'ipc'], execArgv: [...process.execArgv],
        }));
        const [report] = await Promise.race([
          once(child, 'message') as Promise<[EnqueueReport]>,
          once(child, 'exit').then(([code]) => Promise.reject(new Error(`enqueue ${variant}: exited (${code}) without a report`))),
        ]);
        if (child.exitCode === null) await once(child, 'exit');
        if (report.episodes !== episodes) throw new Error(`enqueue ${variant}: ${report.episodes} episodes, expected ${episodes}`);
        const waiting = await conn!.llen(`${PREFIX}:${EPISODES_QUEUE}:wait`);
        if (waiting !== episodes) throw new Error(`enqueue ${variant}: ${waiting} jobs waiting, expected ${episodes}`);
        const bytes = (await usedMemory()) - before;
        const jobHash = (await conn!.call('MEMORY', 'USAGE', bullmqJobKey(PREFIX, EPISODES_QUEUE, report.sampleEpisodeId), 'SAMPLES', '0')) ?? 0;
        return { ...report, redisBytes: bytes, jobHashBytes: Number(jobHash) };
      };

      out(`\n1. enqueue ${int(episodes)} episodes, FleetClient.enqueue(batch file) against raw Queue.addBulk of the same payloads; ${rounds} round(s), each run a process of its own on an emptied Redis; medians`);
      table.push(
        `| enqueue ${int(episodes)} episodes (median of ${rounds}) | baseline: raw \`Queue.addBulk\` | fleet: \`FleetClient.enqueue\` | ratio fleet / raw | producer peak RSS raw / fleet | Redis per episode job raw / fleet |`,
        '|---|---|---|---|---|---|',
      );
      for (const layout of layouts) {
        const runs: Record<Variant, Awaited<ReturnType<typeof runEnqueue>>[]> = { raw: [], fleet: [] };
        for (let r = 0; r < rounds; r++) {
          const order: Variant[] = r % 2 === 0 ? ['raw', 'fleet'] : ['fleet', 'raw'];
          for (const v of order) runs[v].push(await runEnqueue(v, layout.files));
        }
        const m = (v: Variant, f: (x: (typeof runs)['raw'][number]) => number) => median(runs[v].map(f));
        const ms = { raw: m('raw', (x) => x.ms), fleet: m('fleet', (x) => x.ms) };
        const ratio = ms.fleet / ms.raw;
        const rate = (v: Variant) => (episodes * 1000) / ms[v];
        const peak = (v: Variant) => m(v, (x) => x.peakRssKb) * 1024;
        const start = (v: Variant) => m(v, (x) => x.startRssKb) * 1024;
        const perJob = (v: Variant) => m(v, (x) => x.redisBytes) / episodes;
        out(`   ${layout.label}:`);
        for (const v of ['raw', 'fleet'] as const) {
          out(`     ${v === 'raw' ? 'baseline: raw addBulk  ' : 'fleet: enqueue         '} ${fmtMs(ms[v]).padStart(9)}  ${int(rate(v)).padStart(7)} episodes/s   peak RSS ${mb(peak(v))} (${mb(start(v))} when the clock started)   Redis ${int(perJob(v))} B per episode (job hash ${int(m(v, (x) => x.jobHashBytes))} B)   runs: ${runs[v].map((x) => fmtMs(x.ms)).join(', ')}`);
        }
        out(`     ratio fleet / raw: ${ratio.toFixed(2)}x the time; goal at most 2x: ${ratio <= 2 ? 'met' : 'NOT met'} (load ${load()})`);
        table.push(`| ${layout.label} | ${fmtMs(ms.raw)} (${int(rate('raw'))}/s) | ${fmtMs(ms.fleet)} (${int(rate('fleet'))}/s) | **${ratio.toFixed(2)}x** | ${mb(peak('raw'))} / ${mb(peak('fleet'))} | ${int(perJob('raw'))} B / ${int(perJob('fleet'))} B |`);
      }
      table.push('');
    }

    // ---- 2. and 3. results: memory, then reading them -------------------------------------------------
    if (!values['skip-read']) {
      const before = await emptyRedis();
      const store = new ResultsStore(conn, PREFIX, dataDir);
      const batchId = 'scale-read-5c2e0a71b9d4';
      const samples = episodes / tasks;
      const ids: string[] = [];
      for (let t = 0; t < tasks; t++) for (let s = 0; s < samples; s++) ids.push(`${batchId}.t${String(t).padStart(3, '0')}.${s}`);
      await store.putManifest({ batchId, name: 'scale-read', createdAt: new Date().toISOString(), episodeIds: ids });
      const manifestBytes = (await usedMemory()) - before;
      // A seeded mix: mostly passed or failed, some errors of several kinds, some with token usage.
      let seed = 0x5eed;
      const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
      const kinds: FailureKind[] = ['infra', 'model', 'agent', 'verifier'];
      const order = ids.map((id) => ({ id, k: rand() })).sort((a, b) => a.k - b.k).map((x) => x.id);
      const startedAt = new Date().toISOString();
      const resultOf = (episodeId: string): EpisodeResult => {
        const [, taskId, sample] = episodeId.split('.') as [string, string, string];
        const x = rand();
        const status = x < 0.55 ? 'passed' : x < 0.9 ? 'failed' : 'error';
        const setupMs = 600 + Math.floor(rand() * 900);
        const agentMs = 2_000 + Math.floor(rand() * 20_000);
        const verifyMs = status === 'error' ? undefined : 200 + Math.floor(rand() * 400);
        const prompt = Math.floor(rand() * 5_000);
        const completion = Math.floor(rand() * 1_000);
        return {
          episodeId, batchId, taskId, sample: Number(sample), status,
          ...(status === 'error' && { error: { kind: kinds[Math.floor(rand() * kinds.length)]!, code: 'bench_error', message: 'a synthetic failure' } }),
          reward: status === 'passed' ? 1 : status === 'failed' ? 0 : null,
          attempts: 1, workerId: 'bench-scale',
          timings: { setupMs, agentMs, ...(verifyMs !== undefined && { verifyMs }), closeMs: 150, totalMs: setupMs + agentMs + (verifyMs ?? 0) + 150 },
          provenance: { taskDigest: '0'.repeat(64), image: 'busybox:1.36', agent: { kind: 'command', command: 'true' } },
          agent: { exitCode: 0, timedOut: false, durationMs: agentMs },
          ...(verifyMs !== undefined && { verifier: { exitCode: status === 'passed' ? 0 : 1, timedOut: false, durationMs: verifyMs } }),
          ...(rand() < 0.5 && { usage: { promptTokens: prompt, completionTokens: completion, totalTokens: prompt + completion } }),
          startedAt, endedAt: new Date().toISOString(),
        };
      };
      const beforeResults = await usedMemory();
      const t0 = performance.now();
      let next = 0;
      await Promise.all(Array.from({ length: 32 }, async () => {
        while (next < order.length) {
          const id = order[next++]!;
          if (!(await store.record(resultOf(id)))) throw new Error(`${id}: recorded twice`);
        }
      }));
      const recordMs = performance.now() - t0;
      const resultBytes = (await usedMemory()) - beforeResults;
      const usage = async (key: string) => Number((await conn!.call('MEMORY', 'USAGE', key, 'SAMPLES', '0')) ?? 0);
      const resultsHash = await usage(batchResultsKey(PREFIX, batchId));
      const completions = await usage(batchCompletionsKey(PREFIX, batchId));
      const otherKeys = (await conn.keys(`${PREFIX}:batch:${batchId}:*`)).filter((k) => k !== batchResultsKey(PREFIX, batchId) && k !== batchCompletionsKey(PREFIX, batchId));
      const others = await Promise.all(otherKeys.map(async (k) => `${k.slice(`${PREFIX}:batch:${batchId}:`.length)} ${int((await usage(k)) / episodes)} B`));
      out(`\n2. Redis memory: ${int(episodes)} results of one batch recorded with ResultsStore.record, 32 at a time, in ${fmtMs(recordMs)} (${int((episodes * 1000) / recordMs)}/s; result files on ${path.dirname(dataDir)})`);
      out(`   used_memory per result ${int(resultBytes / episodes)} B: results hash ${int(resultsHash / episodes)} B, completion stream ${int(completions / episodes)} B${others.length > 0 ? `, ${others.join(', ')}` : ''}; the manifest ${int(manifestBytes / episodes)} B per episode`);
      table.push(
        `| Redis memory (used_memory delta / count) | per item | of which |`,
        '|---|---|---|',
        `| one result (ResultsStore.record, ${int(episodes)} in one batch) | ${int(resultBytes / episodes)} B | results hash ${int(resultsHash / episodes)} B, completion stream ${int(completions / episodes)} B${others.length > 0 ? `, ${others.join(', ')}` : ''} |`,
        `| the batch manifest, per episode | ${int(manifestBytes / episodes)} B | |`,
        '',
      );

      // ---- 3. reading them ------------------------------------------------------------------------------
      const dashPort = await freePort();
      const dashboard = track(spawn(process.execPath, [BIN, 'dashboard', '--port', String(dashPort)], {
        env: { ...env, FLEET_DATA_DIR: dataDir, FLEET_DASHBOARD_USER: DASH_USER, FLEET_DASHBOARD_PASSWORD: DASH_PASSWORD, FLEET_DASHBOARD_HOST: '127.0.0.1' },
        stdio: ['ignore', 'ignore', 'inherit'],
      }));
      const get = (urlPath: string) => new Promise<{ status: number; bytes: number; ms: number }>((resolve, reject) => {
        const t = performance.now();
        const req = http.get(`http://127.0.0.1:${dashPort}${urlPath}`, { auth: `${DASH_USER}:${DASH_PASSWORD}`, agent: false }, (res) => {
          let bytes = 0;
          res.on('data', (c: Buffer) => (bytes += c.length));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes, ms: performance.now() - t }));
          res.on('error', reject);
        });
        req.on('error', reject);
      });
      await poll('the dashboard to answer', 60_000, async () => (await get('/healthz').catch(() => undefined))?.status === 200);

      /** A process from spawn to exit, its stdout counted (bytes and lines), never kept. */
      const timeProcess = (args: string[], extraEnv: Record<string, string> = {}) => new Promise<{ ms: number; bytes: number; lines: number; head: string }>((resolve, reject) => {
        const t = performance.now();
        const child = track(spawn(process.execPath, args, { cwd: ROOT, env: { ...env, FLEET_DATA_DIR: dataDir!, ...extraEnv }, stdio: ['ignore', 'pipe', 'inherit'] }));
        let bytes = 0;
        let lines = 0;
        let head = '';
        child.stdout!.on('data', (c: Buffer) => {
          bytes += c.length;
          if (head.length < 400) head += c.toString('utf8', 0, Math.min(c.length, 400));
          for (let i = c.indexOf(10); i !== -1; i = c.indexOf(10, i + 1)) lines += 1;
        });
        child.once('error', reject);
        child.once('exit', (code) => code === 0 ? resolve({ ms: performance.now() - t, bytes, lines, head }) : reject(new Error(`${args.slice(1).join(' ')}: exit ${code}`)));
      });
      const RAW_READER = `
        import { Redis } from 'ioredis';
        const redis = new Redis(process.env.REDIS_URL);
        const all = await redis.hgetall(process.argv[1]);
        let n = 0;
        for (const v of Object.values(all)) if (JSON.parse(v).episodeId) n++;
        process.stdout.write(n + '\\n');
        await redis.quit();`;
      type Reader = 'baseline' | 'status, computed' | 'status' | 'status --json' | 'results' | 'batch page';
      const readers: Record<Reader, () => Promise<{ ms: number; bytes: number; check: string }>> = {
        baseline: async () => {
          const r = await timeProcess(['--input-type=module', '-e', RAW_READER, batchResultsKey(PREFIX, batchId)]);
          if (r.head.trim() !== String(episodes)) throw new Error(`baseline read ${r.head.trim()} results`);
          return { ...r, check: `${r.head.trim()} results` };
        },
        'status, computed': async () => {
          // Without the summary an earlier reader kept: computed from the outlines, as after any change.
          await conn!.del(batchSummaryCacheKey(PREFIX, batchId));
          const r = await timeProcess([BIN, 'status', batchId]);
          if (!r.head.includes(`${episodes}/${episodes} done`)) throw new Error(`status printed ${JSON.stringify(r.head)}`);
          return { ...r, check: r.head.split('\n')[0]! };
        },
        status: async () => {
          const r = await timeProcess([BIN, 'status', batchId]);
          if (!r.head.includes(`${episodes}/${episodes} done`)) throw new Error(`status printed ${JSON.stringify(r.head)}`);
          return { ...r, check: 'the summary kept by the last reader' };
        },
        'status --json': async () => {
          const r = await timeProcess([BIN, 'status', batchId, '--json']);
          if (!r.head.includes(`"done":${episodes}`)) throw new Error(`status --json printed ${JSON.stringify(r.head.slice(0, 200))}`);
          return { ...r, check: `${r.bytes} bytes` };
        },
        results: async () => {
          const r = await timeProcess([BIN, 'results', batchId]);
          // Reported, not thrown: a build from before the fix exited with its output half-written.
          return { ...r, check: r.lines === episodes ? `${int(r.lines)} lines, ${mb(r.bytes)}` : `ONLY ${int(r.lines)} of ${int(episodes)} lines: output cut short` };
        },
        'batch page': async () => {
          const r = await get(`/batches/${batchId}`);
          if (r.status !== 200) throw new Error(`GET /batches/${batchId}: ${r.status}`);
          return { ...r, check: `${mb(r.bytes)} of HTML` };
        },
      };
      const names = Object.keys(readers) as Reader[];
      const times = Object.fromEntries(names.map((n) => [n, [] as number[]])) as Record<Reader, number[]>;
      const checks = {} as Record<Reader, string>;
      out(`\n3. reading a batch of ${int(episodes)} results, each a process from spawn to its last byte (the page: request to last byte, the dashboard already running), ${reads} reads each in alternating order; medians`);
      for (let r = 0; r < reads; r++) {
        for (const name of r % 2 === 0 ? names : [...names].reverse()) {
          const x = await readers[name]();
          times[name].push(x.ms);
          checks[name] = x.check;
        }
      }
      const base = median(times.baseline);
      table.push(
        `| reading a batch of ${int(episodes)} results (median of ${reads}) | time | vs baseline | output |`,
        '|---|---|---|---|',
      );
      for (const name of names) {
        const m = median(times[name]);
        out(`   ${(name === 'baseline' ? 'baseline: HGETALL + JSON.parse (node)' : name === 'batch page' ? 'dashboard GET /batches/<id>' : `rollout-fleet ${name}`).padEnd(40)} ${fmtMs(m).padStart(9)}   ${(m / base).toFixed(2)}x   runs: ${times[name].map(fmtMs).join(', ')}   (${checks[name]})`);
        const label = name === 'baseline' ? 'baseline: a node process, HGETALL + JSON.parse of every result'
          : name === 'batch page' ? 'dashboard: `GET /batches/<id>`'
          : name === 'status, computed' ? '`rollout-fleet status`, computed (no summary kept)' : `\`rollout-fleet ${name}\``;
        table.push(`| ${label} | ${fmtMs(m)} | ${name === 'baseline' ? '1' : `${(m / base).toFixed(2)}x`} | ${checks[name]} |`);
      }
      const statusMs = median(times.status);
      const computedMs = median(times['status, computed']);
      out(`   goal: status under 1 s: ${statusMs < 1000 ? 'met' : 'NOT met'} (${fmtMs(statusMs)}; computed from the outlines: ${computedMs < 1000 ? 'met' : 'NOT met'}, ${fmtMs(computedMs)}; load ${load()})`);
      table.push(`| goal: \`status\` under 1 s | **${statusMs < 1000 ? 'met' : 'not met'}**; computed: **${computedMs < 1000 ? 'met' : 'not met'}** | | |`, '');
      dashboard.kill('SIGTERM');
      await once(dashboard, 'exit');
    }

    // ---- 4. worker RSS over many episodes (Docker) -------------------------------------------------------
    if (values.rss) {
      await emptyRedis();
      // A prefix of its own: a worker's reaper removes the sandboxes of its prefix whose worker has no
      // lease in its Redis, so another bench on this engine with the same prefix would lose its sandboxes
      // to this one's reaper, and this one to its.
      const rssPrefix = `bench-scale-${process.pid}-${Date.now().toString(36)}`;
      const workerEnv = { ...env, FLEET_PREFIX: rssPrefix, FLEET_DATA_DIR: path.join(scratch, 'worker-data'), FLEET_WORKER_ID: `${rssPrefix}-worker` };
      const worker = track(spawn(process.execPath, [BIN, 'worker', '--concurrency', String(rssConcurrency)], { env: workerEnv, stdio: ['ignore', 'ignore', 'inherit'] }));
      const queue = new Queue(EPISODES_QUEUE, { connection: conn, prefix: rssPrefix });
      const results = new ResultsStore(conn, rssPrefix, workerEnv.FLEET_DATA_DIR);
      const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
      try {
        const rssKb = async () => {
          const status = await readFile(`/proc/${worker.pid}/status`, 'utf8');
          return Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? NaN);
        };
        await poll('the worker to connect', 60_000, async () => (await queue.getWorkers()).length >= 1);
        const idleKb = await rssKb();
        // A folder of its own: the batch names its folder's tasks/ (part 1 left 100 tasks in scratch's).
        const file = await writeCommandBatch(path.join(scratch, 'rss'), `scale-rss-${Date.now().toString(36)}`, { samples: rssEpisodes, command: 'echo fixed > state.txt' });
        const client = await FleetClient.connect({ redisUrl: redis.url, prefix: rssPrefix, dataDir: workerEnv.FLEET_DATA_DIR });
        const plan = await client.enqueue(file).finally(() => client.close());
        if (plan.jobs.length !== rssEpisodes) throw new Error(`the RSS batch has ${plan.jobs.length} episodes, expected ${rssEpisodes}`);
        out(`\n4. worker RSS: one worker process at concurrency ${rssConcurrency}, ${int(rssEpisodes)} command-agent episodes (echo fixed > state.txt, busybox sandbox); VmRSS sampled as results come in (idle before the batch: ${(idleKb / 1024).toFixed(0)} MiB)`);
        // Each sample is the RSS seen while `done` episodes had ended; a window's mean is over its samples.
        const samplesTaken: { done: number; kb: number }[] = [];
        const t0 = performance.now();
        let lastPrinted = 0;
        await poll(`${rssEpisodes} results`, 3 * 3600_000, async () => {
          const done = await results.resultCount(plan.batchId);
          samplesTaken.push({ done, kb: await rssKb() });
          if (done - lastPrinted >= rssEpisodes / 10) {
            lastPrinted = done;
            out(`   ${String(done).padStart(5)} done  ${((performance.now() - t0) / 1000).toFixed(0).padStart(5)} s  RSS ${(samplesTaken.at(-1)!.kb / 1024).toFixed(0)} MiB  (load ${load()})`);
          }
          return done >= rssEpisodes;
        }, 250);
        const seconds = (performance.now() - t0) / 1000;
        const all = await results.results(plan.batchId);
        const notPassed = all.filter((r) => r.status !== 'passed');
        const meanOf = (from: number, to: number) => {
          const xs = samplesTaken.filter((s) => s.done >= from && s.done <= to).map((s) => s.kb);
          return xs.reduce((a, b) => a + b, 0) / xs.length / 1024;
        };
        const first = meanOf(1, 100);
        const last = meanOf(rssEpisodes - 99, rssEpisodes);
        const max = Math.max(...samplesTaken.map((s) => s.kb)) / 1024;
        const change = last / first - 1;
        const flat = Math.abs(change) <= 0.1;
        // The first 100 hold the heap's growth up to its first full collection: RSS can fall after them.
        const grew = change > 0.1;
        const tenth = rssEpisodes / 10;
        const curve = Array.from({ length: 10 }, (_, k) => meanOf(Math.round(k * tenth) + 1, Math.round((k + 1) * tenth)).toFixed(0)).join(', ');
        out(`   ${int(rssEpisodes)} episodes in ${seconds.toFixed(0)} s (${(rssEpisodes / seconds).toFixed(2)}/s), ${notPassed.length} not passed; ${samplesTaken.length} samples`);
        out(`   mean RSS (MiB) per tenth of the episodes: ${curve}`);
        out(`   mean RSS over episodes 1-100: ${first.toFixed(1)} MiB; over ${rssEpisodes - 99}-${rssEpisodes}: ${last.toFixed(1)} MiB (${change >= 0 ? '+' : ''}${(change * 100).toFixed(1)}%); max ${max.toFixed(1)} MiB; goal within 10%: ${flat ? 'met' : 'NOT met'}${flat ? '' : grew ? ' (it grew)' : ' (it fell: no growth)'}`);
        table.push(
          `| worker RSS, 1 process at concurrency ${rssConcurrency}, ${int(rssEpisodes)} episodes (${(rssEpisodes / seconds).toFixed(2)}/s) | MiB |`,
          '|---|---|',
          `| idle, before the batch | ${(idleKb / 1024).toFixed(1)} |`,
          `| mean over episodes 1-100 (baseline) | ${first.toFixed(1)} |`,
          `| mean over episodes ${rssEpisodes - 99}-${rssEpisodes} | ${last.toFixed(1)} (**${change >= 0 ? '+' : ''}${(change * 100).toFixed(1)}%**) |`,
          `| max | ${max.toFixed(1)} |`,
          `| mean per tenth of the episodes | ${curve} |`,
          `| goal: last 100 within 10% of the first 100 | **${flat ? 'met' : 'not met'}**${flat ? '' : grew ? ' (it grew)' : ' (it fell: no growth)'} |`,
          '',
        );
        // The sandboxes go before the worker does (the reaper's next run is always delayed: not counted).
        const cleanupQueue = new Queue(CLEANUP_QUEUE, { connection: conn, prefix: rssPrefix });
        await poll('sandboxes to be removed', 300_000, async () => {
          const counts = await cleanupQueue.getJobCounts('waiting', 'active');
          const left = await docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } });
          return Object.values(counts).every((n) => n === 0) && left.length === 0;
        }, 500);
        await cleanupQueue.close();
      } finally {
        await queue.close();
        if (worker.exitCode === null) {
          worker.kill('SIGTERM');
          await once(worker, 'exit');
        }
        // The runtime generation this prefix installed is nobody else's.
        const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.prefix}=${rssPrefix}`] } });
        await Promise.all((Volumes ?? []).map((v) => docker.getVolume(v.Name).remove().catch(() => undefined)));
      }
    }

    out(`\nfor docs/PERFORMANCE.md (${new Date().toISOString().slice(0, 10)}, ${machine}, load average ${load()} at the end):\n`);
    out(table.join('\n'));
  } finally {
    await cleanup();
  }
}

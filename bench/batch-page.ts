// The batch page of a big batch against reading the same results from Redis directly, in the same run,
// on a private loopback redis-server. No Docker.
// This process records `--episodes` synthetic results of one batch (`--samples` per task; passed,
// failed, timeouts and errors of several kinds, finishing over an hour) with ResultsStore.record, as
// workers do, then serves the dashboard (createDashboardApp, as `rollout-fleet dashboard` runs it) on
// 127.0.0.1 and, round by round, interleaved:
//   (a) GET /batches/<id>: the whole page, body read to the end, over HTTP with keep-alive;
//   (b) the baseline: HGETALL of the batch's results hash and JSON.parse of every result;
//   (c) GET /batches/<id>?status=failed and ?task=<one task> (the filters);
//   (d) GET /batches (the list, this batch among 20 smaller ones, running).
// Prints p50/p90/max of each and the ratio of (a) to (b), and whether (a)'s p50 is under 1 s.
// Run: npx tsx bench/batch-page.ts [--episodes 10000] [--samples 20] [--rounds 15]
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import type { EpisodeResult } from '../queues/episodes/contract.ts';
import { startPrivateRedis, type PrivateRedis } from '../src/cli/private-redis.ts';
import { createDashboardApp } from '../src/dashboard/dashboard-server.ts';
import type { FailureKind } from '../src/errors/failure-kind.ts';
import { batchResultsKey } from '../src/redis/redis-keys.ts';
import { ResultsStore } from '../src/results/results-store.ts';

const PREFIX = 'bench';
const { values } = parseArgs({
  options: {
    episodes: { type: 'string', default: '10000' },
    samples: { type: 'string', default: '20' },
    rounds: { type: 'string', default: '15' },
  },
});
const episodes = Number(values.episodes);
const samples = Number(values.samples);
const rounds = Number(values.rounds);

const out = (line: string) => process.stdout.write(`${line}\n`);
const pct = (xs: readonly number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? NaN;
};
const ms = (x: number) => `${x.toFixed(x < 10 ? 1 : 0)} ms`;

/** A seeded generator, the same batch every run. */
let seed = 7;
const random = () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31);

function syntheticResult(batchId: string, episodeId: string, i: number, createdMs: number): EpisodeResult {
  const taskId = episodeId.split('.')[1]!;
  // Tasks differ in difficulty: the task's number sets its pass chance.
  const hardness = (Number(taskId.slice(5)) % 10) / 10;
  const roll = random();
  const kinds: FailureKind[] = ['infra', 'verifier', 'agent', 'model'];
  const status: EpisodeResult['status'] = roll < 0.04 ? 'error' : roll < 0.06 ? 'timeout' : random() >= hardness ? 'passed' : 'failed';
  const ended = createdMs + Math.floor((i / episodes) * 3_600_000) + Math.floor(random() * 30_000);
  return {
    episodeId, batchId, taskId, sample: Number(episodeId.split('.')[2]),
    status,
    ...(status === 'error' && { error: { kind: kinds[i % kinds.length]!, code: `${kinds[i % kinds.length]}_failed`, message: 'synthetic failure <with markup>' } }),
    reward: status === 'passed' ? 1 : status === 'failed' ? 0 : null,
    attempts: status === 'error' ? 2 : 1,
    workerId: `bench-worker-${i % 8}`,
    timings: { setupMs: 600 + Math.floor(random() * 800), agentMs: 4_000 + Math.floor(random() * 20_000), verifyMs: 200 + Math.floor(random() * 400), closeMs: 150 + Math.floor(random() * 200), totalMs: 30_000 },
    provenance: { taskDigest: '0'.repeat(64), image: 'busybox:1.36', agent: { kind: 'command', command: 'true' } },
    agent: { exitCode: 0, timedOut: status === 'timeout', durationMs: 5_000 },
    verifier: { exitCode: status === 'passed' ? 0 : 1, timedOut: false, durationMs: 300 },
    runtime: { generationId: 'f'.repeat(64), warm: true, prepareMs: 12 },
    startedAt: new Date(ended - 30_000).toISOString(),
    endedAt: new Date(ended).toISOString(),
  };
}

async function recordBatch(store: ResultsStore, batchId: string, count: number, createdMs: number, recorded = count): Promise<string[]> {
  const tasks = Math.ceil(count / samples);
  const ids = Array.from({ length: count }, (_, i) => `${batchId}.task-${String(Math.floor(i / samples)).padStart(String(tasks).length, '0')}.${i % samples}`);
  await store.putManifest({ batchId, name: `${batchId} (bench)`, createdAt: new Date(createdMs).toISOString(), episodeIds: ids });
  // 64 records in flight, as several workers would record them.
  let next = 0;
  await Promise.all(Array.from({ length: 64 }, async () => {
    while (next < recorded) {
      const i = next++;
      if (!(await store.record(syntheticResult(batchId, ids[i]!, i, createdMs)))) throw new Error(`${ids[i]} recorded twice`);
    }
  }));
  return ids;
}

/** GET a path with keep-alive; resolves with the status, the body's length and the milliseconds to its end. */
function get(agent: http.Agent, base: string, p: string): Promise<{ status: number; bytes: number; ms: number; body: string }> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    http.get(`${base}${p}`, { agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        resolve({ status: res.statusCode ?? 0, bytes: body.length, ms: performance.now() - t0, body: body.toString('utf8') });
      });
      res.on('error', reject);
    }).on('error', reject);
  });
}

async function main(): Promise<void> {
  let redis: PrivateRedis | undefined;
  let conn: Redis | undefined;
  let dataDir: string | undefined;
  let server: http.Server | undefined;
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    redis = await startPrivateRedis();
    conn = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench-batch-page' });
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-page-'));
    const redisVersion = /redis_version:(\S+)/.exec(await conn.info('server'))?.[1] ?? '?';
    out(`${os.cpus().length} cores (${os.cpus()[0]?.model.trim() ?? '?'}), Node ${process.version}, Redis ${redisVersion}; load average ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}`);

    const store = new ResultsStore(conn, PREFIX, dataDir);
    const batchId = 'big';
    const createdMs = Date.now() - 3_700_000;
    const t0 = performance.now();
    // Twenty smaller batches on the list beside it, the newest still running.
    for (let b = 0; b < 20; b++) await recordBatch(store, `small-${String(b).padStart(2, '0')}`, 200, createdMs - (20 - b) * 600_000, b === 19 ? 120 : 200);
    const ids = await recordBatch(store, batchId, episodes, createdMs);
    const bytes = (await conn.hstrlen(batchResultsKey(PREFIX, batchId), ids[0]!)) * episodes;
    out(`recorded ${episodes} results of one batch (${Math.ceil(episodes / samples)} tasks x ${samples} samples; ~${(bytes / 2 ** 20).toFixed(1)} MiB of JSON) and 20 batches of 200 beside it in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

    const { app } = createDashboardApp({
      redis: conn, queues: [], prefix: PREFIX, dataDir, log: pino({ level: 'silent' }), credentials: undefined, writeEnabled: false,
    });
    server = app.listen(0, '127.0.0.1');
    await new Promise((r) => server!.once('listening', r));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const task = ids[Math.floor(episodes / 2)]!.split('.')[1]!;
    const paths = {
      page: `/batches/${batchId}`,
      failed: `/batches/${batchId}?status=failed`,
      task: `/batches/${batchId}?task=${task}`,
      list: '/batches',
    };
    // Once each before timing: the first request of each warms its code paths (and the list's caches).
    const sizes: Record<string, number> = {};
    for (const [name, p] of Object.entries(paths)) {
      const first = await get(agent, base, p);
      if (first.status !== 200) throw new Error(`${p}: ${first.status} ${first.body.slice(0, 200)}`);
      sizes[name] = first.bytes;
    }

    const times: Record<string, number[]> = { page: [], baseline: [], failed: [], task: [], list: [] };
    const resultsKey = batchResultsKey(PREFIX, batchId);
    for (let r = 0; r < rounds; r++) {
      // Alternate which goes first, so both see the same background load.
      const baseline = async () => {
        const b0 = performance.now();
        const all = await conn!.hgetall(resultsKey);
        let n = 0;
        for (const v of Object.values(all)) n += (JSON.parse(v) as EpisodeResult).reward === null ? 0 : 1;
        if (n === 0) throw new Error('no graded result read');
        times.baseline!.push(performance.now() - b0);
      };
      const page = async () => times.page!.push((await get(agent, base, paths.page)).ms);
      if (r % 2 === 0) {
        await page();
        await baseline();
      } else {
        await baseline();
        await page();
      }
      times.failed!.push((await get(agent, base, paths.failed)).ms);
      times.task!.push((await get(agent, base, paths.task)).ms);
      times.list!.push((await get(agent, base, paths.list)).ms);
    }

    const p50 = (k: string) => pct(times[k]!, 50);
    const row = (label: string, k: string, size?: number) =>
      `| ${label} | ${ms(p50(k))} | ${ms(pct(times[k]!, 90))} | ${ms(Math.max(...times[k]!))} | ${(p50(k) / p50('baseline')).toFixed(2)}x |${size === undefined ? '' : ` ${(size / 1024).toFixed(0)} KiB |`}`;
    out(`\n${rounds} rounds, interleaved; each GET reads the whole body over a keep-alive connection`);
    out('');
    out('| | p50 | p90 | max | vs baseline (p50) | page size |');
    out('|---|---|---|---|---|---|');
    out(`${row(`baseline: HGETALL + JSON.parse of the ${episodes} results`, 'baseline')} |`);
    out(row(`GET /batches/${batchId} (${episodes} episodes)`, 'page', sizes.page));
    out(row('GET with ?status=failed', 'failed', sizes.failed));
    out(row('GET with ?task=<one task>', 'task', sizes.task));
    out(row('GET /batches (21 batches)', 'list', sizes.list));
    out(`\ngoal: the batch page under 1 s: ${p50('page') < 1000 ? 'met' : 'NOT met'} (p50 ${ms(p50('page'))}, ${(p50('page') / p50('baseline')).toFixed(2)}x the baseline)`);
  } finally {
    agent.destroy();
    if (server) {
      server.closeAllConnections();
      await new Promise((r) => server!.close(r));
    }
    await conn?.quit().catch(() => undefined);
    await redis?.stop();
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});

// The fleet against a model endpoint's rate limit, end to end: the scripted model stub limited to N
// requests a minute (429 + Retry-After beyond it), 3 real worker processes (the compiled CLI) at
// concurrency 4 running the reference LLM agent on the example tasks through their episode proxies,
// every proxy asking the fleet-wide limiter (MODEL_REQUESTS_PER_MINUTE) before each upstream attempt.
// The stub's counters are sampled every 250 ms. Prints the stub's answered calls a minute as a share of
// N while the fleet had more calls to make than N allows (from 5 s after the first call until 80% of
// all calls were answered), the 429 share overall and in that window (after the first adaptation),
// and the episodes that failed (goals: >= 95% of N, < 2% 429s after adaptation, none failed for it).
// Run: npm run build && npx tsx bench/model-rate-limit-fleet.ts [--rpm 600] [--limiter-rpm N] [--samples 12]
//      [--workers 3] [--concurrency 4]
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { FlowProducer, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { EPISODES_QUEUE } from '../queues/episodes/contract.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { startModelStub } from '../src/model/model-stub.ts';
import { enqueueBatch } from '../src/producer/enqueue-batch.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { loadBatch } from '../src/tasks/load-task.ts';
import { poll } from './command-batch.ts';

const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));
const TASKS = fileURLToPath(new URL('../examples/tasks', import.meta.url));

const { values } = parseArgs({
  options: {
    rpm: { type: 'string', default: '600' },
    'limiter-rpm': { type: 'string' },
    samples: { type: 'string', default: '12' },
    workers: { type: 'string', default: '3' },
    concurrency: { type: 'string', default: '4' },
  },
});
const num = (name: keyof typeof values, fallback?: string) => {
  const n = Number(values[name] ?? fallback);
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`--${name}: expected an integer from 1 up, got ${JSON.stringify(values[name])}`);
  return n;
};
const rpm = num('rpm');
const limiterRpm = num('limiter-rpm', values.rpm);
const samples = num('samples');
const workers = num('workers');
const concurrency = num('concurrency');

interface Sample {
  t: number;
  answered: number;
  rateLimited: number;
}

const redis = await startPrivateRedis();
const client = new Redis(redis.url, { maxRetriesPerRequest: null });
const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-rl-'));
const prefix = 'bench-rl';
const stub = await startModelStub({ tasksDir: TASKS, listen: { port: 0 }, rateLimitRpm: rpm, log: pino({ level: 'silent' }) });
const queue = new Queue(EPISODES_QUEUE, { connection: client, prefix });
const flows = new FlowProducer({ connection: client, prefix });
const results = new ResultsStore(client, prefix, path.join(dir, 'data'));
const children: ChildProcess[] = [];
try {
  const env = {
    ...process.env, REDIS_URL: redis.url, FLEET_PREFIX: prefix, FLEET_DATA_DIR: path.join(dir, 'data'), LOG_LEVEL: 'warn',
    MODEL_BASE_URL: stub.baseUrl!, MODEL_REQUESTS_PER_MINUTE: String(limiterRpm),
  };
  for (let i = 0; i < workers; i++) {
    children.push(spawn(process.execPath, [BIN, 'worker', '--concurrency', String(concurrency)], { env: { ...env, FLEET_WORKER_ID: `rl-${i}` }, stdio: ['ignore', 'ignore', 'inherit'] }));
  }
  await poll(`${workers} workers to connect`, 60_000, async () => (await queue.getWorkers()).length >= workers);
  const file = path.join(dir, 'batch.yaml');
  await writeFile(file, `name: rate-limit\ntasks: [${JSON.stringify(TASKS)}]\nsamples: ${samples}\nagent: { kind: llm, maxTurns: 12 }\n`);
  const stats = async (): Promise<Sample> => {
    const s = (await (await fetch(`${stub.baseUrl!.replace(/\/v1$/, '')}/_stub/stats`)).json()) as { answered: number; rateLimited: number };
    return { t: performance.now(), answered: s.answered, rateLimited: s.rateLimited };
  };
  const series: Sample[] = [await stats()];
  const sampler = setInterval(() => void stats().then((s) => series.push(s), () => undefined), 250);
  const plan = await enqueueBatch(await loadBatch(file), { flows, redis: client, prefix, results });
  const total = plan.jobs.length;
  await poll(`${total} results`, 900_000, async () => (await results.resultCount(plan.batchId)) >= total, 500);
  clearInterval(sampler);
  series.push(await stats());
  const all = await results.results(plan.batchId);
  const errors = all.filter((r) => r.status === 'error');
  const last = series.at(-1)!;
  const firstCall = series.find((s) => s.answered > 0)!;
  const from = series.find((s) => s.t >= firstCall.t + 5_000)!;
  const to = series.find((s) => s.answered >= 0.8 * last.answered)!;
  const minutes = (to.t - from.t) / 60_000;
  const windowAnswered = to.answered - from.answered;
  const windowLimited = to.rateLimited - from.rateLimited;
  const share = (a: number, b: number) => `${((100 * a) / Math.max(1, b)).toFixed(1)}%`;
  console.log(`${workers} worker processes x concurrency ${concurrency}, ${total} llm episodes, stub limited to ${rpm}/min, fleet limiter at ${limiterRpm}/min, ${os.cpus().length} cores`);
  console.log(`calls answered: ${last.answered}, answered 429: ${last.rateLimited} (${share(last.rateLimited, last.answered + last.rateLimited)} of all)`);
  console.log(`window ${((to.t - from.t) / 1000).toFixed(1)} s (5 s after the first call to 80% of calls): ${(windowAnswered / minutes).toFixed(0)} answered/min = ${share(windowAnswered / minutes, rpm)} of the limit; 429s in it: ${windowLimited} (${share(windowLimited, windowAnswered + windowLimited)})`);
  console.log(`episodes: ${all.filter((r) => r.status === 'passed').length} passed, ${all.filter((r) => r.status === 'failed').length} failed (reverse-lines fails by design), ${errors.length} errors${errors.length > 0 ? `: ${JSON.stringify(errors[0]!.error)}` : ''}`);
} finally {
  await Promise.all(children.map(async (c) => {
    if (c.exitCode === null && c.signalCode === null) {
      c.kill('SIGTERM');
      await once(c, 'exit');
    }
  }));
  await queue.close();
  await flows.close();
  await client.quit();
  await stub.close();
  await redis.stop();
  await rm(dir, { recursive: true, force: true });
}

// Throughput of the fleet with 3 worker processes against 1, in the same run, on a private Redis and
// the local Docker engine: one batch of 30 episodes each, every worker process at the same concurrency.
// Prints episodes/s of each and their ratio. Run: npm run build && npx tsx bench/throughput.ts [--episodes 30]
// [--concurrency 2] [--agent-sec 1] [--rounds 1]. With several rounds (1 then 3 workers each round, so
// both see the same background load) the ratio is the median of the rounds' ratios.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { FlowProducer, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { CLEANUP_QUEUE } from '../queues/cleanup/contract.ts';
import { EPISODES_QUEUE } from '../queues/episodes/contract.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { enqueueBatch } from '../src/producer/enqueue-batch.ts';
import { phaseTimings } from '../src/dashboard/batch-stats.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { LABEL } from '../src/sandbox/labels.ts';
import { loadBatch } from '../src/tasks/load-task.ts';
import { poll, writeCommandBatch } from './command-batch.ts';

/** The compiled CLI (`npm run build`), as workers run it. */
const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));

const { values } = parseArgs({
  options: {
    episodes: { type: 'string', default: '30' },
    concurrency: { type: 'string', default: '2' },
    'agent-sec': { type: 'string', default: '1' },
    rounds: { type: 'string', default: '1' },
  },
});
const episodes = Number(values.episodes);
const concurrency = Number(values.concurrency);
const agentSec = Number(values['agent-sec']);
const rounds = Number(values.rounds);
for (const [name, n] of [['episodes', episodes], ['concurrency', concurrency], ['rounds', rounds]] as const) {
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`--${name}: expected an integer from 1 up, got ${n}`);
}
if (!(agentSec >= 0)) throw new TypeError(`--agent-sec: expected a number from 0 up, got ${agentSec}`);



async function main(): Promise<void> {
  const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench' });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-'));
  const prefix = 'bench';
  const queue = new Queue(EPISODES_QUEUE, { connection: client, prefix });
  const cleanup = new Queue(CLEANUP_QUEUE, { connection: client, prefix });
  const flows = new FlowProducer({ connection: client, prefix });
  const results = new ResultsStore(client, prefix, path.join(dir, 'data'));
  const children: ChildProcess[] = [];
  const stopAll = async () => {
    await Promise.all(children.splice(0).map(async (c) => {
      if (c.exitCode === null && c.signalCode === null) {
        c.kill('SIGTERM');
        await once(c, 'exit');
      }
    }));
  };

  async function run(workers: number, round: number): Promise<{ workers: number; seconds: number; perSec: number; phases: string }> {
    const env = { ...process.env, REDIS_URL: redis.url, FLEET_PREFIX: prefix, FLEET_DATA_DIR: path.join(dir, 'data'), LOG_LEVEL: 'warn' };
    for (let i = 0; i < workers; i++) {
      children.push(spawn(process.execPath, [BIN, 'worker', '--concurrency', String(concurrency)], {
        env: { ...env, FLEET_WORKER_ID: `bench-${workers}w-${i}` }, stdio: ['ignore', 'ignore', 'inherit'],
      }));
    }
    // Timing starts once every worker process is connected, so start-up is not measured.
    await poll(`${workers} workers to connect`, 60_000, async () => (await queue.getWorkers()).length >= workers);
    const file = await writeCommandBatch(dir, `bench-${workers}w-r${round}`, { samples: episodes, command: `sleep ${agentSec}; echo fixed > state.txt` });
    const started = performance.now();
    const plan = await enqueueBatch(await loadBatch(file), { flows, redis: client, prefix, results });
    await poll(`${episodes} results`, 600_000, async () => (await results.resultCount(plan.batchId)) >= episodes);
    const seconds = (performance.now() - started) / 1000;
    const all = await results.results(plan.batchId);
    const notPassed = all.filter((r) => r.status !== 'passed');
    if (notPassed.length > 0) throw new Error(`${notPassed.length} episodes did not pass: ${JSON.stringify(notPassed[0])}`);
    // Let the cleanup queue remove every sandbox before the next run, then stop the workers.
    await poll('sandboxes to be removed', 120_000, async () => {
      const counts = await cleanup.getJobCounts('waiting', 'active', 'delayed');
      const left = await docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } });
      return Object.values(counts).every((n) => n === 0) && left.length === 0;
    });
    await stopAll();
    const phases = phaseTimings(all).map((t) => `${t.phase} ${((t.p50Ms ?? 0) / 1000).toFixed(1)}`).join(', ');
    return { workers, seconds, perSec: episodes / seconds, phases: `p50 s: ${phases}` };
  }

  try {
    process.stderr.write(`bench: ${episodes} episodes per run, concurrency ${concurrency} per worker process, agent ${agentSec} s, ${os.cpus().length} cores, load ${os.loadavg()[0]!.toFixed(1)}\n`);
    const ratios: number[] = [];
    for (let round = 1; round <= rounds; round++) {
      const one = await run(1, round);
      process.stdout.write(`round ${round}: 1 worker process:   ${one.seconds.toFixed(1)} s, ${one.perSec.toFixed(2)} episodes/s (${one.phases})\n`);
      const three = await run(3, round);
      process.stdout.write(`round ${round}: 3 worker processes: ${three.seconds.toFixed(1)} s, ${three.perSec.toFixed(2)} episodes/s (${three.phases})\n`);
      ratios.push(three.perSec / one.perSec);
      process.stdout.write(`round ${round}: ratio 3 vs 1: ${ratios.at(-1)!.toFixed(2)}x (load ${os.loadavg()[0]!.toFixed(1)})\n`);
    }
    const sorted = [...ratios].sort((a, b) => a - b);
    const median = sorted.length % 2 === 1 ? sorted[(sorted.length - 1) / 2]! : (sorted[sorted.length / 2 - 1]! + sorted[sorted.length / 2]!) / 2;
    process.stdout.write(`ratio 3 vs 1: ${median.toFixed(2)}x${rounds > 1 ? ` (median of ${rounds} rounds)` : ''}\n`);
  } finally {
    await stopAll();
    await queue.close();
    await flows.close();
    await cleanup.close();
    await client.quit();
    await redis.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();

// Start-up of the compiled CLI against `node -e 0` in the same run: `rollout-fleet --help`, and
// `rollout-fleet status <batch>` on a private loopback redis-server holding a real (enqueued, not run)
// batch, each a whole process from spawn to exit, interleaved round by round so both see the same
// background load; prints medians and the ratio of each to the baseline (goal: under 3x). With
// --worker, also a `rollout-fleet worker` process from spawn until its first episode is active (one
// tiny command-agent episode per round, on the local Docker engine; sandboxes removed before the next).
// Run: npm run build && npx tsx bench/cli-startup.ts [--rounds 15] [--worker] [--worker-rounds 3]
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { FlowProducer, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { EPISODES_QUEUE } from '../queues/episodes/contract.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { enqueueBatch } from '../src/producer/enqueue-batch.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { LABEL } from '../src/sandbox/labels.ts';
import { loadBatch } from '../src/tasks/load-task.ts';
import { poll, writeCommandBatch } from './command-batch.ts';

/** The compiled CLI (`npm run build`), as installed. */
const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));

const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '15' },
    worker: { type: 'boolean', default: false },
    'worker-rounds': { type: 'string', default: '3' },
  },
});
const rounds = Number(values.rounds);
const workerRounds = Number(values['worker-rounds']);
for (const [name, n] of [['rounds', rounds], ['worker-rounds', workerRounds]] as const) {
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`--${name}: expected an integer from 1 up, got ${n}`);
}
if (!existsSync(BIN)) throw new Error(`${BIN} is missing: run \`npm run build\` first`);

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** Wall milliseconds of one process from spawn to exit; fails unless it exits `expectCode`. */
async function timed(args: string[], env: NodeJS.ProcessEnv, expectCode = 0): Promise<number> {
  const started = performance.now();
  const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  const ms = performance.now() - started;
  if (code !== expectCode) throw new Error(`node ${args.join(' ')} exited ${code}, not ${expectCode}: ${stderr}`);
  return ms;
}



async function main(): Promise<void> {
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench' });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-'));
  const prefix = 'bench';
  const dataDir = path.join(dir, 'data');
  const queue = new Queue(EPISODES_QUEUE, { connection: client, prefix });
  const flows = new FlowProducer({ connection: client, prefix });
  const results = new ResultsStore(client, prefix, dataDir);
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, REDIS_URL: redis.url, FLEET_PREFIX: prefix, FLEET_DATA_DIR: dataDir, LOG_LEVEL: 'warn' };
  try {
    // A batch that exists: enqueued (no worker runs yet), so `status` reads a real manifest and summary.
    const statusBatch = await enqueueBatch(await loadBatch(await writeCommandBatch(dir, 'status', { samples: 1, command: 'echo fixed > state.txt' })), {
      flows, redis: client, prefix, results, imageExists: async () => true,
    });
    await timed([BIN, 'status', statusBatch.batchId], env); // fail now, not after the rounds, if it cannot run
    process.stderr.write(`bench: ${rounds} rounds, ${os.cpus().length} cores, load ${os.loadavg()[0]!.toFixed(1)}\n`);
    const cases = {
      'node -e 0': ['-e', '0'],
      'rollout-fleet --help': [BIN, '--help'],
      [`rollout-fleet status <batch>`]: [BIN, 'status', statusBatch.batchId],
    } satisfies Record<string, string[]>;
    const times = new Map<string, number[]>(Object.keys(cases).map((k) => [k, []]));
    for (let round = 0; round < rounds; round++) {
      for (const [name, args] of Object.entries(cases)) times.get(name)!.push(await timed(args, env));
    }
    const baseline = median(times.get('node -e 0')!);
    for (const [name, ms] of times) {
      process.stdout.write(`${name.padEnd(30)} median ${median(ms).toFixed(0).padStart(5)} ms  (min ${Math.min(...ms).toFixed(0)}, max ${Math.max(...ms).toFixed(0)})  ${(median(ms) / baseline).toFixed(2)}x\n`);
    }
    // Take the status batch's episode off the queue, so the worker rounds see only their own.
    await client.del(`${prefix}:${EPISODES_QUEUE}:wait`);

    if (values.worker) {
      const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
      const firstJobMs: number[] = [];
      for (let round = 0; round < workerRounds; round++) {
        const plan = await enqueueBatch(await loadBatch(await writeCommandBatch(dir, `worker-r${round}`, { samples: 1, command: 'echo fixed > state.txt' })), { flows, redis: client, prefix, results });
        const started = performance.now();
        const worker = spawn(process.execPath, [BIN, 'worker', '--concurrency', '1'], {
          env: { ...env, DOCKER_HOST: process.env.DOCKER_HOST, FLEET_WORKER_ID: `bench-startup-${round}` }, stdio: ['ignore', 'ignore', 'inherit'],
        });
        try {
          // 5 ms polls: fine next to start-ups of hundreds of ms.
          await poll('the first episode to be active', 60_000, async () => {
            const counts = await queue.getJobCounts('active', 'completed', 'failed');
            return counts.active! + counts.completed! + counts.failed! > 0;
          }, 5);
          firstJobMs.push(performance.now() - started);
          await poll('the episode result', 300_000, async () => (await results.resultCount(plan.batchId)) >= 1);
          // The worker's cleanup queue removes the sandbox; the reaper's scheduled job stays delayed.
          await poll('the sandbox to be removed', 120_000, async () =>
            (await docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } })).length === 0);
        } finally {
          if (worker.exitCode === null && worker.signalCode === null) {
            worker.kill('SIGTERM');
            await once(worker, 'exit');
          }
        }
        await queue.clean(0, 1000, 'completed');
      }
      const m = median(firstJobMs);
      process.stdout.write(`${'worker: spawn to first active'.padEnd(30)} median ${m.toFixed(0).padStart(5)} ms  (min ${Math.min(...firstJobMs).toFixed(0)}, max ${Math.max(...firstJobMs).toFixed(0)})  ${(m / baseline).toFixed(2)}x\n`);
    }
  } finally {
    await queue.close();
    await flows.close();
    await client.quit();
    await redis.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();

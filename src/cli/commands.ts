// The commands of the `rollout-fleet` CLI (but demo, in demo.ts). Each returns its exit code.
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import type { Redis } from 'ioredis';
import { enqueueBatch } from '../producer/enqueue-batch.ts';
import { ResultsStore } from '../results/results-store.ts';
import { formatSummary, summarize, type BatchSummary } from '../results/summarize.ts';
import { loadBatch } from '../tasks/load-task.ts';
import { startWorker } from '../worker/start-worker.ts';
import { UsageError, connectProducer, episodesQueue, imageChecker, requireRedisUrl, type Cli } from './context.ts';

const positive = (name: string, value: string | undefined): number | undefined => {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`--${name}: expected an integer from 1 up, got ${JSON.stringify(value)}`);
  return n;
};

export async function workerCommand(cli: Cli, args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: { concurrency: { type: 'string' } } });
  const { config, log, docker } = cli;
  const handle = await startWorker({
    redisUrl: requireRedisUrl(config),
    prefix: config.FLEET_PREFIX,
    dataDir: config.FLEET_DATA_DIR,
    docker,
    log,
    workerId: config.FLEET_WORKER_ID,
    concurrency: positive('concurrency', values.concurrency) ?? config.FLEET_WORKER_CONCURRENCY,
    callTimeoutMs: config.FLEET_DOCKER_CALL_TIMEOUT_MS,
    outputCapBytes: config.FLEET_OUTPUT_CAP_BYTES,
    leaseTtlMs: config.FLEET_LEASE_TTL_MS,
    reaperIntervalMs: config.FLEET_REAPER_INTERVAL_MS,
    lockDurationMs: config.FLEET_LOCK_DURATION_MS,
    drainTimeoutMs: config.FLEET_DRAIN_TIMEOUT_MS,
    retryBudgets: { infra: config.FLEET_INFRA_RETRIES, model: config.FLEET_MODEL_RETRIES },
  });
  const [signal] = await Promise.race([once(process, 'SIGTERM'), once(process, 'SIGINT')]);
  log.info({ signal, running: handle.running.size, drainTimeoutMs: config.FLEET_DRAIN_TIMEOUT_MS }, 'draining');
  await handle.close();
  return 0;
}

async function batchSummary(redis: Redis, prefix: string, dataDir: string, batchId: string): Promise<BatchSummary> {
  const store = new ResultsStore(redis, prefix, dataDir);
  const manifest = await store.getManifest(batchId);
  if (manifest === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis (prefix ${prefix})`);
  return summarize(batchId, manifest.episodeIds.length, await store.results(batchId));
}

/** Poll the results until every episode of the batch has one, printing a line when progress changes. */
export async function waitForBatch(redis: Redis, prefix: string, dataDir: string, batchId: string, pollMs = 500): Promise<BatchSummary> {
  let last = '';
  for (;;) {
    const s = await batchSummary(redis, prefix, dataDir, batchId);
    const line = `${s.done}/${s.total} done: ${s.byStatus.passed} passed, ${s.byStatus.failed} failed, ${s.byStatus.timeout} timeout, ${s.byStatus.error} error`;
    if (line !== last) process.stderr.write(`progress ${batchId}: ${line}\n`);
    last = line;
    if (s.finished) return s;
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

export async function enqueueCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { wait: { type: 'boolean' }, json: { type: 'boolean' } } });
  const file = positionals[0];
  if (file === undefined || positionals.length > 1) throw new UsageError('usage: rollout-fleet enqueue <batch.yaml> [--wait] [--json]');
  const { config, docker } = cli;
  const loaded = await loadBatch(file);
  const redis = await connectProducer(requireRedisUrl(config));
  const queue = episodesQueue(redis, config.FLEET_PREFIX);
  try {
    const results = new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
    const plan = await enqueueBatch(loaded, { queue, redis, prefix: config.FLEET_PREFIX, results, imageExists: imageChecker(docker) });
    if (!values.wait) {
      process.stdout.write(values.json ? `${JSON.stringify({ batchId: plan.batchId, episodes: plan.jobs.length })}\n` : `${plan.batchId}\n`);
      return 0;
    }
    const summary = await waitForBatch(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR, plan.batchId);
    process.stdout.write(values.json ? `${JSON.stringify(summary)}\n` : `${formatSummary(summary)}\n`);
    return 0;
  } finally {
    await queue.close();
    await redis.quit();
  }
}

export async function statusCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { json: { type: 'boolean' } } });
  const batchId = positionals[0];
  if (batchId === undefined) throw new UsageError('usage: rollout-fleet status <batch-id> [--json]');
  const { config } = cli;
  const redis = await connectProducer(requireRedisUrl(config));
  try {
    const s = await batchSummary(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR, batchId);
    process.stdout.write(values.json ? `${JSON.stringify(s)}\n` : `${formatSummary(s)}\n`);
    return 0;
  } finally {
    await redis.quit();
  }
}

export async function resultsCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { format: { type: 'string', default: 'jsonl' } } });
  const batchId = positionals[0];
  if (batchId === undefined) throw new UsageError('usage: rollout-fleet results <batch-id> --format jsonl');
  if (values.format !== 'jsonl') throw new UsageError(`--format: expected jsonl, got ${JSON.stringify(values.format)}`);
  const { config } = cli;
  const redis = await connectProducer(requireRedisUrl(config));
  try {
    const store = new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
    if ((await store.getManifest(batchId)) === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    for (const r of await store.results(batchId)) process.stdout.write(`${JSON.stringify(r)}\n`);
    return 0;
  } finally {
    await redis.quit();
  }
}

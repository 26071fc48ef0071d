// The commands of the `rollout-fleet` CLI (but demo, in demo.ts). Each returns its exit code.
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import type { FleetConfig } from '../config/config.ts';
import type { ModelSettings } from '../episode/episode-attempt.ts';
import { enqueueBatch } from '../producer/enqueue-batch.ts';
import { ResultsStore } from '../results/results-store.ts';
import { formatSummary } from '../results/batch-summary.ts';
import { resultsCsv } from '../results/results-csv.ts';
import { progressView, waitForBatch } from './progress.ts';
import { loadBatch } from '../tasks/load-task.ts';
import { startWorker } from './worker-process.ts';
import { UsageError, connectProducer, episodesQueue, flowProducer, imageChecker, requireRedisUrl, type Cli } from './context.ts';

const positive = (name: string, value: string | undefined): number | undefined => {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`--${name}: expected an integer from 1 up, got ${JSON.stringify(value)}`);
  return n;
};

export function modelSettings(config: FleetConfig, baseUrl: string): ModelSettings {
  return {
    baseUrl,
    apiKey: config.MODEL_API_KEY,
    name: config.MODEL_NAME,
    maxCalls: config.MODEL_MAX_CALLS,
    maxTokens: config.MODEL_MAX_TOKENS,
    requestTimeoutMs: config.MODEL_REQUEST_TIMEOUT_MS,
    upstreamRetries: config.MODEL_UPSTREAM_RETRIES,
  };
}

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
    runtimeMaxIdleMs: config.FLEET_RUNTIME_MAX_IDLE_MS,
    ...(config.MODEL_BASE_URL !== undefined && { model: modelSettings(config, config.MODEL_BASE_URL) }),
    checkpointKeep: config.FLEET_CHECKPOINT_KEEP,
    checkpointWorkspaceCapBytes: config.FLEET_CHECKPOINT_WORKSPACE_CAP_BYTES,
    checkpointStagedTtlMs: config.FLEET_CHECKPOINT_STAGED_TTL_MS,
  });
  const [signal] = await Promise.race([once(process, 'SIGTERM'), once(process, 'SIGINT')]);
  log.info({ signal, running: handle.running.size, drainTimeoutMs: config.FLEET_DRAIN_TIMEOUT_MS }, 'draining');
  await handle.close();
  return 0;
}

export async function enqueueCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: { wait: { type: 'boolean' }, json: { type: 'boolean' }, 'timeout-ms': { type: 'string' } },
  });
  const file = positionals[0];
  if (file === undefined || positionals.length > 1) throw new UsageError('usage: rollout-fleet enqueue <batch.yaml> [--wait [--timeout-ms N]] [--json]');
  const timeoutMs = positive('timeout-ms', values['timeout-ms']) ?? Infinity;
  const { config, docker } = cli;
  const loaded = await loadBatch(file);
  const redis = await connectProducer(requireRedisUrl(config));
  const flows = flowProducer(redis, config.FLEET_PREFIX);
  const queue = episodesQueue(redis, config.FLEET_PREFIX);
  try {
    const results = new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
    const plan = await enqueueBatch(loaded, { flows, redis, prefix: config.FLEET_PREFIX, results, imageExists: imageChecker(docker) });
    if (!plan.added) process.stderr.write(`batch ${plan.batchId} was enqueued before; nothing added\n`);
    if (!values.wait) {
      process.stdout.write(values.json ? `${JSON.stringify({ batchId: plan.batchId, episodes: plan.jobs.length, added: plan.added })}\n` : `${plan.batchId}\n`);
      return 0;
    }
    const summary = await waitForBatch(results, queue, plan.batchId, progressView(process.stderr), timeoutMs);
    process.stdout.write(values.json ? `${JSON.stringify(summary)}\n` : `${formatSummary(summary)}\n`);
    // Exit 4: the wait timed out before every episode had a result (the batch goes on).
    return summary.finished ? 0 : 4;
  } finally {
    await flows.close();
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
    const s = await new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR).summary(batchId);
    if (s === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis (prefix ${config.FLEET_PREFIX})`);
    process.stdout.write(values.json ? `${JSON.stringify(s)}\n` : `${formatSummary(s)}\n`);
    return 0;
  } finally {
    await redis.quit();
  }
}

export async function resultsCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { format: { type: 'string', default: 'jsonl' } } });
  const batchId = positionals[0];
  if (batchId === undefined) throw new UsageError('usage: rollout-fleet results <batch-id> [--format jsonl|csv]');
  if (values.format !== 'jsonl' && values.format !== 'csv') throw new UsageError(`--format: expected jsonl or csv, got ${JSON.stringify(values.format)}`);
  const { config } = cli;
  const redis = await connectProducer(requireRedisUrl(config));
  try {
    const store = new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
    if ((await store.getManifest(batchId)) === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    const results = await store.results(batchId);
    process.stdout.write(values.format === 'csv' ? resultsCsv(results) : results.map((r) => `${JSON.stringify(r)}\n`).join(''));
    return 0;
  } finally {
    await redis.quit();
  }
}

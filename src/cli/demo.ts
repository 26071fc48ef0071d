// `rollout-fleet demo`: the main job on embedded defaults. Starts a private Redis when REDIS_URL is not
// set and the scripted policy server when MODEL_BASE_URL is not set, runs two worker processes,
// enqueues the example batch (the reference LLM agent on every example task), waits, prints the
// summary, waits for the cleanup queue to remove every sandbox, and stops everything it started.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { PACKAGE_ROOT, execArgvFor, siblingModule } from '../package-paths.ts';
import { LABEL } from '../sandbox/labels.ts';
import { enqueueBatch } from '../producer/enqueue-batch.ts';
import { ResultsStore } from '../results/results-store.ts';
import { formatSummary } from '../results/batch-summary.ts';
import { loadBatch } from '../tasks/load-task.ts';
import { progressView, waitForBatch } from './progress.ts';
import { COMMANDS } from './command-table.ts';
import { UsageError, connectProducer, type Cli } from './context.ts';
import { episodesQueue, flowProducer, imageChecker } from './queue-clients.ts';
import { startPrivateRedis, type PrivateRedis } from './private-redis.ts';
import { startModelStub, type ModelStub } from '../model/model-stub.ts';

/** The CLI this demo runs in: its workers run the same build (or the same sources, under tsx). */
const BIN = siblingModule(import.meta.url, 'bin');
const DEMO_BATCH = path.join(PACKAGE_ROOT, 'examples/demo-batch.yaml');
const EXAMPLE_TASKS = path.join(PACKAGE_ROOT, 'examples/tasks');
const DEMO_WORKERS = 2;

async function poll(what: string, timeoutMs: number, check: () => Promise<boolean>): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

export async function demoCommand(cli: Cli, args: string[]): Promise<number> {
  parseArgs({ args, options: COMMANDS.demo.options });
  const { config, log } = cli;
  const docker = await cli.docker();
  await docker.ping().catch((err: unknown) => {
    throw new UsageError(`no Docker engine answers at ${config.DOCKER_HOST} (${(err as Error).message}); run \`npm run demo\`, which starts one`);
  });
  let redis: PrivateRedis | undefined;
  let stub: ModelStub | undefined;
  const workers: ChildProcess[] = [];
  try {
    if (config.REDIS_URL === undefined) {
      redis = await startPrivateRedis();
      process.stderr.write(`demo: private redis-server at ${redis.url}\n`);
    }
    const redisUrl = config.REDIS_URL ?? redis!.url;
    if (config.MODEL_BASE_URL === undefined) {
      stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0, host: '127.0.0.1' }, log: log.child({ component: 'model-stub' }) });
      process.stderr.write(`demo: no MODEL_BASE_URL, so the scripted policy server stands in for a model at ${stub.baseUrl}\n`);
    }
    const modelUrl = config.MODEL_BASE_URL ?? stub!.baseUrl!;
    const logDir = path.join(config.FLEET_DATA_DIR, 'logs');
    await mkdir(logDir, { recursive: true });
    for (let i = 0; i < DEMO_WORKERS; i++) {
      const logFile = createWriteStream(path.join(logDir, `demo-worker-${i}.log`));
      await once(logFile, 'open');
      const child = spawn(process.execPath, [...execArgvFor(BIN), BIN, 'worker'], {
        env: { ...process.env, REDIS_URL: redisUrl, MODEL_BASE_URL: modelUrl, FLEET_DATA_DIR: config.FLEET_DATA_DIR, FLEET_WORKER_ID: `demo-worker-${i}` },
        stdio: ['ignore', logFile, logFile],
      });
      workers.push(child);
    }
    process.stderr.write(`demo: ${DEMO_WORKERS} workers running, logs in ${logDir}\n`);

    const producer = await connectProducer(redisUrl);
    const queue = episodesQueue(producer, config.FLEET_PREFIX);
    const flows = flowProducer(producer, config.FLEET_PREFIX);
    try {
      const results = new ResultsStore(producer, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
      const plan = await enqueueBatch(await loadBatch(DEMO_BATCH), {
        flows, redis: producer, prefix: config.FLEET_PREFIX, results, imageExists: imageChecker(docker),
      });
      process.stderr.write(`demo: enqueued batch ${plan.batchId} (${plan.jobs.length} episodes)\n`);
      const summary = await waitForBatch(results, queue, producer, plan.batchId, progressView(process.stderr), 15 * 60_000);
      if (!summary.finished) throw new Error(`the demo batch did not finish within 15 minutes (${summary.done}/${summary.total}); see ${logDir}`);
      await poll('the cleanup queue to remove every sandbox', 120_000, async () =>
        (await docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } })).length === 0);
      for (const r of await results.results(plan.batchId)) {
        const extra = r.error ? ` ${r.error.kind}/${r.error.code}` : '';
        const tokens = r.usage ? `, ${r.usage.totalTokens} tokens` : '';
        process.stdout.write(`  ${r.status.padEnd(8)} reward ${r.reward ?? '-'}  ${r.episodeId}${extra}  (${r.timings.totalMs} ms${tokens})\n`);
      }
      process.stdout.write(`${formatSummary(summary)}\n  results in ${path.join(config.FLEET_DATA_DIR, 'results', plan.batchId)}\n`);
      return summary.byStatus.error === 0 ? 0 : 1;
    } finally {
      await flows.close();
      await queue.close();
      await producer.quit();
    }
  } finally {
    await Promise.all(workers.map(async (w) => {
      if (w.exitCode === null && w.signalCode === null) {
        w.kill('SIGTERM');
        await once(w, 'exit');
      }
    }));
    await stub?.close();
    await redis?.stop();
  }
}

// `rollout-fleet enqueue <batch.yaml>`: validate a batch and enqueue its episodes through the client;
// with --wait, follow its progress and print the summary.
import { parseArgs } from 'node:util';
import { formatSummary } from '../results/batch-summary.ts';
import { ResultsStore } from '../results/results-store.ts';
import { COMMANDS, ENQUEUE_OPTIONS, commandUsage } from './command-table.ts';
import { cliClient } from './cli-client.ts';
import { UsageError, connectProducer, positiveOption, requireRedisUrl, type Cli } from './context.ts';
import { progressView, waitForBatch } from './progress.ts';
import { episodesQueue, imageChecker } from './queue-clients.ts';

export async function enqueueCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: ENQUEUE_OPTIONS });
  const file = positionals[0];
  if (file === undefined || positionals.length > 1) throw new UsageError(`expected one batch file\n${commandUsage('enqueue', COMMANDS.enqueue)}`);
  const timeoutMs = positiveOption('timeout-ms', values['timeout-ms']) ?? Infinity;
  const { config } = cli;
  const docker = await cli.docker();
  // The fleet's connection for the image check (live hosts' facts) and the wait's progress.
  const redis = await connectProducer(requireRedisUrl(config));
  const client = await cliClient(cli, { imageExists: imageChecker(docker, { redis, prefix: config.FLEET_PREFIX }) }).catch(async (err: unknown) => {
    await redis.quit().catch(() => redis.disconnect());
    throw err;
  });
  // Made only to follow the batch: a Queue writes its meta key when made, and a rejected batch must
  // leave Redis as it found it.
  let queue: ReturnType<typeof episodesQueue> | undefined;
  try {
    const plan = await client.enqueue(file);
    if (!plan.added) process.stderr.write(`batch ${plan.batchId} was enqueued before; nothing added\n`);
    if (!values.wait) {
      process.stdout.write(values.json ? `${JSON.stringify({ batchId: plan.batchId, episodes: plan.jobs.length, added: plan.added })}\n` : `${plan.batchId}\n`);
      return 0;
    }
    queue = episodesQueue(redis, config.FLEET_PREFIX);
    queue.on('error', () => undefined);
    const results = new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
    const summary = await waitForBatch(results, queue, redis, plan.batchId, progressView(process.stderr), timeoutMs);
    process.stdout.write(values.json ? `${JSON.stringify(summary)}\n` : `${formatSummary(summary)}\n`);
    // Exit 4: the wait timed out before every episode had a result (the batch goes on).
    return summary.finished ? 0 : 4;
  } finally {
    await client.close();
    await queue?.close();
    await redis.quit().catch(() => redis.disconnect());
  }
}


// `rollout-fleet status <batch-id>`: a batch's summary from Redis. Loads only ioredis, zod and the
// results code (no BullMQ, no dockerode): it is the command people run in a loop.
import { parseArgs } from 'node:util';
import { formatSummary } from '../results/batch-summary.ts';
import { ResultsStore } from '../results/results-store.ts';
import { COMMANDS, STATUS_OPTIONS, commandUsage } from './command-table.ts';
import { UsageError, connectProducer, requireRedisUrl, type Cli } from './context.ts';

export async function statusCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: STATUS_OPTIONS });
  const batchId = positionals[0];
  if (batchId === undefined || positionals.length > 1) throw new UsageError(`expected one batch id\n${commandUsage('status', COMMANDS.status)}`);
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


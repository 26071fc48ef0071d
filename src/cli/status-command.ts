// `rollout-fleet status <batch-id>`: a batch's summary from Redis, through the client. Loads no BullMQ
// and no dockerode (the client loads BullMQ only to enqueue or steer): it is the command people run in a loop.
import { parseArgs } from 'node:util';
import { formatSummary } from '../results/batch-summary.ts';
import { COMMANDS, STATUS_OPTIONS, commandUsage } from './command-table.ts';
import { cliClient } from './cli-client.ts';
import { UsageError, type Cli } from './context.ts';

export async function statusCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: STATUS_OPTIONS });
  const batchId = positionals[0];
  if (batchId === undefined || positionals.length > 1) throw new UsageError(`expected one batch id\n${commandUsage('status', COMMANDS.status)}`);
  const client = await cliClient(cli);
  try {
    const s = await client.status(batchId);
    if (s === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis (prefix ${cli.config.FLEET_PREFIX})`);
    process.stdout.write(values.json ? `${JSON.stringify(s)}\n` : `${formatSummary(s)}\n`);
    return 0;
  } finally {
    await client.close();
  }
}


// `rollout-fleet results <batch-id>`: every result of a batch recorded so far, as JSON lines, CSV or
// trajectories, through the client.
import { parseArgs } from 'node:util';
import { once } from 'node:events';
import { resultsCsv } from '../results/results-csv.ts';
import { cliClient } from './cli-client.ts';
import { COMMANDS, RESULTS_OPTIONS, commandUsage } from './command-table.ts';
import { UsageError, type Cli } from './context.ts';

export async function resultsCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: RESULTS_OPTIONS });
  const batchId = positionals[0];
  if (batchId === undefined || positionals.length > 1) throw new UsageError(`expected one batch id\n${commandUsage('results', COMMANDS.results)}`);
  if (values.format !== 'jsonl' && values.format !== 'csv' && values.format !== 'trajectories') {
    throw new UsageError(`--format: expected jsonl, csv or trajectories, got ${JSON.stringify(values.format)}`);
  }
  const client = await cliClient(cli);
  try {
    const results = await client.resultsSoFar(batchId);
    if (results === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    if (values.format === 'trajectories') {
      for await (const record of client.trajectories(results, AbortSignal.timeout(10 * 60_000))) {
        if (!process.stdout.write(`${JSON.stringify(record)}\n`)) await once(process.stdout, 'drain');
      }
      return 0;
    }
    process.stdout.write(values.format === 'csv' ? resultsCsv(results) : results.map((r) => `${JSON.stringify(r)}\n`).join(''));
    return 0;
  } finally {
    await client.close();
  }
}

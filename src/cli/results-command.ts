// `rollout-fleet results <batch-id>`: every result of a batch recorded so far, as JSON lines, CSV or
// trajectories, in the manifest's order, read and written a page at a time, through the client.
import { parseArgs } from 'node:util';
import { once } from 'node:events';
import { csvHeader, csvRow } from '../results/results-csv.ts';
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
    const pages = await client.resultPages(batchId);
    if (pages === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    // A reader slower than the output (a pipe) holds back the next page, not the whole batch in memory.
    const write = async (text: string) => {
      if (!process.stdout.write(text)) await once(process.stdout, 'drain');
    };
    if (values.format === 'trajectories') {
      const signal = AbortSignal.timeout(10 * 60_000);
      for await (const page of pages) {
        for await (const record of client.trajectories(page, signal)) {
          await write(`${JSON.stringify(record)}\n`);
        }
      }
      return 0;
    }
    const csv = values.format === 'csv';
    if (csv) await write(`${csvHeader()}\n`);
    for await (const page of pages) {
      await write(page.map((r) => `${csv ? csvRow(r) : JSON.stringify(r)}\n`).join(''));
    }
    return 0;
  } finally {
    await client.close();
  }
}

// `rollout-fleet results <batch-id>`: every result of a batch recorded so far, as JSON lines or CSV.
import { parseArgs } from 'node:util';
import { once } from 'node:events';
import { openArtifactStore } from '../artifacts/open-store.ts';
import { resultsCsv } from '../results/results-csv.ts';
import { trajectoryRecords } from '../results/trajectory-export.ts';
import { ResultsStore } from '../results/results-store.ts';
import { COMMANDS, RESULTS_OPTIONS, commandUsage } from './command-table.ts';
import { UsageError, connectProducer, requireRedisUrl, type Cli } from './context.ts';

export async function resultsCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: RESULTS_OPTIONS });
  const batchId = positionals[0];
  if (batchId === undefined || positionals.length > 1) throw new UsageError(`expected one batch id\n${commandUsage('results', COMMANDS.results)}`);
  if (values.format !== 'jsonl' && values.format !== 'csv' && values.format !== 'trajectories') {
    throw new UsageError(`--format: expected jsonl, csv or trajectories, got ${JSON.stringify(values.format)}`);
  }
  const { config } = cli;
  const redis = await connectProducer(requireRedisUrl(config));
  try {
    const store = new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
    if ((await store.getManifest(batchId)) === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    const results = await store.results(batchId);
    if (values.format === 'trajectories') {
      const artifacts = openArtifactStore(config.FLEET_ARTIFACTS, config.FLEET_DATA_DIR);
      for await (const record of trajectoryRecords(results, artifacts, AbortSignal.timeout(10 * 60_000))) {
        if (!process.stdout.write(`${JSON.stringify(record)}\n`)) await once(process.stdout, 'drain');
      }
      return 0;
    }
    process.stdout.write(values.format === 'csv' ? resultsCsv(results) : results.map((r) => `${JSON.stringify(r)}\n`).join(''));
    return 0;
  } finally {
    await redis.quit();
  }
}

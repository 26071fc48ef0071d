// `rollout-fleet results <batch-id>`: every result of a batch recorded so far, as JSON lines or CSV,
// in the manifest's order, read and written a page at a time.
import { parseArgs } from 'node:util';
import { once } from 'node:events';
import { csvHeader, csvRow } from '../results/results-csv.ts';
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
    const manifest = await store.getManifest(batchId);
    if (manifest === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    // A reader slower than the output (a pipe) holds back the next page, not the whole batch in memory.
    const write = async (text: string) => {
      if (!process.stdout.write(text)) await once(process.stdout, 'drain');
    };
    if (values.format === 'trajectories') {
      // Loaded for this format only: the S3 client alone took ~0.5 s to load, for every format.
      const [{ openArtifactStore }, { trajectoryRecords }] = await Promise.all([import('../artifacts/open-store.ts'), import('../results/trajectory-export.ts')]);
      const artifacts = openArtifactStore(config.FLEET_ARTIFACTS, config.FLEET_DATA_DIR);
      for await (const record of trajectoryRecords(await store.results(batchId, manifest), artifacts, AbortSignal.timeout(10 * 60_000))) {
        await write(`${JSON.stringify(record)}\n`);
      }
      return 0;
    }
    const csv = values.format === 'csv';
    if (csv) await write(`${csvHeader()}\n`);
    for await (const page of store.resultPages(batchId, manifest)) {
      await write(page.map((r) => `${csv ? csvRow(r) : JSON.stringify(r)}\n`).join(''));
    }
    return 0;
  } finally {
    await redis.quit();
  }
}

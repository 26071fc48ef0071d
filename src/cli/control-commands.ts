// `rollout-fleet cancel` and `rollout-fleet retry`: steering episodes that are queued or running.
import { parseArgs } from 'node:util';
import { EpisodeControl } from '../episode/episode-control.ts';
import { FAILURE_KINDS, isFailureKind } from '../errors/failure-kind.ts';
import { cancelEpisode, waitForResult, type CancelOutcome } from '../producer/cancel-episodes.ts';
import { retryByKind } from '../producer/retry-by-kind.ts';
import { ResultsStore } from '../results/results-store.ts';
import { CANCEL_OPTIONS, COMMANDS, RETRY_OPTIONS, commandUsage } from './command-table.ts';
import { UsageError, connectProducer, requireRedisUrl, type Cli } from './context.ts';
import { episodesQueue } from './queue-clients.ts';

/** Exit code of a cancel that met an episode already closing. */
export const EXIT_CONFLICT = 3;

async function producerParts(cli: Cli) {
  const { config } = cli;
  const redis = await connectProducer(requireRedisUrl(config));
  const queue = episodesQueue(redis, config.FLEET_PREFIX);
  const results = new ResultsStore(redis, config.FLEET_PREFIX, config.FLEET_DATA_DIR);
  const control = new EpisodeControl(redis, config.FLEET_PREFIX);
  return {
    redis, queue, results, control,
    async close() {
      await queue.close();
      await redis.quit();
    },
  };
}

export async function cancelCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: CANCEL_OPTIONS });
  const target = positionals[0];
  if (target === undefined || positionals.length > 1) throw new UsageError(`expected one episode or batch id\n${commandUsage('cancel', COMMANDS.cancel)}`);
  const waitMs = Number(values['wait-ms']);
  if (!Number.isFinite(waitMs) || waitMs < 0) throw new UsageError(`--wait-ms: expected a number of milliseconds, got ${JSON.stringify(values['wait-ms'])}`);
  const parts = await producerParts(cli);
  try {
    const manifest = await parts.results.getManifest(target);
    const episodes = manifest
      ? manifest.episodeIds
      : [target];
    const deps = { queue: parts.queue, results: parts.results, control: parts.control, by: 'cli-cancel' };
    const outcomes = new Map<string, CancelOutcome>();
    for (const id of episodes) outcomes.set(id, await cancelEpisode(deps, id));
    if (!manifest && outcomes.get(target) === 'unknown') throw new UsageError(`no episode or batch ${JSON.stringify(target)} in this Redis`);

    let conflict = false;
    for (const [id, outcome] of outcomes) {
      if (manifest && outcome === 'ended') continue;
      const batchId = manifest?.batchId ?? ((await parts.queue.getJob(id))?.data as { batchId?: string } | undefined)?.batchId ?? '';
      if (outcome === 'cancelled') process.stdout.write(`${id}: cancelled (it was waiting)\n`);
      else if (outcome === 'ended') process.stdout.write(`${id}: already ended (${(await parts.results.get(batchId, id))?.status ?? 'unknown'})\n`);
      else if (outcome === 'unknown') process.stdout.write(`${id}: not in the queue\n`);
      else {
        const result = await waitForResult(parts.results, batchId, id, waitMs);
        if (outcome === 'closing') {
          conflict = true;
          process.stdout.write(`${id}: conflict: already closing, the close was not interrupted; it ended ${result?.status ?? '(still closing)'}\n`);
        } else {
          process.stdout.write(`${id}: ${result ? `${result.status} (it was running)` : 'cancel requested; no result yet'}\n`);
        }
      }
    }
    return conflict ? EXIT_CONFLICT : 0;
  } finally {
    await parts.close();
  }
}

export async function retryCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: RETRY_OPTIONS });
  const batchId = positionals[0];
  const kind = values.kind;
  if (batchId === undefined || positionals.length > 1 || kind === undefined) throw new UsageError(`expected one batch id and --kind\n${commandUsage('retry', COMMANDS.retry)}`);
  if (!isFailureKind(kind)) throw new UsageError(`--kind: expected one of ${FAILURE_KINDS.join(', ')}, got ${JSON.stringify(kind)}`);
  const parts = await producerParts(cli);
  try {
    if ((await parts.results.getManifest(batchId)) === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    const { config } = cli;
    const report = await retryByKind({ queue: parts.queue, redis: parts.redis, prefix: config.FLEET_PREFIX, results: parts.results, control: parts.control }, batchId, kind);
    for (const id of report.requeued) process.stdout.write(`${id}: requeued\n`);
    for (const id of report.missing) process.stdout.write(`${id}: not retried (its job is no longer kept)\n`);
    for (const id of report.pending) process.stdout.write(`${id}: not retried (its job is queued or running already)\n`);
    process.stdout.write(`${report.requeued.length} episode(s) of kind ${kind} requeued\n`);
    return 0;
  } finally {
    await parts.close();
  }
}

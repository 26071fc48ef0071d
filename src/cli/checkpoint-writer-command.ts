// `rollout-fleet checkpoint-writer`: run only the checkpoint writer (the `checkpoints` queue's Worker)
// until SIGTERM or SIGINT, then close it gracefully: no new jobs, the ones being written finish.
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { RedisOutageLog } from '../redis/outage-log.ts';
import { startCheckpointWriter } from '../worker/checkpoint-writer.ts';
import { CHECKPOINT_WRITER_OPTIONS } from './command-table.ts';
import { UsageError, requireRedisUrl, type Cli } from './context.ts';
import { openArtifactStore } from '../artifacts/open-store.ts';

export async function checkpointWriterCommand(cli: Cli, args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: CHECKPOINT_WRITER_OPTIONS });
  const { config, log } = cli;
  let concurrency = config.FLEET_CHECKPOINT_WRITER_CONCURRENCY;
  if (values.concurrency !== undefined) {
    concurrency = Number(values.concurrency);
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new UsageError(`--concurrency: expected an integer from 1 up, got ${JSON.stringify(values.concurrency)}`);
  }
  // Listen before anything starts: a SIGTERM during start-up still closes gracefully.
  const stop = Promise.race([once(process, 'SIGTERM'), once(process, 'SIGINT')]);
  const name = config.FLEET_WORKER_ID;
  const connection = new Redis(requireRedisUrl(config), { maxRetriesPerRequest: null, connectionName: `rf-checkpoint-writer-${name}` });
  // An outage is logged once per connection and its recovery with a count, not once per reconnect.
  const outages = new RedisOutageLog(log);
  outages.watchClient(connection, 'connection');
  const writer = startCheckpointWriter({
    onError: outages.listener('checkpoints-worker', 'worker error', 'error'),
    connection,
    prefix: config.FLEET_PREFIX,
    dataDir: config.FLEET_DATA_DIR,
    artifacts: openArtifactStore(config.FLEET_ARTIFACTS, config.FLEET_DATA_DIR),
    log,
    name,
    concurrency,
    lockDurationMs: config.FLEET_LOCK_DURATION_MS,
    keep: config.FLEET_CHECKPOINT_KEEP,
  });
  await writer.waitUntilReady();
  log.info({ workerId: name, concurrency, keep: config.FLEET_CHECKPOINT_KEEP }, 'checkpoint writer started');
  const [signal] = await stop;
  log.info({ signal }, 'checkpoint writer stopping');
  await writer.close();
  await connection.quit().catch(() => connection.disconnect());
  log.info({ workerId: name }, 'checkpoint writer stopped');
  return 0;
}

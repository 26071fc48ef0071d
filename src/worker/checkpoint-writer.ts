// The checkpoint writer: a BullMQ Worker on the `checkpoints` queue. Runs inside every worker process
// and, on its own, as `rollout-fleet checkpoint-writer`; writers sharing a data folder coordinate
// latest.json through a per-episode lock in Redis.
import { Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { CHECKPOINTS_QUEUE } from '../checkpoints/checkpoint-job.ts';
import { checkpointProcessor } from '../../queues/checkpoints/processor.ts';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { FolderStore } from '../artifacts/folder-store.ts';
import { checkpointStorage } from '../checkpoints/open-checkpoint-storage.ts';
import { redisEpisodeLock } from '../checkpoints/episode-lock.ts';

export interface CheckpointWriterOptions {
  /** Shared with the caller, who closes it after the writer. */
  connection: Redis;
  prefix: string;
  dataDir: string;
  log: Logger;
  /** This writer's name in BullMQ (the worker id). */
  name: string;
  /** Checkpoints written at once. @default 4 */
  concurrency?: number;
  /** BullMQ lock duration; a job of a killed writer is taken over after about this long. @default 30000 */
  lockDurationMs?: number;
  /** Checkpoints kept per episode. @default 5 */
  keep?: number;
  /** Where checkpoints go (FLEET_ARTIFACTS). @default the data folder */
  artifacts?: ArtifactStore;
  /** The Worker's error listener. @default logs every error */
  onError?: (err: Error) => void;
}

export function startCheckpointWriter(opts: CheckpointWriterOptions): Worker {
  const { connection, prefix, log } = opts;
  const lockDuration = opts.lockDurationMs ?? 30_000;
  const store = checkpointStorage(opts.artifacts ?? new FolderStore(opts.dataDir), connection, prefix, { keep: opts.keep ?? 5, lock: redisEpisodeLock(connection, prefix) });
  const worker = new Worker(CHECKPOINTS_QUEUE, checkpointProcessor({ store, redis: connection, prefix, log }), {
    connection,
    prefix,
    name: opts.name,
    concurrency: opts.concurrency ?? 4,
    lockDuration,
    stalledInterval: lockDuration,
    // Writing is idempotent, so a job whose writer was killed (again) is simply written again.
    maxStalledCount: 10,
  });
  worker.on('error', opts.onError ?? ((err) => log.error({ queue: CHECKPOINTS_QUEUE, err: err.message }, 'worker error')));
  worker.on('failed', (job, err) => log.warn({ jobId: job?.id, attemptsMade: job?.attemptsMade, err: err.message }, 'checkpoint write failed'));
  return worker;
}

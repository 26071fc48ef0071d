// Thin processor of the `checkpoints` queue: parse, load the staged checkpoint, persist it atomically,
// then delete the stage. A retried job (the writer died somewhere along the way) finds either the stage
// (and writes, or finds its folder already there) or, once the stage is deleted, the folder on disk.
import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { CheckpointStorage } from '../../src/checkpoints/checkpoint-storage.ts';
import { InvalidStagedCheckpoint, loadStaged } from '../../src/checkpoints/checkpoint-staging.ts';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { checkpointFenceKey, checkpointStagedKeyPrefix } from '../../src/redis/redis-keys.ts';
import { CheckpointJob, type CheckpointResult } from './contract.ts';

export interface CheckpointProcessorDeps {
  store: CheckpointStorage;
  /** Where the stages are (the fleet's Redis). */
  redis: Redis;
  prefix: string;
  log: Logger;
}

export function checkpointProcessor(deps: CheckpointProcessorDeps) {
  const { store, redis, prefix } = deps;
  return async (job: Job): Promise<CheckpointResult> => {
    const parsed = CheckpointJob.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(`invalid checkpoint job: ${describeIssues(parsed.error, job.data).join('; ')}`);
    const { episodeId, seq, stagedKey } = parsed.data;
    // The writer deletes this key afterwards: never let a payload name an arbitrary key.
    if (!stagedKey.startsWith(checkpointStagedKeyPrefix(prefix))) throw new UnrecoverableError(`invalid checkpoint job: stagedKey: not a checkpoint stage (got ${JSON.stringify(stagedKey)})`);
    const log = deps.log.child({ episodeId, seq, jobId: job.id });

    let staged;
    try {
      staged = await loadStaged(redis, stagedKey);
    } catch (err) {
      if (err instanceof InvalidStagedCheckpoint) throw new UnrecoverableError(err.message);
      throw err;
    }
    if (staged === undefined) {
      // Deleted after an earlier attempt wrote it (the writer died before completing the job), or expired.
      const onDisk = await store.read(episodeId, seq);
      if (onDisk) return { outcome: 'already-written', latest: (await store.latest(episodeId))?.seq ?? seq, dir: onDisk.dir, durableAt: new Date().toISOString() };
      const newer = (await store.seqs(episodeId)).filter((s) => s > seq).length;
      if (newer >= store.keep) return { outcome: 'superseded', latest: (await store.latest(episodeId))?.seq ?? -1, durableAt: new Date().toISOString() };
      throw new UnrecoverableError(`staged checkpoint ${stagedKey} is gone (expired?) and seq ${seq} is not on disk`);
    }
    if (staged.checkpoint.episodeId !== episodeId || staged.checkpoint.seq !== seq) {
      throw new UnrecoverableError(`staged checkpoint ${stagedKey} is ${staged.checkpoint.episodeId} seq ${staged.checkpoint.seq}, the job says ${episodeId} seq ${seq}`);
    }
    // The episode has its result: its checkpoints are removed, and stay removed (the fence), however late this job runs.
    const fence = checkpointFenceKey(prefix, episodeId);
    if (await redis.exists(fence)) {
      await redis.del(stagedKey);
      return { outcome: 'fenced', latest: -1, durableAt: new Date().toISOString() };
    }
    const t0 = performance.now();
    const result = await store.write(staged.checkpoint, staged.workspace);
    const durableAt = new Date();
    await redis.del(stagedKey);
    if (await redis.exists(fence)) {
      // The result came while this was written, and its removal may have run before the write: remove again.
      await store.remove(episodeId);
      log.info('checkpoint written as the episode got its result: removed again');
      return { outcome: 'fenced', latest: -1, durableAt: durableAt.toISOString() };
    }
    log.debug({
      outcome: result.outcome,
      latest: result.latest,
      writeMs: Math.round(performance.now() - t0),
      lagMs: durableAt.getTime() - Date.parse(staged.checkpoint.createdAt),
    }, 'checkpoint persisted');
    return { ...result, durableAt: durableAt.toISOString() };
  };
}

// A checkpoint between the sink and the writer lives in one Redis hash per hand-off (fields
// `checkpoint`: JSON, `workspace`: tar bytes), with a TTL, so the queue's job payload stays a few
// bytes and an orphaned stage (a worker that died between staging and enqueueing) expires by itself.
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { checkpointStagedKey } from '../redis/redis-keys.ts';
import { Checkpoint } from './checkpoint.ts';

/** A fresh key per hand-off: a second hand-off of the same seq never overwrites a stage in use. */
export const newStagedKey = (prefix: string, jobId: string) => checkpointStagedKey(prefix, jobId, randomBytes(6).toString('hex'));

export async function stageCheckpoint(redis: Redis, key: string, checkpoint: Checkpoint, workspace: Buffer | undefined, ttlMs: number): Promise<void> {
  const fields: Record<string, string | Buffer> = { checkpoint: JSON.stringify(checkpoint) };
  if (workspace !== undefined) fields.workspace = workspace;
  const replies = await redis.multi().hset(key, fields).pexpire(key, ttlMs).exec();
  const failed = replies?.find(([err]) => err !== null);
  if (replies === null || failed) throw new Error(`staging ${key} failed: ${failed?.[0]?.message ?? 'transaction aborted'}`);
}

export interface StagedCheckpoint {
  checkpoint: Checkpoint;
  workspace?: Buffer;
}

/** A stage that cannot be a checkpoint: retrying will not help. */
export class InvalidStagedCheckpoint extends Error {
  override readonly name = 'InvalidStagedCheckpoint';
}

/**
 * The staged checkpoint, or undefined when it is gone (written and deleted, superseded, or expired).
 * Throws InvalidStagedCheckpoint for a malformed stage; Redis errors pass through (worth a retry).
 */
export async function loadStaged(redis: Redis, key: string): Promise<StagedCheckpoint | undefined> {
  const fields = await redis.hgetallBuffer(key);
  const json = fields.checkpoint;
  if (json === undefined) return undefined;
  let checkpoint: Checkpoint;
  try {
    checkpoint = Checkpoint.parse(JSON.parse(json.toString('utf8')));
  } catch (err) {
    throw new InvalidStagedCheckpoint(`staged checkpoint ${key} is not a checkpoint: ${(err as Error).message}`, { cause: err });
  }
  const workspace = fields.workspace;
  if (checkpoint.workspace.captured && workspace?.length !== checkpoint.workspace.bytes) {
    throw new InvalidStagedCheckpoint(`staged workspace of ${key} has ${workspace?.length ?? 0} bytes, the checkpoint says ${checkpoint.workspace.bytes}`);
  }
  return { checkpoint, ...(checkpoint.workspace.captured && workspace && { workspace }) };
}

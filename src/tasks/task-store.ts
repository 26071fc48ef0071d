// Content-addressed store of packed tasks in Redis, so workers on any host can fetch what a job names
// by digest without a shared file system. The key is the content's digest, so writing it again (which
// refreshes its expiry) cannot change it; the digest is checked on read.
import type { Redis } from 'ioredis';
import { FleetError } from '../errors/fleet-error.ts';
import { taskArchiveKey } from '../redis/redis-keys.ts';
import { TaskArchive } from './task-archive.ts';
import type { PackedTask } from './pack-task.ts';

/** Task archives outlive the jobs that name them by this long after their last enqueue. */
const TASK_ARCHIVE_TTL_SEC = 30 * 24 * 3600;

export async function putTaskArchive(redis: Redis, prefix: string, packed: PackedTask): Promise<void> {
  await redis.set(taskArchiveKey(prefix, packed.digest), packed.archive, 'EX', TASK_ARCHIVE_TTL_SEC);
}

/** Push back a stored archive's expiry; false when it is not stored (any more). */
export async function touchTaskArchive(redis: Redis, prefix: string, digest: string): Promise<boolean> {
  return (await redis.expire(taskArchiveKey(prefix, digest), TASK_ARCHIVE_TTL_SEC)) === 1;
}

export async function getTaskArchive(redis: Redis, prefix: string, digest: string): Promise<TaskArchive> {
  const archive = await redis.getBuffer(taskArchiveKey(prefix, digest));
  if (archive === null) {
    throw new FleetError('task_archive_missing', `task archive ${digest} is not in the store (expired or never enqueued)`);
  }
  return TaskArchive.fromBuffer(archive, digest);
}

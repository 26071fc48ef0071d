// Remove runtime generation volumes nobody used for a while: not prepared for `maxIdleMs` (per the
// fleet's last-used hash, or since creation if never recorded), mounted by no container, and not locked
// by an installer. Meant for the cleanup queue's scheduled job; safe to run from any process.
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { runtimeLastUsedKey, runtimeLockKey } from '../redis/redis-keys.ts';
import { tryLock } from '../redis/token-lock.ts';
import { engineId, type Docker } from '../sandbox/docker-client.ts';
import { LABEL } from '../sandbox/labels.ts';
import { containersUsingVolume, listVolumes, removeVolume } from '../sandbox/volumes.ts';
import { removeContainer } from '../sandbox/sandbox-session.ts';
import { distrustVolume } from './prepare-runtime.ts';

export interface StaleGenerationDeps {
  docker: Docker;
  redis: Redis;
  prefix: string;
  log: Logger;
}

export interface RemoveStaleOptions {
  /**
   * Remove generations not prepared for this long. Keep it far above the longest episode and the
   * trust window of prepareRuntime (30 s): a worker that trusts a volume does not look again.
   */
  maxIdleMs: number;
  /** Deadline of each Docker call. @default 30000 */
  callTimeoutMs?: number;
  /** The current time, for tests. @default Date.now() */
  nowMs?: number;
}

export interface RemoveStaleResult {
  /** Names of the volumes removed. */
  removed: string[];
  /** Generation volumes left in place (recent, mounted or locked). */
  kept: number;
}

export async function removeStaleGenerations(deps: StaleGenerationDeps, opts: RemoveStaleOptions): Promise<RemoveStaleResult> {
  if (!Number.isFinite(opts.maxIdleMs) || opts.maxIdleMs <= 0) {
    throw new TypeError(`Expected \`maxIdleMs\` to be a positive number, got \`${String(opts.maxIdleMs)}\``);
  }
  const { docker, redis, prefix, log } = deps;
  const call = { timeoutMs: opts.callTimeoutMs ?? 30_000 };
  const now = opts.nowMs ?? Date.now();
  const volumes = await listVolumes(docker, [LABEL.runtimeGeneration, `${LABEL.prefix}=${prefix}`], call);
  const lastUsed = await redis.hgetall(runtimeLastUsedKey(prefix));
  const idleSince = (id: string, createdAt: string) => Math.max(Number(lastUsed[id] ?? 0), Date.parse(createdAt) || 0);
  const removed: string[] = [];

  for (const volume of volumes) {
    const id = volume.labels[LABEL.runtimeGeneration]!;
    if (now - idleSince(id, volume.createdAt) < opts.maxIdleMs) continue;
    // The install lock keeps installers and repairers out while we decide and remove.
    const lock = await tryLock(redis, runtimeLockKey(prefix, await engineId(docker, call), id), { ttlMs: 30_000, renew: { log } });
    if (!lock) continue;
    try {
      const fresh = Number((await redis.hget(runtimeLastUsedKey(prefix), id)) ?? 0);
      if (now - Math.max(fresh, Date.parse(volume.createdAt) || 0) < opts.maxIdleMs) continue;
      const users = await containersUsingVolume(docker, volume.name, call);
      if (users.some((u) => u.labels[LABEL.runtimeRole] === undefined)) continue;
      // Installer or probe containers a killed worker left behind would keep the volume "in use".
      for (const helper of users) await removeContainer(docker, helper.id, call.timeoutMs);
      if ((await removeVolume(docker, volume.name, call)) === 'in-use') continue;
      distrustVolume(docker, volume.name);
      await redis.hdel(runtimeLastUsedKey(prefix), id);
      removed.push(volume.name);
      log.info({ volumeName: volume.name, generationId: id, idleMs: now - fresh }, 'stale runtime generation removed');
    } finally {
      await lock.release();
    }
  }
  return { removed, kept: volumes.length - removed.length };
}

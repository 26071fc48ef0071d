// Remove built environment images least recently used first until what they hold on the engine is
// within a disk budget. "Used" is when an episode last asked for the image (ensureEnvironmentImage
// records it per engine in Redis, at its build too; an image with no record counts from its build). What an image
// holds is its own layers: the base layers it shares with other images (the stand-in base, a common
// FROM) are not freed by removing it, so the engine's shared size is subtracted. Images asked for
// within `minIdleMs` are kept whatever the budget (an episode may be about to create its container
// from one), as are images a container still uses and images whose build lock is held.
// With a registry (FLEET_REGISTRY) the registry's names of an image (<registry>/rollout-fleet/env:<tag>
// or @sha256:...) are removed after a push or pull; one left by a process killed in between would
// hold the image's layers, so they are removed with the local tag (and an image that has only such a
// name counts as built at its build label).
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { envBuildLockKey, envLastUsedKey } from '../redis/redis-keys.ts';
import { tryLock } from '../redis/token-lock.ts';
import { dockerCall, dockerStatusOf, engineDiskUsage, engineId, type Docker } from '../sandbox/docker-client.ts';
import { LABEL } from '../sandbox/labels.ts';
import { PREPARED_IMAGE_REPOSITORY, prepareContainerPrefix } from '../sandbox/prepared-images.ts';
import { removeContainer } from '../sandbox/remove-container.ts';
import { ENV_IMAGE_REPOSITORY } from './image-build.ts';

export interface PruneDeps {
  docker: Docker;
  redis: Redis;
  /** Only images built under this fleet prefix are considered. */
  prefix: string;
  log: Logger;
}

export interface PruneOptions {
  /** Bytes the fleet's built images may hold on this engine (their own layers). */
  budgetBytes: number;
  /** Keep images asked for this recently whatever the budget. @default 600000 */
  minIdleMs?: number;
  /** Deadline of each Docker call. @default 30000 */
  callTimeoutMs?: number;
  /** The current time, for tests. @default Date.now() */
  nowMs?: number;
  /**
   * A never started container this fleet committed a prepared image from, left this long, is a
   * killed process's (a commit takes well under a second). @default max(minIdleMs, 5 minutes)
   */
  leftPrepareMs?: number;
}

export interface PruneResult {
  /** Tags removed, least recently used first. */
  removed: string[];
  /** Bytes the removed images held (their own layers). */
  freedBytes: number;
  /** Bytes the remaining built images hold. */
  keptBytes: number;
}

interface Candidate {
  tag: string;
  /** The image's other names of the environment repository (a registry's, left by a killed push or pull). */
  others: string[];
  digest: string;
  bytes: number;
  lastUsed: number;
}

interface DfImage {
  Id: string;
  RepoTags?: string[] | null;
  RepoDigests?: string[] | null;
  Labels?: Record<string, string> | null;
  Size: number;
  SharedSize: number;
  Containers: number;
  Created: number;
}

export async function pruneEnvironmentImages(deps: PruneDeps, opts: PruneOptions): Promise<PruneResult> {
  if (!Number.isFinite(opts.budgetBytes) || opts.budgetBytes < 0) {
    throw new TypeError(`Expected \`budgetBytes\` to be a number of bytes >= 0, got \`${String(opts.budgetBytes)}\``);
  }
  const { docker, redis, prefix, log } = deps;
  const { minIdleMs = 600_000, callTimeoutMs = 30_000 } = opts;
  const now = opts.nowMs ?? Date.now();
  const call = { timeoutMs: callTimeoutMs };
  const engine = await engineId(docker, call);
  const lastUsedKey = envLastUsedKey(prefix, engine);
  // The engine's disk usage answer has each image's shared size (the image list of API 1.41 does not).
  const diskUsage = () => engineDiskUsage<{ Images?: DfImage[] | null }>(docker, 'disk usage', call);
  let df = await diskUsage();
  // Prepared images first (the fleet's sandboxes' files over a base, prepared-images.ts): one no
  // container uses is remade in a moment when asked for again, and while it is there its base's layers
  // count as shared and its base cannot be removed.
  const leftPrepareMs = opts.leftPrepareMs ?? Math.max(minIdleMs, 300_000);
  if (await removeUnusedPreparedImages(deps, df.Images ?? [], now, { minIdleMs, leftPrepareMs }, call) > 0) df = await diskUsage();
  const lastUsed = await redis.hgetall(lastUsedKey);
  const candidates: Candidate[] = [];
  for (const img of df.Images ?? []) {
    if (img.Labels?.[LABEL.envPrefix] !== prefix) continue;
    const digest = img.Labels[LABEL.envDigest] ?? '';
    const bytes = Math.max(0, img.SharedSize >= 0 ? img.Size - img.SharedSize : img.Size);
    const local = (img.RepoTags ?? []).filter((t) => t.startsWith(`${ENV_IMAGE_REPOSITORY}:`));
    const registryNames = [...(img.RepoTags ?? []), ...(img.RepoDigests ?? [])]
      .filter((r) => r.includes(`/${ENV_IMAGE_REPOSITORY}:`) || r.includes(`/${ENV_IMAGE_REPOSITORY}@`));
    // One candidate per image (its bytes are counted once), named by its first local tag.
    const tag = local[0] ?? registryNames[0];
    if (tag === undefined) continue;
    const built = Date.parse(img.Labels[LABEL.envBuiltAt] ?? '') || img.Created * 1000;
    candidates.push({ tag, others: [...local.slice(1), ...registryNames].filter((r) => r !== tag), digest, bytes, lastUsed: Number(lastUsed[tag] ?? 0) || built });
  }
  candidates.sort((a, b) => a.lastUsed - b.lastUsed);
  let total = candidates.reduce((sum, c) => sum + c.bytes, 0);
  const removed: string[] = [];
  let freedBytes = 0;

  for (const c of candidates) {
    if (total <= opts.budgetBytes) break;
    if (now - c.lastUsed < minIdleMs) break; // the rest are more recent still
    // The build lock keeps a builder of the same digest out while we decide and remove.
    const lock = c.digest ? await tryLock(redis, envBuildLockKey(prefix, engine, c.digest), { ttlMs: 30_000 }) : undefined;
    if (c.digest && !lock) continue;
    try {
      // Asked for since we listed (or the image was built again): keep it.
      const fresh = Number((await redis.hget(lastUsedKey, c.tag)) ?? 0) || c.lastUsed;
      if (now - fresh < minIdleMs) continue;
      // Its stray names first: with more than one name the engine untags even an image a container
      // uses, so the last name removed must be the one whose 409 keeps such an image.
      for (const other of c.others) {
        await dockerCall('remove image', call, (abortSignal) => docker.getImage(other).remove({ noprune: true, abortSignal } as object)).catch((err: unknown) => {
          if (dockerStatusOf(err) !== 404 && dockerStatusOf(err) !== 409) log.warn({ image: other, err: (err as Error).message }, 'removing another name of an environment image failed');
        });
      }
      try {
        // Not forced: an image a container still uses (running or not) answers 409 and stays.
        await dockerCall('remove image', call, (abortSignal) => docker.getImage(c.tag).remove({ abortSignal } as object));
      } catch (err) {
        const status = dockerStatusOf(err);
        if (status === 409) continue;
        if (status !== 404) throw err;
      }
      await redis.hdel(lastUsedKey, c.tag);
      total -= c.bytes;
      freedBytes += c.bytes;
      removed.push(c.tag);
      log.info({ image: c.tag, bytes: c.bytes, idleMs: now - c.lastUsed }, 'least recently used environment image removed');
    } finally {
      await lock?.release();
    }
  }
  return { removed, freedBytes, keptBytes: total };
}

/**
 * Remove this fleet's prepared images that no container uses and that were made `minIdleMs` ago or
 * more (a process that made one a moment ago is about to create from it; one that finds it gone makes
 * it again). Not forced: an image a container took since answers 409 and stays. Returns how many went.
 */
async function removeUnusedPreparedImages(
  deps: PruneDeps, images: DfImage[], now: number, { minIdleMs, leftPrepareMs }: { minIdleMs: number; leftPrepareMs: number }, call: { timeoutMs: number },
): Promise<number> {
  let removed = 0;
  for (const img of images) {
    // Named as a prepared image too (a task's own image may carry any label: a Dockerfile's LABEL), or
    // named no more (two processes that made the same one: the later tag won).
    const tags = (img.RepoTags ?? []).filter((t) => t !== '<none>:<none>');
    const prepared = img.Labels?.[LABEL.preparedPrefix] === deps.prefix && (tags.length === 0 || tags.every((t) => t.startsWith(`${PREPARED_IMAGE_REPOSITORY}:`)));
    if (!prepared || img.Containers > 0 || now - img.Created * 1000 < minIdleMs) continue;
    try {
      await dockerCall('remove image', call, (abortSignal) => deps.docker.getImage(img.Id).remove({ abortSignal } as object));
      removed += 1;
    } catch (err) {
      const status = dockerStatusOf(err);
      if (status !== 404 && status !== 409) deps.log.warn({ image: img.Id, err: (err as Error).message }, 'removing an unused prepared image failed');
    }
  }
  if (removed > 0) deps.log.info({ removed }, 'unused prepared images removed');
  // The never started container one was committed from, left by a process of this fleet killed in
  // that moment. Named, not labelled: a label would pass to the image and every sandbox of it.
  const name = prepareContainerPrefix(deps.prefix);
  const left = await dockerCall('list containers', call, (abortSignal) => deps.docker.listContainers({
    all: true, filters: { name: [name], status: ['created'] }, abortSignal,
  } as Docker.ContainerListOptions));
  for (const c of left) {
    if (!c.Names.some((n) => n.startsWith(`/${name}`)) || now - c.Created * 1000 < leftPrepareMs) continue;
    await removeContainer(deps.docker, c.Id, call.timeoutMs).catch((err: unknown) => deps.log.warn({ containerId: c.Id, err: String(err) }, 'removing a left prepare container failed'));
  }
  return removed;
}

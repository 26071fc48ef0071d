// The reaper: removes sandboxes of this fleet whose worker's lease expired (the worker died) or whose
// episode already has a result, salvaging the workspace of orphans first when the engine still has it.
// A dead worker's warm (pooled, unclaimed) sandboxes go too; a claimed one counts as its episode's.
// Runs as a scheduled job on the cleanup queue, so any live worker reaps for the dead ones. It removes
// with removeEnvironment, as an episode's environment lease and the remove-sandbox job do.
import type { Readable } from 'node:stream';
import type Docker from 'dockerode';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { EvidencePublisher } from '../evidence/publish-evidence.ts';
import type { EvidenceStore } from '../evidence/evidence-store.ts';
import { extractSafely, type ExtractLimits } from '../evidence/safe-extract.ts';
import { leaseMissingKey, reapedCountKey, sandboxClaimKey } from '../redis/redis-keys.ts';
import { dockerCall } from '../sandbox/docker-client.ts';
import { LABEL } from '../sandbox/labels.ts';
import { removeEnvironment } from '../sandbox/environment-lease.ts';
import { removeServiceEnvironment as removeEnvironmentVolumes } from '../sandbox/task-services.ts';
import { liveWorkers } from './worker-lease.ts';
import type { ResultsStore } from '../results/results-store.ts';
import { untilAborted } from '../deadlines/deadline.ts';

export interface ReapDeps {
  docker: Docker;
  redis: Redis;
  prefix: string;
  results: ResultsStore;
  evidence: EvidenceStore;
  /** Copies what is salvaged into the artifact store, for every host to read. @default kept on this host only */
  publisher?: EvidencePublisher;
  log: Logger;
  callTimeoutMs: number;
  salvageLimits: ExtractLimits;
  /**
   * A worker whose lease is missing is taken for dead only if it is still missing this long after it
   * was first seen missing: after a Redis outage longer than the lease TTL, live workers renew their
   * leases within a heartbeat, and their sandboxes are not reaped.
   */
  confirmDeadAfterMs: number;
}

export interface ReapReport {
  inspected: number;
  removed: { containerId: string; episodeId: string; reason: 'lease expired' | 'episode ended' }[];
  salvaged: number;
  /** Warm sandboxes of live workers that no episode claimed: their pool's, left alone. */
  pooled: number;
  /** Sandboxes of workers whose lease is missing but not yet confirmed dead: left for a later run. */
  awaitingConfirmation: number;
}

/** Remove this fleet's orphaned sandboxes older than `minAgeMs`. */
export async function reapOrphans(deps: ReapDeps, minAgeMs: number): Promise<ReapReport> {
  const { docker, prefix, log } = deps;
  const containers = await dockerCall('list sandboxes', { timeoutMs: deps.callTimeoutMs }, (abortSignal) =>
    docker.listContainers({ all: true, filters: { label: [`${LABEL.fleet}=${prefix}`] }, abortSignal } as Docker.ContainerListOptions),
  );
  const report: ReapReport = { inspected: containers.length, removed: [], salvaged: 0, pooled: 0, awaitingConfirmation: 0 };
  const workers = [...new Set(containers.map((c) => c.Labels[LABEL.worker] ?? ''))];
  const live = await liveWorkers(deps.redis, prefix, workers);
  const now = Date.now();
  const dead = await confirmedDead(deps, workers.filter((w) => !live.has(w)), live, now);
  for (const c of containers) {
    if (now - c.Created * 1000 < minAgeMs) continue;
    const worker = c.Labels[LABEL.worker] ?? '';
    if (!live.has(worker) && !dead.has(worker)) {
      report.awaitingConfirmation += 1; // missing lease not yet confirmed
      continue;
    }
    // A pooled sandbox names no episode in its labels: the claim in Redis does, once one claimed it.
    const claim = c.Labels[LABEL.pool] === undefined ? undefined : await readClaim(deps, c.Id);
    const episodeId = claim?.episodeId ?? c.Labels[LABEL.episode] ?? '';
    const batchId = claim?.batchId ?? c.Labels[LABEL.batch] ?? '';
    const leaseExpired = dead.has(worker);
    // A warm sandbox nobody claimed belongs to its (live) worker's pool.
    const ended = !leaseExpired && episodeId !== '' && (await deps.results.has(batchId, episodeId));
    if (!leaseExpired && c.Labels[LABEL.pool] !== undefined && claim === undefined) report.pooled += 1;
    if (!leaseExpired && !ended) continue;
    // The workspace is the agent's container's: a task service or a namespace holder has none to salvage.
    const role = c.Labels[LABEL.environmentRole];
    if (leaseExpired && episodeId !== '' && (role === undefined || role === 'main')) report.salvaged += (await salvage(deps, c.Id, episodeId)) ? 1 : 0;
    try {
      await removeEnvironment(docker, c.Id, deps.callTimeoutMs);
      if (claim !== undefined) await deps.redis.del(sandboxClaimKey(prefix, c.Id));
      report.removed.push({ containerId: c.Id, episodeId, reason: leaseExpired ? 'lease expired' : 'episode ended' });
      log.info({ containerId: c.Id, episodeId, reason: leaseExpired ? 'lease expired' : 'episode ended' }, 'sandbox reaped');
    } catch (err) {
      log.warn({ containerId: c.Id, err: String(err) }, 'reaping a sandbox failed; the next run tries again');
    }
  }
  await reapEnvironmentVolumes(deps, minAgeMs);
  if (report.removed.length > 0) await deps.redis.incrby(reapedCountKey(prefix), report.removed.length);
  return report;
}

/**
 * Named volumes of task-service environments none of whose containers is left (a worker killed
 * between removing the containers and the volumes): removed once older than `minAgeMs`.
 */
async function reapEnvironmentVolumes(deps: ReapDeps, minAgeMs: number): Promise<void> {
  const { docker, prefix, callTimeoutMs } = deps;
  const volumes = await dockerCall('list environment volumes', { timeoutMs: callTimeoutMs }, (abortSignal) =>
    docker.listVolumes({ filters: { label: [`${LABEL.fleet}=${prefix}`, LABEL.environment] }, abortSignal } as object));
  const now = Date.now();
  for (const v of volumes.Volumes ?? []) {
    const key = v.Labels?.[LABEL.environment];
    const created = Date.parse((v as { CreatedAt?: string }).CreatedAt ?? '') || 0;
    // At least a minute old: set-up makes an environment's volumes just before its containers.
    if (key === undefined || now - created < Math.max(minAgeMs, 60_000)) continue;
    const users = await dockerCall('list an environment\'s containers', { timeoutMs: callTimeoutMs }, (abortSignal) =>
      docker.listContainers({ all: true, filters: { label: [`${LABEL.environment}=${key}`] }, abortSignal } as Docker.ContainerListOptions));
    if (users.length > 0) continue;
    await removeEnvironmentVolumes(docker, key, callTimeoutMs)
      .catch((err: unknown) => deps.log.warn({ volume: v.Name, err: String(err) }, 'removing an environment volume failed; the next run tries again'));
  }
}

/** The episode that claimed a pooled sandbox, or undefined (unclaimed, or the record is unreadable). */
async function readClaim(deps: ReapDeps, containerId: string): Promise<{ episodeId: string; batchId: string } | undefined> {
  const text = await deps.redis.get(sandboxClaimKey(deps.prefix, containerId));
  if (text === null) return undefined;
  try {
    const claim = JSON.parse(text) as { episodeId?: unknown; batchId?: unknown };
    return typeof claim.episodeId === 'string' && typeof claim.batchId === 'string' ? { episodeId: claim.episodeId, batchId: claim.batchId } : undefined;
  } catch {
    return undefined;
  }
}

/** The workers whose lease has been missing for at least confirmDeadAfterMs; clears marks of live ones. */
async function confirmedDead(deps: ReapDeps, missing: string[], live: Set<string>, now: number): Promise<Set<string>> {
  const key = (w: string) => leaseMissingKey(deps.prefix, w);
  if (live.size > 0) await deps.redis.del(...[...live].map(key));
  const dead = new Set<string>();
  for (const w of missing) {
    const marked = await deps.redis.set(key(w), String(now), 'PX', 24 * 3600 * 1000, 'NX');
    if (marked === 'OK') continue;
    const since = Number(await deps.redis.get(key(w)));
    if (now - since >= deps.confirmDeadAfterMs) dead.add(w);
  }
  return dead;
}

/** Copy the orphan's workspace into its evidence before it goes; false when nothing could be saved. */
async function salvage(deps: ReapDeps, containerId: string, episodeId: string): Promise<boolean> {
  const container = deps.docker.getContainer(containerId);
  try {
    const info = await dockerCall('inspect orphan', { timeoutMs: deps.callTimeoutMs }, (abortSignal) => container.inspect({ abortSignal }));
    const workdir = info.Config.WorkingDir || '/';
    const archive = (await dockerCall('get orphan workspace', { timeoutMs: deps.callTimeoutMs }, (abortSignal) =>
      container.getArchive({ path: workdir, abortSignal }),
    )) as unknown as Readable;
    const dest = deps.evidence.salvageFolder(episodeId, containerId);
    // What was read when the time is up is kept, and the rest said not read; a moment later the reaper
    // goes on whatever the extraction is doing (a disk that hangs).
    const extraction = await untilAborted(
      extractSafely(archive, dest, { ...deps.salvageLimits, strip: 1 }, AbortSignal.timeout(deps.callTimeoutMs)),
      AbortSignal.timeout(deps.callTimeoutMs + 5_000),
    );
    if (extraction.truncated) deps.log.warn({ containerId, episodeId, skipped: extraction.skipped.slice(0, 20) }, 'salvaged workspace is partial');
    // Into the artifact store now if it answers in time; else the outbox keeps it for later.
    await deps.publisher?.publishPath(dest, AbortSignal.timeout(deps.callTimeoutMs))
      .catch((err: unknown) => deps.log.warn({ containerId, episodeId, err: String(err) }, 'salvaged evidence not yet in the artifact store; the outbox keeps it'));
    return true;
  } catch (err) {
    deps.log.warn({ containerId, episodeId, err: String(err) }, 'salvaging an orphan failed');
    return false;
  }
}

// Thin processor of the `cleanup` queue: `remove-sandbox` jobs remove one sandbox; the scheduled
// `reap` job removes orphans of dead workers and ended episodes. Failures retry with backoff. Both
// remove with removeEnvironment, the removal an episode's environment lease does when it ends directly.
import type { Job } from 'bullmq';
import { DelayedError, UnrecoverableError } from 'bullmq';
import type Docker from 'dockerode';
import { reapOrphans, type ReapDeps, type ReapReport } from '../../src/cleanup/reap-orphans.ts';
import { recordReaperRun } from '../../src/cleanup/reaper-runs.ts';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { removeStaleGenerations } from '../../src/runtime/remove-stale-generations.ts';
import { sandboxClaimKey } from '../../src/redis/redis-keys.ts';
import { engineId } from '../../src/sandbox/docker-client.ts';
import { removeEnvironment } from '../../src/sandbox/environment-lease.ts';
import { CleanupJob, REAP_JOB, REMOVE_SANDBOX_JOB, type CleanupResult } from './contract.ts';

export interface CleanupProcessorDeps extends ReapDeps {
  docker: Docker;
  /** Sandboxes younger than this are left to their worker even when they look orphaned. */
  reapMinAgeMs: number;
  /** Runtime generations not prepared for this long (and mounted by nothing) are removed. */
  runtimeMaxIdleMs: number;
}

/**
 * How long a removal taken by workers of other engines is put back without spending an attempt; then
 * its attempts count again (its host may be gone for good, and its reaper with it).
 */
const OWN_ENGINE_WAIT_MS = 60 * 60 * 1000;
/** Put back for 0.5 s, doubling each time another engine's worker takes it, up to 30 s. */
const bounceDelayMs = (started: number) => Math.min(30_000, 500 * 2 ** Math.min(6, Math.max(0, started - 1)));

export function cleanupProcessor(deps: CleanupProcessorDeps) {
  return async (job: Job, token?: string): Promise<CleanupResult | (ReapReport & { staleGenerationsRemoved: string[] })> => {
    if (job.name === REAP_JOB) {
      const started = Date.now();
      let report: ReapReport | undefined;
      // The run is recorded for the dashboard whether it succeeds or not.
      const record = async (staleGenerationsRemoved: number, error?: unknown) => recordReaperRun(deps.redis, deps.prefix, {
        engineId: await engineId(deps.docker, { timeoutMs: deps.callTimeoutMs }).catch(() => 'unknown'),
        workerId: job.processedBy ?? '',
        at: new Date().toISOString(),
        durationMs: Date.now() - started,
        ...(error !== undefined && { error: String(error) }),
        inspected: report?.inspected ?? 0,
        removed: report?.removed.length ?? 0,
        salvaged: report?.salvaged ?? 0,
        pooled: report?.pooled ?? 0,
        awaitingConfirmation: report?.awaitingConfirmation ?? 0,
        staleGenerationsRemoved,
      });
      try {
        report = await reapOrphans(deps, deps.reapMinAgeMs);
        const generations = await removeStaleGenerations(deps, { maxIdleMs: deps.runtimeMaxIdleMs, callTimeoutMs: deps.callTimeoutMs });
        await record(generations.removed.length);
        return { ...report, staleGenerationsRemoved: generations.removed };
      } catch (err) {
        await record(0, err);
        throw err;
      }
    }
    if (job.name !== REMOVE_SANDBOX_JOB) throw new UnrecoverableError(`unknown cleanup job ${JSON.stringify(job.name)}`);
    const parsed = CleanupJob.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(`invalid cleanup job: ${describeIssues(parsed.error, job.data).join('; ')}`);
    // The queue is the fleet's, the sandbox one engine's: on another host's engine it would be "not
    // found", and so wrongly counted removed. It is put back, its attempts unspent, until a worker of
    // its host takes it (with N hosts, 8 attempts spent this way missed its host (1 - 1/N)^8 of the
    // time: 10% at 4); the reaper of its engine finds it by its labels if none ever does.
    const mine = parsed.data.engineId === undefined ? undefined : await engineId(deps.docker, { timeoutMs: deps.callTimeoutMs });
    if (mine !== undefined && mine !== parsed.data.engineId) {
      const why = `sandbox ${parsed.data.containerId.slice(0, 12)} runs on engine ${parsed.data.engineId}, not this worker's (${mine}); left for a worker of its host`;
      if (token !== undefined && Date.now() - job.timestamp < OWN_ENGINE_WAIT_MS) {
        await job.moveToDelayed(Date.now() + bounceDelayMs(job.attemptsStarted), token);
        throw new DelayedError(why);
      }
      throw new Error(why);
    }
    await removeEnvironment(deps.docker, parsed.data.containerId, parsed.data.timeoutMs, parsed.data.environment);
    // A pooled sandbox's claim record is of no use once it is gone.
    await deps.redis.del(sandboxClaimKey(deps.prefix, parsed.data.containerId));
    return { removed: parsed.data.containerId };
  };
}

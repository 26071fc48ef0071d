// The reaper's last run on each engine, kept in Redis for the dashboard's fleet page: when it ran,
// how long it took, what it found (sandboxes of this fleet, warm ones nobody claimed, orphans whose
// worker's lease is missing but not yet confirmed dead) and what it removed. One record per engine:
// each host's reaper sees only its own engine's sandboxes.
import os from 'node:os';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { reaperLastRunKey } from '../redis/redis-keys.ts';

export const ReaperRun = z.object({
  engineId: z.string(),
  host: z.string(),
  workerId: z.string(),
  at: z.iso.datetime(),
  durationMs: z.number(),
  /** The run failed (its message); the counts are then what it had when it failed, or zero. */
  error: z.string().optional(),
  inspected: z.number().int(),
  removed: z.number().int(),
  salvaged: z.number().int(),
  /** Warm sandboxes of live workers that no episode claimed (the pool's, not orphans). */
  pooled: z.number().int(),
  /** Sandboxes of workers whose lease is missing, not yet confirmed dead (removed by a later run). */
  awaitingConfirmation: z.number().int(),
  staleGenerationsRemoved: z.number().int(),
});
export type ReaperRun = z.infer<typeof ReaperRun>;

/** Record a run (this host's name is added); never throws: the record is for people, not for the fleet. */
export async function recordReaperRun(redis: Redis, prefix: string, run: Omit<ReaperRun, 'host'>): Promise<void> {
  await redis.hset(reaperLastRunKey(prefix), run.engineId, JSON.stringify({ ...run, host: os.hostname() })).catch(() => undefined);
}

/** The last run on each engine, newest first. */
export async function readReaperRuns(redis: Redis, prefix: string): Promise<ReaperRun[]> {
  const all = await redis.hgetall(reaperLastRunKey(prefix));
  return Object.values(all).flatMap((text) => {
    try {
      const parsed = ReaperRun.safeParse(JSON.parse(text));
      return parsed.success ? [parsed.data] : [];
    } catch {
      return [];
    }
  }).sort((a, b) => b.at.localeCompare(a.at));
}

// The outline of an episode's result: the fields the batch summary and the dashboard's batch page read,
// about 100 bytes of the 700 or more of a whole result. The results store keeps one beside each result,
// written and removed with it in the same Lua step, so `status` on a batch of 100,000 results reads
// 10 MB of small arrays instead of 70 MB of results to validate one by one (seconds).
import type { EpisodeResult } from '../episode/episode-job.ts';
import type { FailureKind } from '../errors/failure-kind.ts';

export interface ResultOutline {
  episodeId: string;
  taskId: string;
  status: EpisodeResult['status'];
  reward: number | null;
  attempts: number;
  workerId: string;
  error?: { kind: FailureKind; code: string };
  timings: EpisodeResult['timings'];
  usage?: NonNullable<EpisodeResult['usage']>;
  /** Absent from outlines stored before it was kept. */
  endedAt?: string;
  /** A Harbor reward file's metrics. */
  metrics?: Record<string, number>;
  /** Restarts from scratch for growing staler than the batch's maxStaleness. */
  staleRestarts?: number;
}

/**
 * The stored form: a JSON array, in this order, an absent value as null. Stored data: a later version
 * may append fields, never reorder them.
 */
export function encodeOutline(r: EpisodeResult): string {
  const t = r.timings;
  return JSON.stringify([
    r.status, r.taskId, r.reward, r.attempts, r.workerId, r.error?.kind ?? null, r.error?.code ?? null,
    t.setupMs ?? null, t.agentMs ?? null, t.verifyMs ?? null, t.closeMs ?? null, t.totalMs,
    r.usage?.promptTokens ?? null, r.usage?.completionTokens ?? null, r.usage?.totalTokens ?? null,
    r.endedAt, r.metrics ?? null, r.staleRestarts ?? null,
  ]);
}

type Stored = [
  ResultOutline['status'], string, number | null, number, string, FailureKind | null, string | null,
  number | null, number | null, number | null, number | null, number,
  number | null, number | null, number | null,
  string | undefined, Record<string, number> | null | undefined, number | null | undefined,
];

/** An outline from its stored form (the JSON text, or the array it parses to). */
export function decodeOutline(episodeId: string, stored: unknown): ResultOutline {
  const [status, taskId, reward, attempts, workerId, kind, code, setupMs, agentMs, verifyMs, closeMs, totalMs, prompt, completion, total, endedAt, metrics, staleRestarts] = (typeof stored === 'string' ? JSON.parse(stored) : stored) as Stored;
  const timings: ResultOutline['timings'] = { totalMs };
  if (setupMs !== null) timings.setupMs = setupMs;
  if (agentMs !== null) timings.agentMs = agentMs;
  if (verifyMs !== null) timings.verifyMs = verifyMs;
  if (closeMs !== null) timings.closeMs = closeMs;
  return {
    episodeId, taskId, status, reward, attempts, workerId,
    ...(kind !== null && { error: { kind, code: code ?? '' } }),
    timings,
    ...(prompt !== null && { usage: { promptTokens: prompt, completionTokens: completion ?? 0, totalTokens: total ?? 0 } }),
    ...(typeof endedAt === 'string' && { endedAt }),
    ...(metrics !== null && metrics !== undefined && typeof metrics === 'object' && { metrics }),
    ...(typeof staleRestarts === 'number' && { staleRestarts }),
  };
}

// Cancelling episodes from any process: a waiting (or backing-off) episode is removed from the queue
// and recorded cancelled; a running one is told to stop through Redis, wherever it runs; one that is
// already closing is left to finish, and the caller is told so (a conflict).
import type { Queue } from 'bullmq';
import type { EpisodeResult } from '../episode/episode-job.ts';
import type { EpisodeControl } from '../episode/episode-control.ts';
import { resultWithoutRun } from '../episode/episode-result.ts';
import type { ResultsStore } from '../results/results-store.ts';

export type CancelOutcome =
  /** It was waiting; it is removed and recorded cancelled. */
  | 'cancelled'
  /** It runs; its worker was told to stop it. Its result will say cancelled. */
  | 'cancelling'
  /** It is already closing: the close goes on and the episode ends as it would have. */
  | 'closing'
  /** It already has a result. */
  | 'ended'
  | 'unknown';

export interface CancelDeps {
  queue: Queue;
  results: ResultsStore;
  control: EpisodeControl;
  /** Who cancels, in the recorded result. */
  by: string;
}

const WAITING_STATES = new Set(['waiting', 'delayed', 'prioritized', 'paused', 'waiting-children']);

export async function cancelEpisode(deps: CancelDeps, episodeId: string): Promise<CancelOutcome> {
  const job = await deps.queue.getJob(episodeId);
  if (job === undefined) return 'unknown';
  const batchId = (job.data as { batchId?: unknown }).batchId;
  if (typeof batchId === 'string' && (await deps.results.has(batchId, episodeId))) return 'ended';
  const state = await job.getState();
  if (state === 'completed' || state === 'failed') return 'ended';
  if (WAITING_STATES.has(state)) {
    // remove() refuses a job a worker has locked meanwhile; then it is running: ask its worker.
    const removed = await job.remove().then(() => true, () => false);
    if (removed) {
      await deps.results.record(resultWithoutRun(job, { status: 'cancelled' }, deps.by));
      return 'cancelled';
    }
  }
  return (await deps.control.requestCancel(episodeId)) === 'closing' ? 'closing' : 'cancelling';
}

/** Wait until the episode has a result (a cancel that was handed to a running worker). */
export async function waitForResult(results: ResultsStore, batchId: string, episodeId: string, timeoutMs: number): Promise<EpisodeResult | undefined> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const found = await results.get(batchId, episodeId);
    if (found || Date.now() > until) return found;
    await new Promise((r) => setTimeout(r, 200));
  }
}

// The episodes running in this worker process, each with the AbortController that cancels it or
// hands it back; what cancel messages and the drain on SIGTERM act on.
import { EpisodeStop, type StopReason } from '../errors/episode-stop.ts';

export class RunningEpisodes {
  private readonly running = new Map<string, AbortController>();

  /** Register an episode; the returned signal aborts with an EpisodeStop (or the parent's reason). */
  start(episodeId: string, parent?: AbortSignal): AbortSignal {
    const ctrl = new AbortController();
    if (parent) {
      if (parent.aborted) ctrl.abort(parent.reason);
      else parent.addEventListener('abort', () => ctrl.abort(parent.reason), { once: true });
    }
    this.running.set(episodeId, ctrl);
    return ctrl.signal;
  }

  /** Forget an episode, unless a newer run of it (a redelivery) registered since `signal` was given. */
  finish(episodeId: string, signal: AbortSignal): void {
    if (this.running.get(episodeId)?.signal === signal) this.running.delete(episodeId);
  }

  /** Stop one episode; false when it does not run here. */
  stop(episodeId: string, reason: StopReason): boolean {
    const ctrl = this.running.get(episodeId);
    if (ctrl === undefined) return false;
    if (!ctrl.signal.aborted) ctrl.abort(new EpisodeStop(reason));
    return true;
  }

  stopAll(reason: StopReason): number {
    for (const id of this.running.keys()) this.stop(id, reason);
    return this.running.size;
  }

  get size(): number {
    return this.running.size;
  }
}

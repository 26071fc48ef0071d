// The episodes running in this worker process, each with the AbortController that cancels it or
// hands it back; what cancel messages and the drain on SIGTERM act on. Each also has its phase and
// when it started, which the worker reports with its host facts (the dashboard's fleet page).
import { EpisodeStop, type StopReason } from '../errors/episode-stop.ts';

/** Where an attempt is: set-up (from pick-up), waiting for its environment's image build, the agent, verification, close. */
export const EPISODE_PHASES = ['setup', 'build', 'agent', 'verify', 'close'] as const;
export type EpisodePhase = (typeof EPISODE_PHASES)[number];

export interface RunningEpisode {
  episodeId: string;
  batchId: string;
  taskId: string;
  phase: EpisodePhase;
  /** When the attempt was picked up, and when its phase began (ms since the epoch). */
  startedAt: number;
  phaseStartedAt: number;
}

interface Entry {
  ctrl: AbortController;
  info: RunningEpisode;
}

export class RunningEpisodes {
  private readonly running = new Map<string, Entry>();
  private readonly listeners = new Set<() => void>();

  /** Register an episode; the returned signal aborts with an EpisodeStop (or the parent's reason). */
  start(episodeId: string, parent?: AbortSignal, about: { batchId?: string; taskId?: string } = {}): AbortSignal {
    const ctrl = new AbortController();
    if (parent) {
      if (parent.aborted) ctrl.abort(parent.reason);
      else parent.addEventListener('abort', () => ctrl.abort(parent.reason), { once: true });
    }
    const now = Date.now();
    this.running.set(episodeId, {
      ctrl,
      info: { episodeId, batchId: about.batchId ?? '', taskId: about.taskId ?? '', phase: 'setup', startedAt: now, phaseStartedAt: now },
    });
    this.changed();
    return ctrl.signal;
  }

  /** The attempt given `signal` entered `phase` (ignored once a newer run of the episode registered). */
  setPhase(episodeId: string, signal: AbortSignal, phase: EpisodePhase): void {
    const entry = this.running.get(episodeId);
    if (entry?.ctrl.signal !== signal || entry.info.phase === phase) return;
    entry.info = { ...entry.info, phase, phaseStartedAt: Date.now() };
    this.changed();
  }

  /** Forget an episode, unless a newer run of it (a redelivery) registered since `signal` was given. */
  finish(episodeId: string, signal: AbortSignal): void {
    if (this.running.get(episodeId)?.ctrl.signal === signal) {
      this.running.delete(episodeId);
      this.changed();
    }
  }

  /** Stop one episode; false when it does not run here. */
  stop(episodeId: string, reason: StopReason): boolean {
    const ctrl = this.running.get(episodeId)?.ctrl;
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

  /** What runs now, oldest first. */
  list(): RunningEpisode[] {
    return [...this.running.values()].map((e) => e.info).sort((a, b) => a.startedAt - b.startedAt);
  }

  /** Call `listener` whenever an episode starts, changes phase or ends; returns the unsubscribe. */
  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private changed(): void {
    for (const listener of this.listeners) listener();
  }
}

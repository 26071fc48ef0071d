// Why an episode was stopped from outside, carried as the reason of the episode's AbortSignal. Not a
// failure: a cancelled episode ends with status cancelled; a drained one is handed back to the queue.
export type StopReason = 'cancelled' | 'drain' | 'stale';

export class EpisodeStop extends Error {
  override readonly name = 'EpisodeStop';
  constructor(readonly reason: StopReason) {
    super(reason === 'cancelled'
      ? 'the episode was cancelled'
      : reason === 'stale'
        ? "the episode's policy grew staler than its batch's maxStaleness; it restarts from scratch"
        : 'the worker is draining; the episode goes back to the queue');
  }
}

/** The stop behind an aborted signal, if that is why it aborted. */
export function stopOf(signal: AbortSignal): EpisodeStop | undefined {
  return signal.aborted && signal.reason instanceof EpisodeStop ? signal.reason : undefined;
}

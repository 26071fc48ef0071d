// The outbox's background drain: evidence a close could not publish (the artifact store down or slow)
// is copied into the store now and every so often for as long as the worker runs, one drain at a time.
import type { Logger } from 'pino';
import type { EvidencePublisher } from './publish-evidence.ts';

/** How often evidence left in the outbox is published again. */
export const OUTBOX_INTERVAL_MS = 30_000;
/** How long each outbox folder's copy may take. */
const OUTBOX_CALL_MS = 60_000;

/**
 * Drain the publisher's outbox now and every `intervalMs`; the function returned stops the interval
 * (a drain under way finishes on its own). When the store is the data folder there is nothing to drain.
 */
export function startOutbox(publisher: EvidencePublisher, intervalMs: number, log: Logger): () => void {
  if (publisher.local) return () => undefined;
  // One drain at a time: with a slow store a drain can outlast the interval, and overlapping ones
  // would only copy the same folders twice.
  let draining: Promise<unknown> | undefined;
  const drain = () => {
    draining ??= publisher.drainOutbox(OUTBOX_CALL_MS)
      .catch((err: unknown) => log.warn({ err: String(err) }, 'outbox drain failed'))
      .finally(() => (draining = undefined));
  };
  const timer = setInterval(drain, intervalMs);
  timer.unref();
  drain();
  return () => clearInterval(timer);
}

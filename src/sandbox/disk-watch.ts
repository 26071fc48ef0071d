// Watches a sandbox's writable layer against its disk limit, for engines that cannot cap it
// themselves (overlay2 on ext4). Polled, never more than one measurement in flight, and spaced so the
// engine spends at most a tenth of its time measuring: a measurement walks the whole layer.
import type { Logger } from 'pino';
import { FleetError } from '../errors/fleet-error.ts';
import type { SandboxSession } from './sandbox-session.ts';

/** Shortest pause between two measurements: an agent writing at disk speed overshoots by what it writes in this long. */
export const DISK_POLL_MS = 1_000;
/** A measurement that took t ms is followed by a pause of at least this many times t. */
const POLL_COST_FACTOR = 10;

export interface DiskWatch {
  /** Set once the layer was seen past the limit. */
  readonly exceeded: FleetError | undefined;
  /** Measure once more now (after the agent ended: it may have written past the limit since the last poll). */
  checkNow(signal: AbortSignal): Promise<FleetError | undefined>;
  stop(): void;
}

export interface DiskWatchOptions {
  limitMb: number;
  /** Ends the watch (the phase's signal). */
  signal: AbortSignal;
  log: Logger;
  /** Called once, when the layer is first seen past the limit. */
  onExceeded(err: FleetError): void;
  /** @default DISK_POLL_MS */
  intervalMs?: number;
  /**
   * What is measured, when more than the sandbox's own layer (a task's services: each sidecar's layer
   * and each named volume): the largest part's bytes and its name. @default the sandbox's writable layer
   */
  measure?: (signal: AbortSignal) => Promise<{ bytes: number; part?: string }>;
}

const MB = 1024 * 1024;

export function watchDisk(session: SandboxSession, opts: DiskWatchOptions): DiskWatch {
  const limitBytes = opts.limitMb * MB;
  const intervalMs = opts.intervalMs ?? DISK_POLL_MS;
  const stopped = new AbortController();
  const signal = AbortSignal.any([opts.signal, stopped.signal]);
  let exceeded: FleetError | undefined;

  const measure = async (s: AbortSignal): Promise<FleetError | undefined> => {
    if (exceeded) return exceeded;
    const { bytes, part } = opts.measure ? await opts.measure(s) : { bytes: await session.writableLayerBytes(s), part: undefined };
    // A measurement that comes back after the watch stopped (the agent ended) must not stop the sandbox.
    if (s.aborted) return exceeded;
    if (bytes > limitBytes && !exceeded) {
      exceeded = new FleetError(
        'disk_limit_exceeded',
        part === undefined
          ? `the agent wrote ${Math.round(bytes / MB)} MB into the sandbox, past its limits.diskMb of ${opts.limitMb} MB, and was stopped`
          : `${part} held ${Math.round(bytes / MB)} MB, past the task's disk limit of ${opts.limitMb} MB, and the episode was stopped`,
      );
      opts.onExceeded(exceeded);
    }
    return exceeded;
  };

  void (async () => {
    while (!signal.aborted && !exceeded) {
      const started = performance.now();
      try {
        await measure(signal);
      } catch (err) {
        // An engine that does not answer in time is the phase's business, not the watch's.
        if (!signal.aborted) opts.log.debug({ containerId: session.containerId, err: String(err) }, 'disk measurement failed');
      }
      const pause = Math.max(intervalMs, (performance.now() - started) * POLL_COST_FACTOR);
      await new Promise<void>((resolve) => {
        const onAbort = () => {
          clearTimeout(timer);
          resolve();
        };
        // The listener goes with the pause: a long agent must not pile them up on the phase's signal.
        const timer = setTimeout(() => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        }, pause);
        timer.unref();
        signal.addEventListener('abort', onAbort, { once: true });
      });
    }
  })();

  return {
    get exceeded() {
      return exceeded;
    },
    checkNow: (s) => measure(s),
    stop: () => stopped.abort(),
  };
}

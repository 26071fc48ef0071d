// Deadlines as AbortSignals with a typed reason, and the one way the fleet races work against them.
// Every phase of an episode gets one Deadline; every Redis, Docker and file step of that phase either
// takes its signal or is raced against it, so a stalled resource cannot hold a phase past its end.
import { FleetError } from '../errors/fleet-error.ts';

/** The phases of one episode attempt, each with a deadline of its own. */
export type Phase = 'set-up' | 'agent' | 'verify' | 'close';

/** The reason a phase's signal aborts when its time is up: an infrastructure failure, retried. */
export class PhaseTimeout extends FleetError {
  constructor(
    readonly phase: Phase,
    readonly budgetMs: number,
    what: string,
  ) {
    super('phase_timeout', `${phase} passed its reserve of ${formatMs(budgetMs)} while ${what}`);
  }
}

const formatMs = (ms: number) => (ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`);

/**
 * Settle with `work`, or reject with the signal's reason as soon as it aborts, whichever comes first
 * (`work` already settled wins over a signal already aborted). The fleet's one way to race a step
 * against a deadline or a caller's signal. After an abort `work` goes on in the background: a value it
 * yields then goes to `onLate`, exactly once and never also to the caller, so what it opened is closed
 * or given back (a lease, a reserved slot, a stream); an error it throws then is dropped. Without
 * `onLate` a late value is dropped too (right for a read).
 */
export async function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined, onLate?: (value: T) => void): Promise<T> {
  if (signal === undefined) return work;
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
  });
  try {
    return await Promise.race([work, aborted]);
  } catch (err) {
    if (signal.aborted) void work.then((value) => onLate?.(value), () => undefined);
    throw err;
  } finally {
    signal.removeEventListener('abort', onAbort!);
  }
}

/**
 * One phase's deadline. Its signal aborts with a PhaseTimeout when the time is up, or with the
 * parent's reason (a cancellation, a drain) when the parent aborts first. Dispose it when the phase
 * ends, so no timer or listener outlives it.
 */
export class Deadline {
  private readonly ctrl = new AbortController();
  /** Aborts only when the time is up (not on the parent's abort). */
  private readonly due = new AbortController();
  private readonly timer: NodeJS.Timeout;
  private step = 'working';
  /** performance.now() at which the time is up. */
  readonly endsAt: number;

  constructor(
    readonly phase: Phase,
    readonly budgetMs: number,
    private readonly parent?: AbortSignal,
  ) {
    this.endsAt = performance.now() + budgetMs;
    this.timer = setTimeout(() => {
      const reason = new PhaseTimeout(phase, budgetMs, this.step);
      this.due.abort(reason);
      this.ctrl.abort(reason);
    }, Math.max(0, budgetMs));
    this.timer.unref();
    if (parent?.aborted) this.ctrl.abort(parent.reason);
    else parent?.addEventListener('abort', this.onParent, { once: true });
  }

  private readonly onParent = () => this.ctrl.abort(this.parent!.reason);

  get signal(): AbortSignal {
    return this.ctrl.signal;
  }

  /** Time since the phase began. */
  get elapsedMs(): number {
    return Math.round(performance.now() - (this.endsAt - this.budgetMs));
  }

  get remainingMs(): number {
    return Math.max(0, Math.round(this.endsAt - performance.now()));
  }

  /**
   * `work` (a step named `what`, for the timeout's message), settled by the deadline at the latest.
   * A value that arrives after the deadline goes to `onLate`, so what the step opened is closed.
   */
  async run<T>(what: string, work: (signal: AbortSignal) => Promise<T>, onLate?: (value: T) => void): Promise<T> {
    this.step = what;
    this.signal.throwIfAborted();
    return await untilAborted(work(this.signal), this.signal, onLate);
  }

  /**
   * Like run, for work that stops itself when its signal aborts and returns what it has (an exec,
   * an agent): a cancellation lets it finish stopping, only the time limit cuts it short.
   */
  async runStoppable<T>(what: string, work: (signal: AbortSignal) => Promise<T>, onLate?: (value: T) => void): Promise<T> {
    this.step = what;
    this.signal.throwIfAborted();
    return await untilAborted(work(this.signal), this.due.signal, onLate);
  }

  /**
   * A signal that aborts `ms` from now or at this deadline, whichever comes first: a budget for one
   * step inside the phase (its reason is this phase's PhaseTimeout either way). Disposed with the phase.
   */
  within(ms: number, what: string): AbortSignal {
    const own = AbortSignal.timeout(Math.max(0, Math.min(ms, this.remainingMs)));
    const ctrl = new AbortController();
    const abort = () => ctrl.abort(this.signal.aborted ? this.signal.reason : new PhaseTimeout(this.phase, ms, what));
    if (this.signal.aborted || own.aborted) abort();
    else {
      own.addEventListener('abort', abort, { once: true });
      this.signal.addEventListener('abort', abort, { once: true });
      ctrl.signal.addEventListener('abort', () => this.signal.removeEventListener('abort', abort), { once: true });
    }
    return ctrl.signal;
  }

  dispose(): void {
    clearTimeout(this.timer);
    this.parent?.removeEventListener('abort', this.onParent);
  }
}

// What the model proxy asks of a model endpoint's fleet-wide limits before each upstream attempt, and
// tells them after it. The Redis implementation (fleet-limits.ts) shares one allowance across every
// worker and host; `UNLIMITED` is the no-op used when no limit is configured. A leaf: the proxy and
// the upstream client depend on this, never on Redis.

/** How one upstream attempt went, reported exactly once through its permit. */
export interface AttemptOutcome {
  /** HTTP status upstream answered; undefined when no answer came (connection error, timeout, abort). */
  status?: number | undefined;
  /** Upstream's Retry-After, in ms, when it sent one (429, 503). */
  retryAfterMs?: number | undefined;
  /** Tokens the answer used (usage.total_tokens), charged to the tokens-per-minute allowance. */
  tokens?: number | undefined;
}

/** A turn granted by the limiter: one upstream attempt may run until it is released. */
export interface EndpointPermit {
  /** End the turn (frees its concurrency slot) and report how it went. Idempotent after the first call. */
  release(outcome: AttemptOutcome): Promise<void>;
}

/** Raised by `acquire` when the signal aborts before a turn came: the wait is over, not the call. */
export class RateLimitWaitAborted extends Error {
  override readonly name = 'RateLimitWaitAborted';
  constructor(readonly waitedMs: number, readonly reason: unknown) {
    super(`no turn of the model endpoint's fleet-wide limits within ${waitedMs} ms`);
  }
}

export interface EndpointLimiter {
  /**
   * Wait for a turn: a concurrency slot, a request of the per-minute allowance, and no pause from an
   * upstream Retry-After. Rejects with RateLimitWaitAborted when `signal` aborts first.
   */
  acquire(signal: AbortSignal): Promise<EndpointPermit>;
}

const NO_OP_PERMIT: EndpointPermit = { release: async () => undefined };

/** No limits: every attempt gets a turn at once. */
export const UNLIMITED: EndpointLimiter = {
  async acquire(signal) {
    if (signal.aborted) throw new RateLimitWaitAborted(0, signal.reason);
    return NO_OP_PERMIT;
  },
};

// The model stub's own rate limit, as an inference server's gateway enforces one: a token bucket of
// `rpm` requests per minute that holds about one second's worth (at least 1), full at the start. A
// request that finds it empty is refused with how long until the next request would pass. A leaf.

export type StubTake = { ok: true } | { ok: false; retryAfterMs: number };

export class StubRateLimit {
  /** Requests the bucket holds when full: one second's worth, at least 1. */
  readonly burst: number;
  private readonly perMs: number;
  private level: number;
  private at: number | undefined;

  constructor(readonly rpm: number) {
    if (!(Number.isFinite(rpm) && rpm > 0)) throw new TypeError(`Expected \`rpm\` to be a number above 0, got \`${String(rpm)}\` (${typeof rpm})`);
    this.perMs = rpm / 60_000;
    this.burst = Math.max(1, Math.floor(rpm / 60));
    this.level = this.burst;
  }

  /** Take one request's token at `nowMs` (any monotonic clock in ms), or say how long until one is there. */
  take(nowMs: number): StubTake {
    if (this.at !== undefined) this.level = Math.min(this.burst, this.level + Math.max(0, nowMs - this.at) * this.perMs);
    this.at = nowMs;
    if (this.level >= 1) {
      this.level -= 1;
      return { ok: true };
    }
    return { ok: false, retryAfterMs: Math.ceil((1 - this.level) / this.perMs) };
  }
}

import { describe, expect, it } from 'vitest';
import { StubRateLimit } from '../../src/model/stub-rate-limit.ts';

describe('the model stub rate limit', () => {
  it('lets a second worth through at once, then one request per interval, and says when the next one passes', () => {
    const limit = new StubRateLimit(600); // 10 a second, every 100 ms
    expect(limit.burst).toBe(10);
    const at0 = Array.from({ length: 11 }, () => limit.take(1_000));
    expect(at0.filter((t) => t.ok)).toHaveLength(10);
    expect(at0[10]).toEqual({ ok: false, retryAfterMs: 100 });
    expect(limit.take(1_060)).toEqual({ ok: false, retryAfterMs: 40 });
    expect(limit.take(1_100)).toEqual({ ok: true });
    expect(limit.take(1_100).ok).toBe(false);
    // Idle for a minute: full again, and no fuller than the burst.
    expect(Array.from({ length: 11 }, () => limit.take(61_100)).filter((t) => t.ok)).toHaveLength(10);
  });

  it('holds at least one request, however low the rate', () => {
    const limit = new StubRateLimit(6); // one every 10 s
    expect(limit.burst).toBe(1);
    expect(limit.take(0)).toEqual({ ok: true });
    expect(limit.take(1_000)).toEqual({ ok: false, retryAfterMs: 9_000 });
    expect(() => new StubRateLimit(0)).toThrow(TypeError);
  });
});

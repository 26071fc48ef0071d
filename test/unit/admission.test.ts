// The admission controller's AIMD on synthetic inputs, on its own clock: it cuts under the engine's
// slowness (relative to its baseline, past the latency budget, on timeouts, on load when asked), once
// per window and only after the last cut took effect, recovers one slot a window, slow-starts to a
// large ceiling, and stays between its floor and its ceiling.
import { describe, expect, it } from 'vitest';
import { AdmissionController, type AdmissionOptions } from '../../src/worker/admission.ts';

const WINDOW = 1_000;

/** A controller at t=0 and a driver that plays one window of calls and use samples, then decides. */
function harness(opts: Partial<AdmissionOptions> & { ceiling: number }) {
  let now = 0;
  const c = new AdmissionController({ windowMs: WINDOW, minSamples: 5, ...opts }, now);
  const window = (w: { ms?: number; calls?: number; what?: string; inUse?: number; timeouts?: number; load?: number }) => {
    const calls = w.calls ?? 10;
    for (let i = 0; i < calls; i++) c.observe({ what: w.what ?? 'create container', ms: w.ms ?? 50, outcome: 'ok' }, now + i);
    for (let i = 0; i < (w.timeouts ?? 0); i++) c.observe({ what: 'remove container', ms: 30_000, outcome: 'timeout' }, now);
    for (let i = 0; i < 8; i++) c.sampleUse(w.inUse ?? c.allowance);
    now += WINDOW;
    return c.decide(now, w.load);
  };
  return { c, window, at: () => now, advance: (ms: number) => (now += ms) };
}

describe('AdmissionController', () => {
  it('starts at min(ceiling, 4), never under its floor', () => {
    expect(new AdmissionController({ ceiling: 2 }, 0).allowance).toBe(2);
    expect(new AdmissionController({ ceiling: 32 }, 0).allowance).toBe(4);
    expect(new AdmissionController({ ceiling: 32, floor: 6 }, 0).allowance).toBe(6);
    // A floor above the ceiling (a --concurrency below FLEET_WORKER_CONCURRENCY_FLOOR) is the ceiling.
    const capped = new AdmissionController({ ceiling: 3, floor: 8 }, 0);
    expect([capped.floor, capped.allowance]).toEqual([3, 3]);
    expect(() => new AdmissionController({ ceiling: 0 }, 0)).toThrow(RangeError);
  });

  it('slow-starts to the ceiling while healthy and saturated, and holds there', () => {
    const { c, window } = harness({ ceiling: 32 });
    const seen = [c.allowance];
    for (let i = 0; i < 5; i++) seen.push(window({ ms: 50 })!.to);
    expect(seen).toEqual([4, 8, 16, 32, 32, 32]);
    expect(window({ ms: 50 })).toMatchObject({ change: 'hold', reason: 'at the ceiling' });
  });

  it('does not grow when the worker is not saturated (no demand for more slots)', () => {
    const { c, window } = harness({ ceiling: 32 });
    expect(window({ ms: 50, inUse: 1 })).toMatchObject({ change: 'hold', reason: 'not saturated' });
    expect(c.allowance).toBe(4);
  });

  it('cuts x0.7 when the slowdown over the baselines passes the limit, ends slow start, then recovers one slot a window', () => {
    const { c, window } = harness({ ceiling: 40, initial: 16 });
    // The baseline: 50 ms (the lowest median of 5 calls). 300 ms in the next window: over both windows
    // (3000 + 500) / (500 + 500) = 3.5x, under the default limit of 6x.
    expect(window({ ms: 50, inUse: 1 })!.window.slowdown).toBeCloseTo(1);
    const grown = window({ ms: 300 })!;
    expect(grown).toMatchObject({ change: 'increase', to: 32 });
    expect(grown.window.slowdown).toBeCloseTo(3.5);
    // 600 ms: (6000 + 3000) / 1000 = 9x.
    const cut = window({ ms: 600, inUse: 20 })!;
    expect(cut).toMatchObject({ change: 'decrease', from: 32, to: 22 });
    expect(cut.reason).toBe('slowdown 9.0x > 6x');
    expect(cut.window.slowdown).toBeCloseTo(9);
    // After a cut the slowdown starts afresh: 60 ms is 1.2x, healthy at once.
    const after = [22];
    for (let i = 0; i < 3; i++) after.push(window({ ms: 60 })!.to);
    expect(after).toEqual([22, 23, 24, 25]);
    expect(c.snapshot(0)).toMatchObject({ decreases: 1, increases: 4, slowStart: false, baselineMs: { 'create container': 50 } });
    // Weighted by time: the slowdown is the calls' time over their baselines' time, whatever their mix.
    const mixed = harness({ ceiling: 40, initial: 16 });
    mixed.window({ ms: 20, what: 'create exec', calls: 50, inUse: 1 });
    mixed.window({ ms: 100, what: 'start container', inUse: 1 });
    for (let i = 0; i < 50; i++) mixed.c.observe({ what: 'create exec', ms: 20, outcome: 'ok' }, mixed.at());
    // (10 x 100 + 50 x 20 + 10 x 1000) / (10 x 100 + 50 x 20 + 10 x 100) over the last two windows.
    expect(mixed.window({ ms: 1_000, what: 'start container', inUse: 1 })!.window.slowdown).toBeCloseTo(4);
    // A lower limit cuts sooner.
    const strict = harness({ ceiling: 40, initial: 16, maxSlowdown: 3 });
    strict.window({ ms: 50, inUse: 1 });
    expect(strict.window({ ms: 300 })).toMatchObject({ change: 'decrease', to: 11 });
  });

  it('cuts once per window, and not again until running episodes fell to the last cut', () => {
    const { c, window } = harness({ ceiling: 32, initial: 20, maxLatencyMs: 1_000 });
    expect(window({ ms: 2_000, inUse: 20 })).toMatchObject({ change: 'decrease', to: 14 });
    // Still 20 running (a cut does not stop running episodes): their calls are the old load's.
    expect(window({ ms: 2_000, inUse: 20 })).toMatchObject({ change: 'hold', reason: expect.stringMatching(/has not taken effect/) });
    expect(window({ ms: 2_000, inUse: 16 })).toMatchObject({ change: 'hold' });
    expect(c.allowance).toBe(14);
    // Down to the allowance: the next slow window cuts again.
    expect(window({ ms: 2_000, inUse: 14 })).toMatchObject({ change: 'decrease', from: 14, to: 9 });
    // One decision per window however many calls come: a window is at least windowMs long.
    const { c: c2 } = harness({ ceiling: 32, initial: 20, maxLatencyMs: 1_000 });
    for (let i = 0; i < 50; i++) c2.observe({ what: 'start container', ms: 5_000, outcome: 'ok' }, i);
    c2.sampleUse(10);
    // (Slow start, until this first cut, decides every half window.)
    expect(c2.decide(WINDOW / 2 - 1)).toBeUndefined();
    expect(c2.decide(WINDOW / 2)).toMatchObject({ change: 'decrease', to: 14 });
    for (let i = 0; i < 50; i++) c2.observe({ what: 'start container', ms: 5_000, outcome: 'ok' }, WINDOW);
    c2.sampleUse(10);
    expect(c2.decide(WINDOW / 2 + WINDOW - 1)).toBeUndefined();
    expect(c2.decide(WINDOW / 2 + WINDOW)).toMatchObject({ change: 'decrease', to: 9 });
  });

  it('cuts past the latency budget with no baseline yet, and on any timed-out call without latency samples', () => {
    const slow = harness({ ceiling: 8, maxLatencyMs: 3_000 });
    expect(slow.window({ ms: 3_500, inUse: 2 })).toMatchObject({ change: 'decrease', from: 4, to: 2, reason: 'p90 latency 3500 ms > 3000 ms' });
    const stuck = harness({ ceiling: 8 });
    // No watched call in the window, but a removal ran into its deadline: the window closes at once.
    expect(stuck.window({ calls: 0, timeouts: 1, inUse: 2 })).toMatchObject({ change: 'decrease', to: 2, reason: '1 Docker call(s) timed out' });
  });

  it('never goes under its floor or over its ceiling', () => {
    const { c, window } = harness({ ceiling: 10, initial: 10, floor: 3, maxLatencyMs: 100 });
    const seen: number[] = [];
    for (let i = 0; i < 8; i++) seen.push(window({ ms: 1_000, inUse: 0 })!.to);
    expect(seen).toEqual([7, 4, 3, 3, 3, 3, 3, 3]);
    expect(window({ ms: 1_000, inUse: 0 })).toMatchObject({ change: 'hold', reason: expect.stringMatching(/at the floor/) });
    for (let i = 0; i < 20; i++) window({ ms: 10 });
    expect(c.allowance).toBe(10);
  });

  it('uses the load per core only when a limit is set', () => {
    const off = harness({ ceiling: 8 });
    expect(off.window({ ms: 50, load: 50 })).toMatchObject({ change: 'increase' });
    const on = harness({ ceiling: 8, maxLoadPerCore: 2 });
    expect(on.window({ ms: 50, load: 2.5, inUse: 4 })).toMatchObject({ change: 'decrease', to: 2, reason: 'load 2.5 per core > 2' });
    expect(on.window({ ms: 50, load: 1.5 })).toMatchObject({ change: 'increase', to: 3 });
  });

  it('waits for enough watched calls to judge latency, up to 10 windows, and does not grow without them', () => {
    const { c, window, advance, at } = harness({ ceiling: 8, maxLatencyMs: 100 });
    // Unwatched calls (their time is what they copy) and failed ones are not latency samples.
    c.observe({ what: 'put archive', ms: 9_000, outcome: 'ok' }, at());
    c.observe({ what: 'create container', ms: 9_000, outcome: 'error' }, at());
    expect(window({ ms: 500, calls: 2 })).toBeUndefined();
    advance(8 * WINDOW);
    expect(c.decide(at())).toBeUndefined();
    advance(WINDOW);
    // Ten windows: it closes with what it has, too few calls to judge latency by (500 ms is over the
    // budget, but two calls do not say so), nor to grow on.
    expect(c.decide(at())).toMatchObject({ change: 'hold', reason: 'too few engine calls (2) to judge its latency', window: { samples: 2 } });
    expect(c.allowance).toBe(4);
    // A timeout needs no latency samples.
    c.observe({ what: 'start container', ms: 30_000, outcome: 'timeout' }, at());
    advance(WINDOW);
    expect(c.decide(at())).toMatchObject({ change: 'decrease', to: 2 });
  });

  it('takes each op\'s baseline as the lowest median of 5 of its calls, rising by 1% a minute', () => {
    const { c, at, advance } = harness({ ceiling: 8 });
    for (const ms of [40, 400, 30, 35, 500]) c.observe({ what: 'create exec', ms, outcome: 'ok' }, at());
    expect(c.baseline('create exec', at())).toBe(40);
    advance(60_000);
    expect(c.baseline('create exec', at())).toBeCloseTo(40.4);
    // A higher median does not move it; a lower one sets it again.
    for (const ms of [90, 95, 100, 105, 110]) c.observe({ what: 'create exec', ms, outcome: 'ok' }, at());
    expect(c.baseline('create exec', at())).toBeCloseTo(40.4);
    for (const ms of [30, 31, 32, 33, 34]) c.observe({ what: 'create exec', ms, outcome: 'ok' }, at());
    expect(c.baseline('create exec', at())).toBe(32);
    // An engine slower for good: after two hours the baseline has more than tripled... and meets it.
    advance(120 * 60_000);
    expect(c.baseline('create exec', at())).toBeCloseTo(32 * 1.01 ** 120);
    expect(c.baseline('start container', at())).toBeUndefined();
  });
});

// Admission control of a worker: how many episodes it runs at once (its allowance), between a floor
// and the configured concurrency (the ceiling), tuned by AIMD on what the Docker engine's latency and
// the host's load say. A host that cannot take its configured slots (16 on 2 cores) is kept from
// collapsing (engine calls running into their deadlines, episodes failing as infra); one with spare
// capacity is filled up to the ceiling.
//
// Inputs:
//  - every Docker call, as dockerCall reports it (observeDockerCalls): the latencies of the calls whose
//    cost is the engine's own and not the episode's content (WATCHED_CALLS: create, start and restart
//    container, create, start and inspect exec, inspect container; not archive copies, whose time is
//    the size of what is copied, nor removals), and the calls of any kind that ran into their deadline;
//  - how many episodes run now (sampled every window / 8);
//  - the host's load average (1 min) per core, only when a limit for it is set.
//
// Each op's baseline is the lowest median of 5 consecutive calls of it seen, rising by 1% a minute (so
// an engine that got slower for good is learned again within an hour or two): the engine's latency at
// its least loaded, the first ones taken at the start allowance, before it climbs. A window's slowdown
// is the time its watched calls took over the time their baselines add up to (a baseline under 20 ms
// counts as 20 ms), over that window and the one before: by how much the engine stretched the
// engine-bound part of the episodes. Weighted by time, it follows the slow calls that make up that
// part (create, start, restart), not the many quick ones.
//
// The rule, once per window (at least `windowMs`, 2 s, and `minSamples` (5) watched calls; a timeout
// closes it at once; without enough calls it closes after 10 x windowMs, and then may only cut):
//  - congestion, when any Docker call timed out, or the window's p90 latency of the watched calls is
//    over `maxLatencyMs` (a tenth of the call deadline: far from the cliff where calls fail), or the
//    slowdown is over `maxSlowdown` (6), or the load per core is over `maxLoadPerCore` (unset: not
//    used). Then the allowance is cut to floor(allowance x 0.7) (at least 1 less, not under the floor).
//    One cut per window, and none until the last one took effect (episodes running fell to the
//    allowance: a cut stops new episodes, it does not stop running ones, and their calls are still the
//    old load's);
//  - otherwise, when the window had enough calls to judge and the worker is saturated (episodes
//    running at the allowance for at least half of the window's samples: it would take more if it
//    could), the allowance grows: doubled while in slow start (from the start until the first
//    congestion; its windows are half as long), then by 1 a window;
//  - otherwise it holds.
// The allowance starts at min(ceiling, 4) (not under the floor), so workers of 4 slots or fewer start
// as they always did, and a large ceiling is reached by slow start in a few windows.
//
// Why these limits (docs/PERFORMANCE.md, "Self-tuning concurrency"): on a 2-core host shared with
// other work, trivial episodes reached their best throughput between 8 and 32 at once, depending on
// that other work, with the slowdown (against the latencies at 4) at 1-2.5 at 16 and 2-8 at 32; past
// the point where the engine is busy, its latency grows with the episodes at once while throughput
// stays about flat, so a slowdown of 6 and a p90 budget of a tenth of the deadline keep the worker on
// that plateau without going further. The budget and the timeouts are what keep the engine's deadlines
// from failing episodes, whatever the baseline says.
//
// The allowance is applied to BullMQ's Worker through its `concurrency` setter: a lower one stops
// fetching until running episodes fall under it; a higher one takes effect when the worker next looks
// for jobs (when an episode ends).
import os from 'node:os';
import type { Logger } from 'pino';
import { observeDockerCalls, type DockerCallSample } from '../sandbox/docker-client.ts';

/** The Docker calls whose latency is the engine's (not the size of what the episode copies or kills). */
export const WATCHED_CALLS: readonly string[] = ['create container', 'start container', 'restart container', 'create exec', 'start exec', 'inspect exec', 'inspect container'];

export interface AdmissionOptions {
  /** The configured concurrency: the allowance never goes above it. */
  ceiling: number;
  /** The allowance never goes below it. @default 1 */
  floor?: number;
  /** Allowance at start. @default min(ceiling, max(floor, 4)) */
  initial?: number;
  /** Shortest window of one decision. @default 2000 */
  windowMs?: number;
  /** Watched calls a window waits for before it decides on latency (it closes anyway after 10 windows). @default 5 */
  minSamples?: number;
  /** Cut factor on congestion. @default 0.7 */
  decrease?: number;
  /** Congestion when the window's p90 latency of watched calls passes this. @default 3000 */
  maxLatencyMs?: number;
  /** Congestion when the slowdown (the watched calls' time over their baselines') passes this. @default 6 */
  maxSlowdown?: number;
  /** Congestion when the host's 1-minute load average per core passes this. @default unset (not used) */
  maxLoadPerCore?: number | undefined;
  /** An op's baseline rises by this factor a minute (then any lower median sets it again). @default 1.01 */
  baselineDriftPerMinute?: number;
  /** A baseline under this counts as this. @default 20 */
  minBaselineMs?: number;
  /** Calls whose latency is watched. @default WATCHED_CALLS */
  watched?: readonly string[];
}

export type AdmissionChange = 'increase' | 'decrease' | 'hold';

export interface AdmissionDecision {
  change: AdmissionChange;
  from: number;
  to: number;
  /** Why: the congestion signals, or what held or raised it. */
  reason: string;
  window: WindowStats;
}

export interface WindowStats {
  /** Watched calls that ended in the window. */
  samples: number;
  /** p50 and p90 latency of the watched calls, in ms (undefined without samples). */
  p50Ms?: number | undefined;
  p90Ms?: number | undefined;
  /**
   * The watched calls' total time over what their baselines add up to, in this window and the one
   * before (undefined before any baseline).
   */
  slowdown?: number | undefined;
  /** Mean of the window's use samples: episodes running. */
  meanInUse: number;
  /** Docker calls of any kind that ran into their deadline in the window. */
  timeouts: number;
  /** Share of the window's use samples with every allowed slot busy. */
  saturation: number;
  loadPerCore?: number | undefined;
  durationMs: number;
}

export interface AdmissionSnapshot {
  allowance: number;
  floor: number;
  ceiling: number;
  slowStart: boolean;
  /** Episodes running at the last use sample. */
  inUse: number;
  increases: number;
  decreases: number;
  /** The last closed window (undefined before the first). */
  window?: WindowStats | undefined;
  /** The engine's latency in the last window that had watched calls (an idle window has none). */
  latency?: { p50Ms: number; p90Ms: number; slowdown?: number | undefined; samples: number } | undefined;
  /** Each watched op's baseline latency, in ms. */
  baselineMs: Record<string, number>;
}

const BASELINE_GROUP = 5;

function percentile(sorted: readonly number[], p: number): number | undefined {
  if (sorted.length === 0) return undefined;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))];
}

/** The AIMD controller, on explicit clocks (every input says when): the runner below feeds it. */
export class AdmissionController {
  readonly floor: number;
  readonly ceiling: number;
  private readonly o: Required<Omit<AdmissionOptions, 'maxLoadPerCore' | 'initial' | 'floor' | 'ceiling'>> & { maxLoadPerCore?: number | undefined };
  private readonly watched: ReadonlySet<string>;
  private current: number;
  private slow = true;
  private increases = 0;
  private decreases = 0;
  /** A cut was made and running episodes have not yet fallen to the allowance. */
  private cutPending = false;
  private lastCutAt = Number.NEGATIVE_INFINITY;
  private inUse = 0;
  private windowStart: number;
  private latencies: { what: string; ms: number }[] = [];
  private timeouts = 0;
  private useSamples = 0;
  private useSum = 0;
  private saturatedSamples = 0;
  private last: WindowStats | undefined;
  private lastLatency: AdmissionSnapshot['latency'];
  /** Per op: calls not yet grouped in fives, and the baseline (its value, and when it was set). */
  private readonly pending = new Map<string, number[]>();
  private readonly baselines = new Map<string, { at: number; ms: number }>();
  /** The previous window's watched time and baseline time, for the two-window slowdown. */
  private previous = { spent: 0, expected: 0 };

  constructor(opts: AdmissionOptions, now: number) {
    if (!Number.isInteger(opts.ceiling) || opts.ceiling < 1) throw new RangeError(`ceiling: expected an integer from 1 up, got ${opts.ceiling}`);
    this.ceiling = opts.ceiling;
    this.floor = Math.min(this.ceiling, Math.max(1, Math.floor(opts.floor ?? 1)));
    this.current = Math.min(this.ceiling, Math.max(this.floor, Math.floor(opts.initial ?? 4)));
    this.o = {
      windowMs: opts.windowMs ?? 2_000,
      minSamples: opts.minSamples ?? 5,
      decrease: opts.decrease ?? 0.7,
      maxLatencyMs: opts.maxLatencyMs ?? 3_000,
      maxSlowdown: opts.maxSlowdown ?? 6,
      maxLoadPerCore: opts.maxLoadPerCore,
      baselineDriftPerMinute: opts.baselineDriftPerMinute ?? 1.01,
      minBaselineMs: opts.minBaselineMs ?? 20,
      watched: opts.watched ?? WATCHED_CALLS,
    };
    if (!(this.o.decrease > 0 && this.o.decrease < 1)) throw new RangeError(`decrease: expected a factor between 0 and 1, got ${this.o.decrease}`);
    this.watched = new Set(this.o.watched);
    this.windowStart = now;
  }

  get allowance(): number {
    return this.current;
  }

  /** One finished Docker call. */
  observe(sample: DockerCallSample, now: number): void {
    if (sample.outcome === 'timeout') this.timeouts++;
    if (sample.outcome !== 'ok' || !this.watched.has(sample.what)) return;
    this.latencies.push({ what: sample.what, ms: sample.ms });
    const group = this.pending.get(sample.what) ?? [];
    group.push(sample.ms);
    if (group.length < BASELINE_GROUP) {
      this.pending.set(sample.what, group);
      return;
    }
    this.pending.delete(sample.what);
    const ms = percentile(group.sort((a, b) => a - b), 0.5)!;
    const current = this.baseline(sample.what, now);
    if (current === undefined || ms < current) this.baselines.set(sample.what, { at: now, ms });
  }

  /** How many episodes run now. */
  sampleUse(inUse: number): void {
    this.inUse = inUse;
    this.useSamples++;
    this.useSum += inUse;
    if (inUse >= this.current) this.saturatedSamples++;
    if (this.cutPending && inUse <= this.current) this.cutPending = false;
  }

  /** The op's baseline latency in ms, if it has one. */
  baseline(what: string, now: number): number | undefined {
    const b = this.baselines.get(what);
    if (b === undefined) return undefined;
    return b.ms * this.o.baselineDriftPerMinute ** (Math.max(0, now - b.at) / 60_000);
  }

  /**
   * Close the window if it is due and decide: undefined while it is not. `loadPerCore` is the host's
   * 1-minute load average per core now (only compared when maxLoadPerCore is set).
   */
  decide(now: number, loadPerCore?: number): AdmissionDecision | undefined {
    const elapsed = now - this.windowStart;
    // Slow start decides twice as often: the allowance is still far from where it belongs.
    if (elapsed < (this.slow ? this.o.windowMs / 2 : this.o.windowMs)) return undefined;
    if (this.latencies.length < this.o.minSamples && this.timeouts === 0 && elapsed < 10 * this.o.windowMs) return undefined;
    const window = this.closeWindow(now, elapsed, loadPerCore);
    const from = this.current;
    const enough = window.samples >= this.o.minSamples;
    const congestion: string[] = [];
    if (window.timeouts > 0) congestion.push(`${window.timeouts} Docker call(s) timed out`);
    if (enough && window.p90Ms! > this.o.maxLatencyMs) congestion.push(`p90 latency ${Math.round(window.p90Ms!)} ms > ${this.o.maxLatencyMs} ms`);
    if (enough && window.slowdown !== undefined && window.slowdown > this.o.maxSlowdown) {
      congestion.push(`slowdown ${window.slowdown.toFixed(1)}x > ${this.o.maxSlowdown}x`);
    }
    if (this.o.maxLoadPerCore !== undefined && loadPerCore !== undefined && loadPerCore > this.o.maxLoadPerCore) {
      congestion.push(`load ${loadPerCore.toFixed(1)} per core > ${this.o.maxLoadPerCore}`);
    }
    const result = (change: AdmissionChange, reason: string): AdmissionDecision => ({ change, from, to: this.current, reason, window });
    if (congestion.length > 0) {
      this.slow = false;
      if (this.cutPending) return result('hold', `${congestion.join('; ')}; the last cut has not taken effect yet`);
      if (now - this.lastCutAt < this.o.windowMs) return result('hold', `${congestion.join('; ')}; cut less than a window ago`);
      if (this.current <= this.floor) return result('hold', `${congestion.join('; ')}; at the floor`);
      this.current = Math.max(this.floor, Math.min(this.current - 1, Math.floor(this.current * this.o.decrease)));
      this.decreases++;
      // The next window's slowdown starts afresh: this one's calls were judged already.
      this.previous = { spent: 0, expected: 0 };
      this.lastCutAt = now;
      this.cutPending = this.inUse > this.current;
      return result('decrease', congestion.join('; '));
    }
    // Growing takes evidence of a healthy engine: a window closed by its time limit had too few calls.
    if (!enough) return result('hold', `too few engine calls (${window.samples}) to judge its latency`);
    if (window.saturation < 0.5) return result('hold', 'not saturated');
    if (this.current >= this.ceiling) return result('hold', 'at the ceiling');
    this.current = Math.min(this.ceiling, this.slow ? this.current * 2 : this.current + 1);
    this.increases++;
    return result('increase', this.slow ? 'saturated, healthy (slow start)' : 'saturated, healthy');
  }

  snapshot(now: number): AdmissionSnapshot {
    const baselineMs: Record<string, number> = {};
    for (const what of this.watched) {
      const b = this.baseline(what, now);
      if (b !== undefined) baselineMs[what] = Math.round(b * 10) / 10;
    }
    return {
      allowance: this.current, floor: this.floor, ceiling: this.ceiling, slowStart: this.slow, inUse: this.inUse,
      increases: this.increases, decreases: this.decreases, window: this.last, latency: this.lastLatency, baselineMs,
    };
  }

  private closeWindow(now: number, elapsed: number, loadPerCore: number | undefined): WindowStats {
    const ms = this.latencies.map((l) => l.ms).sort((a, b) => a - b);
    const baselines = new Map([...this.watched].map((what) => [what, this.baseline(what, now)]));
    let spent = 0;
    let expected = 0;
    for (const l of this.latencies) {
      const b = baselines.get(l.what);
      if (b === undefined) continue;
      spent += l.ms;
      expected += Math.max(b, this.o.minBaselineMs);
    }
    const both = { spent: spent + this.previous.spent, expected: expected + this.previous.expected };
    this.previous = { spent, expected };
    const window: WindowStats = {
      samples: ms.length,
      p50Ms: percentile(ms, 0.5),
      p90Ms: percentile(ms, 0.9),
      slowdown: both.expected > 0 ? both.spent / both.expected : undefined,
      meanInUse: this.useSamples === 0 ? 0 : this.useSum / this.useSamples,
      timeouts: this.timeouts,
      saturation: this.useSamples === 0 ? 0 : this.saturatedSamples / this.useSamples,
      loadPerCore,
      durationMs: elapsed,
    };
    this.last = window;
    if (window.samples > 0) this.lastLatency = { p50Ms: window.p50Ms!, p90Ms: window.p90Ms!, slowdown: window.slowdown, samples: window.samples };
    this.windowStart = now;
    this.latencies = [];
    this.timeouts = 0;
    this.useSamples = 0;
    this.useSum = 0;
    this.saturatedSamples = 0;
    return window;
  }
}

/** What the allowance is applied to: BullMQ's Worker (its `concurrency` setter). */
export interface ConcurrencyTarget {
  concurrency: number;
}

export interface AdmissionRunnerOptions extends AdmissionOptions {
  /** Episodes running now. */
  inUse: () => number;
  log: Logger;
  /** Apply the allowance to the target (false: measure and report only). @default true */
  autotune?: boolean;
  /** The host's 1-minute load average per core. @default os.loadavg()[0] / os.availableParallelism() */
  loadPerCore?: () => number;
  /** Told of every decision that changed the allowance (tests, logs). */
  onChange?: (decision: AdmissionDecision) => void;
}

export interface AdmissionRunner {
  /** The allowance now (the ceiling when autotune is off). */
  readonly allowance: number;
  readonly autotune: boolean;
  /** Start applying the allowance to `target` (set now, then at every change). */
  attach(target: ConcurrencyTarget): void;
  snapshot(): AdmissionSnapshot & { autotune: boolean };
  stop(): void;
}

/** Feed a controller from this process's Docker calls and the running episodes, and apply its allowance. */
export function startAdmission(opts: AdmissionRunnerOptions): AdmissionRunner {
  const autotune = opts.autotune ?? true;
  const controller = new AdmissionController(autotune ? opts : { ...opts, initial: opts.ceiling, floor: opts.ceiling }, performance.now());
  const loadPerCore = opts.loadPerCore ?? (() => os.loadavg()[0]! / os.availableParallelism());
  let target: ConcurrencyTarget | undefined;
  const unobserve = observeDockerCalls((sample) => controller.observe(sample, performance.now()));
  const tickMs = Math.max(25, Math.floor((opts.windowMs ?? 2_000) / 8));
  const timer = setInterval(() => {
    controller.sampleUse(opts.inUse());
    const decision = controller.decide(performance.now(), loadPerCore());
    if (decision === undefined) return;
    if (decision.change === 'hold') {
      opts.log.debug({ allowance: decision.to, reason: decision.reason, window: decision.window }, 'concurrency allowance held');
      return;
    }
    if (target !== undefined && autotune) target.concurrency = decision.to;
    opts.log.info({ allowance: decision.to, from: decision.from, reason: decision.reason, window: decision.window }, `concurrency allowance ${decision.change}d`);
    opts.onChange?.(decision);
  }, tickMs);
  timer.unref();
  return {
    get allowance() {
      return controller.allowance;
    },
    autotune,
    attach(t) {
      target = t;
      if (autotune) t.concurrency = controller.allowance;
    },
    snapshot: () => ({ ...controller.snapshot(performance.now()), autotune }),
    stop() {
      clearInterval(timer);
      unobserve();
    },
  };
}

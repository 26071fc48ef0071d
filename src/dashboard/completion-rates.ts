// Throughput from the batches' completion streams (results-store.ts): each stream entry's id is the
// Redis time its result was recorded. The tracker reads only the entries it has not seen (a cursor
// per batch) and keeps counts per 10 s of the last 15 minutes, per batch, so the fleet page (polled
// every 2 s) and the batch pages cost what finished since they last looked, not the batches' size.
// Times are Redis's (TIME), so a dashboard on another host with a skewed clock counts the same.
import type { Redis } from 'ioredis';
import { batchCompletionsKey } from '../redis/redis-keys.ts';

export interface CompletionRatesOptions {
  /** How far back counts are kept (and read, the first time a batch is seen). @default 15 min */
  windowMs?: number;
  /** @default 10 s */
  bucketMs?: number;
}

/** Entries read per batch and call; a batch with more new ones is read again at once. */
const READ_COUNT = 5_000;
/** Batches followed at most (the least recently asked for are forgotten first). */
const MAX_BATCHES = 2_000;

export class CompletionRates {
  readonly windowMs: number;
  readonly bucketMs: number;
  private readonly cursors = new Map<string, string>();
  private readonly buckets = new Map<string, Map<number, number>>();
  private skewMs = 0;
  private refreshing: Promise<void> = Promise.resolve();

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    opts: CompletionRatesOptions = {},
  ) {
    this.windowMs = opts.windowMs ?? 15 * 60_000;
    this.bucketMs = opts.bucketMs ?? 10_000;
  }

  /** Redis's clock now, as far as this process can tell (ms since the epoch). */
  now(): number {
    return Date.now() + this.skewMs;
  }

  /** Read what the batches' streams gained since last time; one refresh at a time. */
  refresh(batchIds: readonly string[]): Promise<void> {
    const run = this.refreshing.catch(() => undefined).then(() => this.read([...new Set(batchIds)]));
    this.refreshing = run;
    return run;
  }

  private async read(batchIds: string[]): Promise<void> {
    const t0 = Date.now();
    const [seconds, micros] = await this.redis.time();
    this.skewMs = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000) - Math.round((t0 + Date.now()) / 2);
    const floor = this.now() - this.windowMs;
    let pending = batchIds;
    while (pending.length > 0) {
      const pipeline = this.redis.pipeline();
      for (const batchId of pending) {
        const cursor = this.cursors.get(batchId);
        pipeline.xrange(batchCompletionsKey(this.prefix, batchId), cursor === undefined ? String(floor) : `(${cursor}`, '+', 'COUNT', READ_COUNT);
      }
      const replies = (await pipeline.exec()) ?? [];
      const more: string[] = [];
      pending.forEach((batchId, i) => {
        const [err, entries] = replies[i] ?? [];
        if (err) throw err;
        const list = (entries ?? []) as [string, string[]][];
        this.touch(batchId);
        const counts = this.buckets.get(batchId) ?? new Map<number, number>();
        for (const [id] of list) {
          const at = Number(id.slice(0, id.indexOf('-')));
          if (at < floor) continue;
          const bucket = at - (at % this.bucketMs);
          counts.set(bucket, (counts.get(bucket) ?? 0) + 1);
        }
        const last = list.at(-1)?.[0];
        // A batch seen for the first time with nothing recent: its cursor is the floor, not the start.
        this.cursors.set(batchId, last ?? this.cursors.get(batchId) ?? `${floor}-0`);
        this.buckets.set(batchId, counts);
        if (list.length === READ_COUNT) more.push(batchId);
      });
      pending = more;
    }
    for (const counts of this.buckets.values()) {
      for (const bucket of counts.keys()) if (bucket + this.bucketMs <= floor) counts.delete(bucket);
    }
  }

  /** Keep a batch among the most recently asked for; forget the oldest beyond MAX_BATCHES. */
  private touch(batchId: string): void {
    const cursor = this.cursors.get(batchId);
    if (cursor !== undefined) {
      this.cursors.delete(batchId);
      this.cursors.set(batchId, cursor);
    }
    while (this.cursors.size > MAX_BATCHES) {
      const oldest = this.cursors.keys().next().value as string;
      this.cursors.delete(oldest);
      this.buckets.delete(oldest);
    }
  }

  /** When the batch's last result was recorded (Redis time, ms), or undefined when none was. */
  async lastCompletionMs(batchId: string): Promise<number | undefined> {
    const [entry] = await this.redis.xrevrange(batchCompletionsKey(this.prefix, batchId), '+', '-', 'COUNT', 1);
    return entry === undefined ? undefined : Number(entry[0].slice(0, entry[0].indexOf('-')));
  }

  /** Completions recorded in the last `ms` (at most the window), of one batch or of every batch followed. */
  count(ms: number, batchId?: string): number {
    const since = this.now() - Math.min(ms, this.windowMs);
    let n = 0;
    for (const [id, counts] of this.buckets) {
      if (batchId !== undefined && id !== batchId) continue;
      // A bucket counts when it started within the span: at most one bucket of imprecision.
      for (const [bucket, c] of counts) if (bucket >= since - this.bucketMs / 2) n += c;
    }
    return n;
  }

  /** Completions per `stepMs` over the last `spanMs`, oldest first; the last step is the one under way. */
  series(spanMs: number, stepMs: number, batchId?: string): { startMs: number; count: number }[] {
    const now = this.now();
    const steps = Math.max(1, Math.ceil(Math.min(spanMs, this.windowMs) / stepMs));
    const first = now - (now % stepMs) - (steps - 1) * stepMs;
    const out = Array.from({ length: steps }, (_, i) => ({ startMs: first + i * stepMs, count: 0 }));
    for (const [id, counts] of this.buckets) {
      if (batchId !== undefined && id !== batchId) continue;
      for (const [bucket, c] of counts) {
        const i = Math.floor((bucket - first) / stepMs);
        if (i >= 0 && i < steps) out[i]!.count += c;
      }
    }
    return out;
  }
}

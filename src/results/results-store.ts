// Where batches and episode results live. Redis is the authority (any host can read status); every
// result is also written as a JSON file under FLEET_DATA_DIR/results/<batch>/ for people and tools.
// An episode's first recorded result wins: a duplicate delivery cannot record a second one. A retry by
// kind supersedes a result in steps that never leave an episode with neither a job nor a result: mark,
// requeue the job, then forget the result (or let the next pick-up forget it), atomically with the mark.
import path from 'node:path';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { EpisodeResult } from '../episode/episode-job.ts';
import { writeFileAtomic } from '../files/atomic-write.ts';
import {
  batchCompletionsKey, batchesKey, batchManifestKey, batchOutlinesKey, batchResultsKey, batchResultsVersionKey, batchSummaryCacheKey, batchSummaryKey, episodeRetryKey,
} from '../redis/redis-keys.ts';
import { luaScript } from '../redis/lua-script.ts';
import { summarize, type BatchSummary } from './batch-summary.ts';
import { decodeOutline, encodeOutline, type ResultOutline } from './result-outline.ts';

export const BatchManifest = z.object({
  batchId: z.string(),
  name: z.string(),
  createdAt: z.string(),
  /** Every episode of the batch, in enqueue order. */
  episodeIds: z.array(z.string()),
  /** The batch's passThreshold (unset: 1), which the summary's pass@k counts by. */
  passThreshold: z.number().optional(),
  /** The endpoint (and model name) the batch plays: its `model.endpoint` and `model.name`. Absent from batches before it: `default`. */
  model: z.object({ endpoint: z.string(), name: z.string().optional() }).optional(),
});
export type BatchManifest = z.infer<typeof BatchManifest>;

/** A retry mark outlives any job kept for a retry (7 days) by a day. */
const RETRY_MARK_TTL_SEC = 8 * 24 * 3600;

/**
 * Record a result once, with its outline, and append it to the batch's completion stream in the same
 * step, so a reader of the stream never misses a recorded result nor sees one twice. The stream entry
 * id, or null when the episode had a result (src/redis/lua/result-record-4.lua).
 */
const RECORD_RESULT = luaScript<
  [results: string, completions: string, outlines: string, version: string],
  [episodeId: string, resultJson: string, status: string, reward: string, outline: string],
  string | null
>('result-record-4');

/** One entry of a batch's completion stream. */
export interface Completion {
  /** The stream entry id: pass it back as `after` to read on from there. */
  cursor: string;
  episodeId: string;
  status: string;
  reward: number | null;
}

/**
 * Atomically: when the episode is marked for a retry, forget its result (and outline) and the mark.
 * The result still recorded (JSON), or null when there is none (none recorded, or just forgotten)
 * (src/redis/lua/result-unless-retried-4.lua).
 */
const RESULT_UNLESS_RETRIED = luaScript<[results: string, retryMark: string, outlines: string, version: string], [episodeId: string], string | null>('result-unless-retried-4');

interface SummaryCache {
  /** The results version (a counter bumped with every result recorded or forgotten) and count it is of. */
  version: string;
  results: number;
  summary: BatchSummary;
}

export class ResultsStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly dataDir: string,
  ) {}

  private manifestKey(batchId: string) {
    return batchManifestKey(this.prefix, batchId);
  }

  private resultsKey(batchId: string) {
    return batchResultsKey(this.prefix, batchId);
  }

  private outlinesKey(batchId: string) {
    return batchOutlinesKey(this.prefix, batchId);
  }

  private versionKey(batchId: string) {
    return batchResultsVersionKey(this.prefix, batchId);
  }

  private summaryCacheKey(batchId: string) {
    return batchSummaryCacheKey(this.prefix, batchId);
  }

  private summaryKey(batchId: string) {
    return batchSummaryKey(this.prefix, batchId);
  }

  /** Every batch id, scored by its creation time, so the dashboard can list batches without a SCAN. */
  private batchesKey() {
    return batchesKey(this.prefix);
  }

  /** Record a batch once; false when it was recorded before (the same batch enqueued again). */
  async putManifest(manifest: BatchManifest): Promise<boolean> {
    const createdMs = Date.parse(manifest.createdAt);
    const replies = await this.redis
      .multi()
      .set(this.manifestKey(manifest.batchId), JSON.stringify(manifest), 'NX')
      .zadd(this.batchesKey(), 'NX', Number.isNaN(createdMs) ? Date.now() : createdMs, manifest.batchId)
      .exec();
    return replies?.[0]?.[1] === 'OK';
  }

  /** Batch ids, newest first (batches enqueued before this listing existed are not in it). */
  async listBatches(limit = 100): Promise<string[]> {
    return this.redis.zrevrange(this.batchesKey(), 0, Math.max(0, limit - 1));
  }

  /**
   * A page of batch ids, newest first, after the batch `after` (a previous page's last; unset: from the
   * newest): ids, and whether more follow. Undefined when `after` is not a listed batch.
   */
  async pageBatches(limit: number, after?: string): Promise<{ batchIds: string[]; more: boolean } | undefined> {
    let from = 0;
    if (after !== undefined) {
      const rank = await this.redis.zrevrank(this.batchesKey(), after);
      if (rank === null) return undefined;
      from = rank + 1;
    }
    const ids = await this.redis.zrevrange(this.batchesKey(), from, from + limit);
    return { batchIds: ids.slice(0, limit), more: ids.length > limit };
  }

  /** Whether the batch's completion stream holds an entry with this id (a cursor it sent). */
  async hasCompletion(batchId: string, id: string): Promise<boolean> {
    return (await this.redis.xrange(batchCompletionsKey(this.prefix, batchId), id, id, 'COUNT', 1)).length === 1;
  }

  /**
   * The summary as of now: the one last computed while the batch's results are still those it was
   * computed from (same version and count: a finished batch's status reads one small key), otherwise
   * computed from the results' outlines and kept for the next reader.
   */
  async summary(batchId: string): Promise<BatchSummary | undefined> {
    const [[, exists], [, version], [, count], [, cached]] = (await this.redis
      .multi()
      .exists(this.manifestKey(batchId))
      .get(this.versionKey(batchId))
      .hlen(this.resultsKey(batchId))
      .get(this.summaryCacheKey(batchId))
      .exec()) as [[Error | null, number], [Error | null, string | null], [Error | null, number], [Error | null, string | null]];
    if (exists !== 1) return undefined;
    if (cached !== null) {
      const c = JSON.parse(cached) as SummaryCache;
      // A summary cached before it carried its pass threshold is computed again.
      if (c.version === (version ?? '0') && c.results === count && c.summary.passThreshold !== undefined && c.summary.model !== undefined) return c.summary;
    }
    const manifest = await this.getManifest(batchId);
    if (manifest === undefined) return undefined;
    const read = await this.readOutlines(batchId, manifest);
    const summary = summarize(batchId, manifest.episodeIds.length, read.outlines, manifest.passThreshold, manifest.model);
    const entry: SummaryCache = { version: read.version, results: read.count, summary };
    // Only a cache: a reader that may not write (a read-only replica) still has its answer.
    await this.redis.set(this.summaryCacheKey(batchId), JSON.stringify(entry)).catch(() => undefined);
    return summary;
  }

  /** Compute the summary and store it (Redis and summary.json beside the results). */
  async storeSummary(batchId: string): Promise<BatchSummary> {
    const summary = await this.summary(batchId);
    if (summary === undefined) throw new Error(`no batch ${batchId}`);
    await this.redis.set(this.summaryKey(batchId), JSON.stringify(summary));
    await writeFileAtomic(path.join(this.dataDir, 'results', batchId, 'summary.json'), `${JSON.stringify(summary, null, 2)}\n`);
    return summary;
  }

  /** The summary stored when the batch ended (refreshed by late results, e.g. retries). */
  async storedSummary(batchId: string): Promise<BatchSummary | undefined> {
    const raw = await this.redis.get(this.summaryKey(batchId));
    return raw === null ? undefined : (JSON.parse(raw) as BatchSummary);
  }

  async getManifest(batchId: string): Promise<BatchManifest | undefined> {
    const raw = await this.redis.get(this.manifestKey(batchId));
    return raw === null ? undefined : BatchManifest.parse(JSON.parse(raw));
  }

  /** Record an episode's result; false (and nothing written) when it already had one. */
  async record(result: EpisodeResult): Promise<boolean> {
    const entry = await RECORD_RESULT.run(
      this.redis,
      [this.resultsKey(result.batchId), batchCompletionsKey(this.prefix, result.batchId), this.outlinesKey(result.batchId), this.versionKey(result.batchId)],
      [result.episodeId, JSON.stringify(result), result.status, result.reward === null ? '' : String(result.reward), encodeOutline(result)],
    );
    const first = entry === null ? 0 : 1;
    if (first === 1) {
      await writeFileAtomic(this.resultFile(result.batchId, result.episodeId), `${JSON.stringify(result, null, 2)}\n`);
      // A result after the batch's summary was stored (a retried episode) refreshes the summary.
      if ((await this.redis.exists(this.summaryKey(result.batchId))) === 1) await this.storeSummary(result.batchId);
    }
    return first === 1;
  }

  /** One episode's result, if it has one. */
  async get(batchId: string, episodeId: string): Promise<EpisodeResult | undefined> {
    const raw = await this.redis.hget(this.resultsKey(batchId), episodeId);
    return raw === null ? undefined : EpisodeResult.parse(JSON.parse(raw));
  }

  /** Whether the episode has a result. */
  async has(batchId: string, episodeId: string): Promise<boolean> {
    return (await this.redis.hexists(this.resultsKey(batchId), episodeId)) === 1;
  }

  /**
   * Step 1 of a retry by kind: mark the recorded result as superseded. Alone (a crash right after), it
   * changes nothing a reader sees: the episode keeps its result and its finished job.
   */
  async markForRetry(episodeId: string): Promise<void> {
    await this.redis.set(episodeRetryKey(this.prefix, episodeId), '1', 'EX', RETRY_MARK_TTL_SEC);
  }

  /** Take a retry mark back (the job could not be requeued after all). */
  async unmarkForRetry(episodeId: string): Promise<void> {
    await this.redis.del(episodeRetryKey(this.prefix, episodeId));
  }

  /**
   * The result a picked-up job must end with, unless the episode was marked for a retry: then its result
   * is forgotten (with the mark, atomically) and undefined returned, so the job runs again. Step 3 of a
   * retry by kind calls it too; whichever comes first forgets, the other finds nothing to do.
   */
  async resultUnlessRetried(batchId: string, episodeId: string): Promise<EpisodeResult | undefined> {
    const raw = await RESULT_UNLESS_RETRIED.run(this.redis, [this.resultsKey(batchId), episodeRetryKey(this.prefix, episodeId), this.outlinesKey(batchId), this.versionKey(batchId)], [episodeId]);
    return raw === null ? undefined : EpisodeResult.parse(JSON.parse(raw));
  }

  /**
   * The batch's completions after `after` (a cursor; '0' from the start), oldest first, at most `count`.
   * With `blockMs`, waits that long for the first one when there is none yet (XREAD BLOCK).
   */
  async completions(batchId: string, after = '0', opts: { count?: number; blockMs?: number } = {}, connection: Redis = this.redis): Promise<Completion[]> {
    const key = batchCompletionsKey(this.prefix, batchId);
    const count = opts.count ?? 500;
    // A blocking read holds its connection: callers that block pass one of their own.
    const reply = opts.blockMs !== undefined
      ? await connection.xread('COUNT', count, 'BLOCK', opts.blockMs, 'STREAMS', key, after)
      : [[key, await connection.xrange(key, after === '0' ? '-' : `(${after}`, '+', 'COUNT', count)]];
    const entries = (reply?.[0]?.[1] ?? []) as [string, string[]][];
    return entries.map(([cursor, fields]) => {
      const f = Object.fromEntries(fields.reduce<[string, string][]>((acc, v, i) => (i % 2 === 0 ? [...acc, [v, fields[i + 1]!]] : acc), []));
      return { cursor, episodeId: f.episodeId!, status: f.status!, reward: f.reward === '' || f.reward === undefined ? null : Number(f.reward) };
    });
  }

  /** How many episodes of the batch have a result, without reading them. */
  async resultCount(batchId: string): Promise<number> {
    return this.redis.hlen(this.resultsKey(batchId));
  }

  /** The results recorded so far, in the manifest's order. */
  async results(batchId: string, manifest?: BatchManifest): Promise<EpisodeResult[]> {
    const all = await this.redis.hgetall(this.resultsKey(batchId));
    const order = (manifest ?? (await this.getManifest(batchId)))?.episodeIds ?? Object.keys(all).sort();
    return order.flatMap((id) => (all[id] === undefined ? [] : [EpisodeResult.parse(JSON.parse(all[id]))]));
  }

  /**
   * The results recorded so far, in the manifest's order, a page at a time (HMGET of `pageSize`
   * episodes), so a reader of 100,000 results holds a page of them, not all.
   */
  async *resultPages(batchId: string, manifest: BatchManifest, pageSize = 1_000): AsyncGenerator<EpisodeResult[]> {
    const ids = manifest.episodeIds;
    const read = (from: number) => {
      const page = this.redis.hmget(this.resultsKey(batchId), ...ids.slice(from, from + pageSize));
      page.catch(() => undefined); // awaited below, unless the reader stops first
      return page;
    };
    // The next page is on its way while this one is parsed and written.
    let next = ids.length > 0 ? read(0) : undefined;
    for (let i = 0; next !== undefined; i += pageSize) {
      const raw = await next;
      next = i + pageSize < ids.length ? read(i + pageSize) : undefined;
      yield raw.flatMap((r) => (r === null ? [] : [EpisodeResult.parse(JSON.parse(r))]));
    }
  }

  /**
   * The outlines of the results recorded so far, in the manifest's order: what the summary and the
   * batch page read. From the outlines hash when it holds one per result; otherwise (results recorded
   * before outlines were kept) from the results themselves.
   */
  async outlines(batchId: string, manifest?: BatchManifest): Promise<ResultOutline[]> {
    const m = manifest ?? (await this.getManifest(batchId));
    return m === undefined ? this.results(batchId) : (await this.readOutlines(batchId, m)).outlines;
  }

  /** The outlines, with the results version and count they are of. */
  private async readOutlines(batchId: string, m: BatchManifest): Promise<{ outlines: ResultOutline[]; version: string; count: number }> {
    // In one step, so the count and the outlines are of the same moment; HMGET in the manifest's order
    // (the ids passed as one array: a spread of 100,000 arguments can overflow the stack).
    const multi = this.redis.multi().get(this.versionKey(batchId)).hlen(this.resultsKey(batchId));
    if (m.episodeIds.length > 0) multi.call('HMGET', [this.outlinesKey(batchId), ...m.episodeIds]);
    const replies = (await multi.exec()) as [Error | null, unknown][];
    const failed = replies.find(([err]) => err !== null);
    if (failed) throw failed[0];
    const version = (replies[0]![1] as string | null) ?? '0';
    const count = replies[1]![1] as number;
    const stored = (replies[2]?.[1] ?? []) as (string | null)[];
    const ids: string[] = [];
    const texts: string[] = [];
    for (let i = 0; i < stored.length; i++) {
      if (stored[i] === null) continue;
      ids.push(m.episodeIds[i]!);
      texts.push(stored[i]!);
    }
    if (texts.length !== count) return { outlines: await this.results(batchId, m), version, count };
    // One parse of them all: 100,000 small parses took several times as long.
    const parsed = JSON.parse(`[${texts.join(',')}]`) as unknown[];
    return { outlines: parsed.map((fields, i) => decodeOutline(ids[i]!, fields)), version, count };
  }

  resultFile(batchId: string, episodeId: string): string {
    return path.join(this.dataDir, 'results', batchId, `${episodeId}.json`);
  }
}

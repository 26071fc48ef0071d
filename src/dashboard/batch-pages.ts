// The batch pages: /batches (newest first, with pass rate, mean reward, failures by kind, throughput
// and ETA), /batches/:batchId (progress, outcome, the timeline of episodes finishing, reward histogram,
// phase timings, reward and pass@k by task, and the episodes by filter (status, kind, task), a page at
// a time, each with links to its transcript and its job in Bull Board) and
// /batches/:batchId/episodes/:episodeId (result and evidence, escaped and size-capped).
import { Router } from 'express';
import type { BatchManifest, ResultsStore } from '../results/results-store.ts';
import { summarize, type BatchSummary } from '../results/batch-summary.ts';
import { batchListPage, batchPage, episodePage, notFoundPage, parseEpisodeFilter, type BatchRow, type Links } from './batch-view.ts';
import type { CompletionRates } from './completion-rates.ts';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { storeIsDataDir } from '../evidence/publish-evidence.ts';
import { readEvidence, readEvidenceFromStore } from './evidence-files.ts';

export interface BatchPagesOptions {
  results: ResultsStore;
  dataDir: string;
  /** Where evidence is read when it is not the data folder (FLEET_ARTIFACTS): every host's episodes. */
  artifacts?: ArtifactStore;
  links: Links;
  /** Batches listed on /batches. @default 100 */
  listLimit?: number;
  /** Bytes of each evidence file shown. @default 65536 */
  evidenceCapBytes?: number;
  /** Where throughput is counted (shared with the fleet page). */
  rates: CompletionRates;
}

/** The throughput of a running batch is over this last span. */
const RECENT_MS = 5 * 60_000;

/** Throughput (episodes per minute) and time left: recent while running, over the whole run once done. */
function pace(rates: CompletionRates, manifest: BatchManifest, summary: BatchSummary, lastCompletionMs: number | undefined): { perMinute: number | null; etaMs: number | null } {
  if (summary.finished) {
    const span = (lastCompletionMs ?? NaN) - Date.parse(manifest.createdAt);
    return { perMinute: Number.isFinite(span) && span > 0 ? summary.done / (span / 60_000) : null, etaMs: null };
  }
  const createdMs = Date.parse(manifest.createdAt);
  // A batch younger than the span is measured over its age.
  const spanMs = Math.max(10_000, Math.min(RECENT_MS, rates.now() - (Number.isNaN(createdMs) ? 0 : createdMs)));
  const perMinute = rates.count(spanMs, manifest.batchId) / (spanMs / 60_000);
  return { perMinute, etaMs: perMinute > 0 ? ((summary.total - summary.done) / perMinute) * 60_000 : null };
}

export function batchPages(opts: BatchPagesOptions): Router {
  const { results, links } = opts;
  const capBytes = opts.evidenceCapBytes ?? 64 * 1024;
  const { rates } = opts;
  const router = Router();
  // A batch's summary as of its result count: a finished batch is summed up once, a running one again
  // only when it has new results.
  const summaries = new Map<string, { done: number; summary: BatchSummary; lastCompletionMs: number | undefined }>();
  const summaryOf = async (manifest: BatchManifest, done: number) => {
    const cached = summaries.get(manifest.batchId);
    if (cached?.done === done) return cached;
    const stored = done >= manifest.episodeIds.length ? await results.storedSummary(manifest.batchId) : undefined;
    const summary = stored?.done === done ? stored : summarize(manifest.batchId, manifest.episodeIds.length, await results.results(manifest.batchId), manifest.passThreshold, manifest.model);
    const entry = { done, summary, lastCompletionMs: summary.finished ? await rates.lastCompletionMs(manifest.batchId) : undefined };
    summaries.delete(manifest.batchId);
    summaries.set(manifest.batchId, entry);
    if (summaries.size > 1_000) summaries.delete(summaries.keys().next().value as string);
    return entry;
  };

  router.get('/', (_req, res) => res.redirect('/batches'));

  router.get('/batches', async (_req, res) => {
    const manifests: { manifest: BatchManifest; done: number }[] = [];
    for (const batchId of await results.listBatches(opts.listLimit ?? 100)) {
      const manifest = await results.getManifest(batchId);
      if (manifest !== undefined) manifests.push({ manifest, done: await results.resultCount(batchId) });
    }
    await rates.refresh(manifests.filter((m) => m.done < m.manifest.episodeIds.length).map((m) => m.manifest.batchId));
    const rows: BatchRow[] = [];
    for (const { manifest, done } of manifests) {
      const { summary, lastCompletionMs } = await summaryOf(manifest, done);
      rows.push({
        batchId: manifest.batchId, name: manifest.name, createdAt: manifest.createdAt, done, total: manifest.episodeIds.length,
        summary, ...pace(rates, manifest, summary, lastCompletionMs),
      });
    }
    res.type('html').send(batchListPage(rows, links).value);
  });

  router.get('/batches/:batchId', async (req, res) => {
    const manifest = await results.getManifest(req.params.batchId);
    if (manifest === undefined) {
      res.status(404).type('html').send(notFoundPage(`No batch ${req.params.batchId}.`, links).value);
      return;
    }
    // The outlines (status, reward, timings, worker...) are all the page shows of each result.
    const all = await results.outlines(manifest.batchId, manifest);
    const summary = summarize(manifest.batchId, manifest.episodeIds.length, all, manifest.passThreshold, manifest.model);
    if (!summary.finished) await rates.refresh([manifest.batchId]);
    const lastCompletionMs = summary.finished ? await rates.lastCompletionMs(manifest.batchId) : undefined;
    const filter = parseEpisodeFilter(req.query as Record<string, unknown>);
    res.type('html').send(batchPage({
      manifest, summary, results: all, filter, ...pace(rates, manifest, summary, lastCompletionMs), nowMs: rates.now(),
    }, links).value);
  });

  router.get('/batches/:batchId/episodes/:episodeId', async (req, res) => {
    const { batchId, episodeId } = req.params;
    const manifest = await results.getManifest(batchId);
    // Only an episode of this batch: the id then comes from the manifest, not from the request.
    if (manifest === undefined || !manifest.episodeIds.includes(episodeId)) {
      res.status(404).type('html').send(notFoundPage(`No episode ${episodeId} in batch ${batchId}.`, links).value);
      return;
    }
    const result = await results.get(batchId, episodeId);
    const evidence = opts.artifacts !== undefined && !storeIsDataDir(opts.artifacts, opts.dataDir)
      ? await readEvidenceFromStore(opts.artifacts, episodeId, capBytes, AbortSignal.timeout(30_000))
      : await readEvidence(opts.dataDir, episodeId, capBytes);
    res.type('html').send(episodePage({ batchId, episodeId, result, evidence, capBytes }, links).value);
  });

  return router;
}

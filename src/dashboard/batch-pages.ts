// The batch pages: /batches (newest first), /batches/:batchId (progress, outcome, reward histogram,
// phase timings, every episode with a link to its job in Bull Board) and
// /batches/:batchId/episodes/:episodeId (result and evidence, escaped and size-capped).
import { Router } from 'express';
import type { ResultsStore } from '../results/results-store.ts';
import { summarize } from '../results/batch-summary.ts';
import { batchListPage, batchPage, episodePage, notFoundPage, type BatchRow, type Links } from './batch-view.ts';
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
}

export function batchPages(opts: BatchPagesOptions): Router {
  const { results, links } = opts;
  const capBytes = opts.evidenceCapBytes ?? 64 * 1024;
  const router = Router();

  router.get('/', (_req, res) => res.redirect('/batches'));

  router.get('/batches', async (_req, res) => {
    const rows: BatchRow[] = [];
    for (const batchId of await results.listBatches(opts.listLimit ?? 100)) {
      const manifest = await results.getManifest(batchId);
      if (manifest === undefined) continue;
      rows.push({ batchId, name: manifest.name, createdAt: manifest.createdAt, done: await results.resultCount(batchId), total: manifest.episodeIds.length });
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
    const summary = summarize(manifest.batchId, manifest.episodeIds.length, all);
    res.type('html').send(batchPage({ manifest, summary, results: all }, links).value);
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

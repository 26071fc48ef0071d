// /batches/:batchId/episodes/:episodeId/transcript: an episode's attempts side by side, turn by turn
// (transcript-view.ts), read from the data folder or the artifact store. The page runs no script:
// its Content-Security-Policy allows nothing but its own <style> blocks (by hash) and no base, form
// or frame, so even markup that slipped past the escaping could do nothing.
import { createHash } from 'node:crypto';
import { Router } from 'express';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { storeIsDataDir } from '../evidence/publish-evidence.ts';
import type { ResultsStore } from '../results/results-store.ts';
import { notFoundPage, type Links } from './batch-view.ts';
import { readTranscriptFiles, readTranscriptFilesFromStore } from './transcript-evidence.ts';
import { buildAttemptTranscript } from './transcript-model.ts';
import { transcriptPage } from './transcript-view.ts';

export interface TranscriptPagesOptions {
  results: ResultsStore;
  dataDir: string;
  artifacts?: ArtifactStore;
  links: Links;
}

/** The policy of a page: its <style> blocks allowed by their sha256, nothing else at all. */
export function strictPolicy(page: string): string {
  const hashes = [...page.matchAll(/<style>([\s\S]*?)<\/style>/g)]
    .map((m) => `'sha256-${createHash('sha256').update(m[1] ?? '', 'utf8').digest('base64')}'`);
  return [
    "default-src 'none'",
    `style-src ${hashes.length > 0 ? [...new Set(hashes)].join(' ') : "'none'"}`,
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join('; ');
}

export function transcriptPages(opts: TranscriptPagesOptions): Router {
  const { results, links } = opts;
  const router = Router();
  router.get('/batches/:batchId/episodes/:episodeId/transcript', async (req, res) => {
    const { batchId, episodeId } = req.params;
    const manifest = await results.getManifest(batchId);
    // Only an episode of this batch: the id then comes from the manifest, not from the request.
    if (manifest === undefined || !manifest.episodeIds.includes(episodeId)) {
      res.status(404).type('html').send(notFoundPage(`No episode ${episodeId} in batch ${batchId}.`, links).value);
      return;
    }
    const [result, files] = await Promise.all([
      results.get(batchId, episodeId),
      opts.artifacts !== undefined && !storeIsDataDir(opts.artifacts, opts.dataDir)
        ? readTranscriptFilesFromStore(opts.artifacts, episodeId, AbortSignal.timeout(30_000))
        : readTranscriptFiles(opts.dataDir, episodeId),
    ]);
    const taskId = result?.taskId ?? '';
    const attempts = files.map((f) => buildAttemptTranscript(f, { episodeId, taskId }));
    const page = transcriptPage({ batchId, episodeId, result, attempts }, links).value;
    res.set('Content-Security-Policy', strictPolicy(page)).set('Cache-Control', 'no-store').type('html').send(page);
  });
  return router;
}

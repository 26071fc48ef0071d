// Progress of a batch while `enqueue --wait` or `demo` waits: a live bar on a terminal (done/total,
// passed, failed, running, rate, ETA), plain lines at most every few seconds otherwise.
import type { Queue } from 'bullmq';
import type { BatchSummary } from '../results/batch-summary.ts';
import type { ResultsStore } from '../results/results-store.ts';

export interface ProgressView {
  update(s: BatchSummary, running: number): void;
  end(): void;
}

function eta(done: number, total: number, elapsedMs: number): { rate: number; etaSec: number | null } {
  const rate = done / Math.max(elapsedMs / 1000, 0.001);
  return { rate, etaSec: done === 0 ? null : Math.round((total - done) / rate) };
}

function line(s: BatchSummary, running: number, startedAt: number): string {
  const failed = s.done - s.byStatus.passed;
  const { rate, etaSec } = eta(s.done, s.total, Date.now() - startedAt);
  return `${s.done}/${s.total} done, ${s.byStatus.passed} passed, ${failed} not passed, ${running} running, ${rate.toFixed(2)}/s, ETA ${etaSec === null ? '?' : `${etaSec}s`}`;
}

export function progressView(out: NodeJS.WriteStream, plainEveryMs = 5_000): ProgressView {
  const startedAt = Date.now();
  if (out.isTTY) {
    return {
      update(s, running) {
        const width = 30;
        const filled = Math.round((s.done / Math.max(1, s.total)) * width);
        out.write(`\r\x1b[2K[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${line(s, running, startedAt)}`);
      },
      end() {
        out.write('\n');
      },
    };
  }
  let last = '';
  let lastAt = 0;
  return {
    update(s, running) {
      const text = line(s, running, startedAt);
      const changed = `${s.done}` !== last;
      if (s.finished || (changed && Date.now() - lastAt >= plainEveryMs)) {
        out.write(`progress ${s.batchId}: ${text}\n`);
        last = `${s.done}`;
        lastAt = Date.now();
      }
    },
    end() {},
  };
}

/**
 * Poll until every episode of the batch has a result, showing progress; returns the summary. Past
 * `timeoutMs` it returns the summary as it stands (finished: false).
 */
export async function waitForBatch(results: ResultsStore, episodes: Queue, batchId: string, view: ProgressView, timeoutMs = Infinity, pollMs = 500): Promise<BatchSummary> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const s = await results.summary(batchId);
    if (s === undefined) throw new Error(`no batch ${batchId}`);
    const active = await episodes.getJobs(['active']);
    view.update(s, active.filter((j) => j.id?.startsWith(`${batchId}.`)).length);
    if (s.finished || Date.now() > until) {
      view.end();
      return s;
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

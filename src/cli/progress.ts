// Progress of a batch while `enqueue --wait` or `demo` waits: a live bar on a terminal (done/total,
// passed, failed, running, rate, ETA), plain lines at most every few seconds otherwise. The wait
// outlives a Redis restart: a poll that cannot reach Redis is said once, then retried until the timeout.
import type { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { isConnectionError } from '../redis/outage-log.ts';
import type { BatchSummary } from '../results/batch-summary.ts';
import type { ResultsStore } from '../results/results-store.ts';

export interface ProgressView {
  update(s: BatchSummary, running: number): void;
  /** A line about the wait itself (Redis lost, Redis back), on its own line. */
  notice(text: string): void;
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
      notice(text) {
        out.write(`\r\x1b[2K${text}\n`);
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
    notice(text) {
      out.write(`${text}\n`);
    },
    end() {},
  };
}

/**
 * Episodes of the batch that run now: active jobs whose lock a live worker still renews. A killed
 * worker's jobs stay listed active until another worker's stall check moves them, but their lock
 * expires within the lock duration: counting them showed more running than there were slots.
 */
export async function runningEpisodes(episodes: Queue, redis: Redis, batchId: string): Promise<number> {
  const ids = (await episodes.getJobs(['active'])).flatMap((j) => (j.id?.startsWith(`${batchId}.`) ? [j.id] : []));
  if (ids.length === 0) return 0;
  const locked = await Promise.all(ids.map((id) => redis.exists(`${episodes.toKey(id)}:lock`)));
  return locked.filter((n) => n === 1).length;
}

/**
 * Poll until every episode of the batch has a result, showing progress; returns the summary. Past
 * `timeoutMs` it returns the summary as it stands (finished: false). Redis out of reach (restarting)
 * is waited out within the same timeout: the client reconnects on its own.
 */
export async function waitForBatch(results: ResultsStore, episodes: Queue, redis: Redis, batchId: string, view: ProgressView, timeoutMs = Infinity, pollMs = 500): Promise<BatchSummary> {
  const until = Date.now() + timeoutMs;
  let last: BatchSummary | undefined;
  let lost: { since: number; failures: number } | undefined;
  for (;;) {
    try {
      const s = await results.summary(batchId);
      if (s === undefined) throw new Error(`no batch ${batchId}`);
      last = s;
      const running = await runningEpisodes(episodes, redis, batchId);
      if (lost) {
        view.notice(`Redis connection recovered after ${Math.round((Date.now() - lost.since) / 1000)} s (${lost.failures} failed polls)`);
        lost = undefined;
      }
      view.update(s, running);
    } catch (err) {
      if (!(err instanceof Error) || !isConnectionError(err)) throw err;
      if (lost) lost.failures += 1;
      else {
        lost = { since: Date.now(), failures: 1 };
        view.notice(`Redis connection lost (${err.message}); still waiting for batch ${batchId}`);
      }
    }
    if (last?.finished || Date.now() > until) {
      view.end();
      if (last === undefined) throw new Error(`Redis did not answer within the wait for batch ${batchId}`);
      return last;
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

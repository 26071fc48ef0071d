// The batch page's float rewards: the reward histogram over [0, 1], widened (never clamped) for
// rewards outside it, a histogram per reward-file metric beside it, and the pass threshold drawn on
// the reward histogram and said in the progress line.
import { describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { metricHistograms, rewardHistogram, valueHistogram } from '../../src/dashboard/batch-stats.ts';
import { batchPage } from '../../src/dashboard/batch-view.ts';
import { histogramSvg } from '../../src/dashboard/svg-charts.ts';
import { summarize } from '../../src/results/batch-summary.ts';

const links = { bullBoardPath: '/queues', episodesQueue: 'episodes' };
const T0 = Date.parse('2026-01-01T00:00:00.000Z');

const result = (sample: number, reward: number | null, metrics?: Record<string, number>): EpisodeResult => ({
  episodeId: `b.t.${sample}`, batchId: 'b', taskId: 't', sample, status: reward === null ? 'error' : reward >= 0.5 ? 'passed' : 'failed', reward,
  ...(reward === null && { error: { kind: 'verifier' as const, code: 'reward_file_missing', message: 'x' } }),
  ...(metrics && { metrics }),
  attempts: 1, workerId: 'w', timings: { totalMs: 10 }, provenance: { taskDigest: 'x', image: 'i', agent: { kind: 'oracle' } },
  startedAt: new Date(T0).toISOString(), endedAt: new Date(T0 + 1000).toISOString(),
});
const counts = (bins: { count: number }[]) => bins.map((b) => b.count);

describe('reward histograms', () => {
  it('bins floats over [0, 1] by their value (0.3 in the 0.3 bin, 1 in the last)', () => {
    const bins = valueHistogram([0, 0.25, 0.3, 0.75, 0.999, 1]);
    expect(bins[0]!.label).toBe('0.0-0.1');
    expect(counts(bins)).toEqual([1, 0, 1, 1, 0, 0, 0, 1, 0, 2]);
  });

  it('widens the range to rewards outside [0, 1] instead of clamping them', () => {
    const bins = valueHistogram([-1, 0, 1, 3]);
    expect(bins[0]!.from).toBe(-1);
    expect(bins.at(-1)!.to).toBe(3);
    expect(bins.map((b) => b.label)).toEqual(['-1.0--0.6', '-0.6--0.2', '-0.2-0.2', '0.2-0.6', '0.6-1.0', '1.0-1.4', '1.4-1.8', '1.8-2.2', '2.2-2.6', '2.6-3.0']);
    expect(counts(bins)).toEqual([1, 0, 1, 0, 0, 1, 0, 0, 0, 1]);
    expect(valueHistogram([0, 20]).map((b) => b.label).slice(0, 2)).toEqual(['0-2', '2-4']);
    const { ungraded } = rewardHistogram([result(0, 2), result(1, null)]);
    expect(ungraded).toBe(1);
  });

  it('makes one histogram per metric, by name, over the episodes that reported it', () => {
    const hs = metricHistograms([result(0, 0.5, { style: 0, correctness: 1 }), result(1, 0.25, { correctness: 0.5 }), result(2, 1)]);
    expect(hs.map((h) => [h.metric, h.n])).toEqual([['correctness', 2], ['style', 1]]);
    expect(counts(hs[0]!.bins)).toEqual([0, 0, 0, 0, 0, 1, 0, 0, 0, 1]);
    expect(metricHistograms([result(0, 1, Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`m${String(i).padStart(2, '0')}`, 1])))]).map((h) => h.metric)).toHaveLength(12);
  });

  it('draws the threshold where it lies on the axis, and nothing for one outside the range', () => {
    const bins = valueHistogram([0, 1]);
    const at = (svg: string) => Number(/<g class="marker" data-at="[^"]+"><line x1="(\d+)"/.exec(svg)?.[1]);
    const half = histogramSvg(bins, 'r', { marker: { at: 0.5, label: 'pass >= 0.5' } }).value;
    const quarter = histogramSvg(bins, 'r', { marker: { at: 0.25, label: 'pass >= 0.25' } }).value;
    const full = histogramSvg(bins, 'r', { marker: { at: 1, label: 'pass >= 1' } }).value;
    // Plot from x = 32 to 32 + 10 bins of 48 px.
    expect([at(quarter), at(half), at(full)]).toEqual([152, 272, 512]);
    expect(half).toContain('pass &gt;= 0.5');
    // The label stays inside the chart: left of a line in the right half (1 is at the plot's edge).
    expect(full).toMatch(/<text x="509" y="\d+" text-anchor="end"[^>]*>pass &gt;= 1<\/text>/);
    expect(quarter).toMatch(/<text x="155" y="\d+" text-anchor="start"/);
    expect(histogramSvg(bins, 'r', { marker: { at: 2, label: 'x' } }).value).not.toContain('class="marker"');
  });

  it('the batch page shows the reward histogram with its threshold, a histogram per metric, and the rule', () => {
    const results = [result(0, 0.25, { correctness: 0.5, style: 0 }), result(1, 0.75, { correctness: 1, style: 0.5 }), result(2, null)];
    const manifest = { batchId: 'b', name: 'n', createdAt: new Date(T0).toISOString(), episodeIds: results.map((r) => r.episodeId), passThreshold: 0.5 };
    const page = batchPage({ manifest, summary: summarize('b', 3, results, 0.5), results, nowMs: T0 + 60_000 }, links).value;
    expect(page).toContain('passed means reward &gt;= <b class="pass-threshold">0.5</b>');
    expect(page).toContain('<g class="marker" data-at="0.5">');
    expect([...page.matchAll(/<section class="metric-histogram" data-metric="([^"]+)">/g)].map((m) => m[1])).toEqual(['correctness', 'style']);
    expect(page).toContain('aria-label="correctness histogram"');
    // The reward histogram's bars: 0.25 and 0.75, the error not graded.
    const reward = page.slice(page.indexOf('aria-label="reward histogram"'), page.indexOf('</svg>', page.indexOf('aria-label="reward histogram"')));
    expect([...reward.matchAll(/data-count="(\d+)"/g)].map((m) => Number(m[1]))).toEqual([0, 0, 1, 0, 0, 0, 0, 1, 0, 0]);
    // Exit-code grading (no metrics): no metric histogram, threshold 1 at the axis' end.
    const plain = [result(0, 1), result(1, 0)];
    const plainPage = batchPage({ manifest: { ...manifest, passThreshold: undefined }, summary: summarize('b', 2, plain), results: plain, nowMs: T0 }, links).value;
    expect(plainPage).not.toContain('metric-histogram');
    expect(plainPage).toContain('<b class="pass-threshold">1</b>');
  });
});

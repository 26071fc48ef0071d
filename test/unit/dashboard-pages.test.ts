// The batch and fleet pages' pure parts: reward and pass@k by task, the timeline's bins, the episode
// filter (parsed from a query, applied, paged), and the fleet page's markup, escaped.
import { describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import { summarize } from '../../src/results/batch-summary.ts';
import { taskStats, timelineBins } from '../../src/dashboard/batch-stats.ts';
import { batchPage, filterHref, parseEpisodeFilter } from '../../src/dashboard/batch-view.ts';
import { fleetPageHtml, type FleetView } from '../../src/dashboard/fleet-page.ts';

const links = { bullBoardPath: '/queues', episodesQueue: 'episodes' };
const T0 = Date.parse('2026-01-01T00:00:00.000Z');

const result = (taskId: string, sample: number, status: EpisodeResult['status'], endedSec = 10): EpisodeResult => ({
  episodeId: `b.${taskId}.${sample}`, batchId: 'b', taskId, sample, status,
  reward: status === 'passed' ? 1 : status === 'failed' ? 0 : null,
  ...(status === 'error' && { error: { kind: 'infra' as const, code: 'engine_down', message: 'x' } }),
  attempts: 1, workerId: 'w', timings: { totalMs: 10 }, provenance: { taskDigest: 'x', image: 'i', agent: { kind: 'oracle' } },
  startedAt: new Date(T0).toISOString(), endedAt: new Date(T0 + endedSec * 1000).toISOString(),
});

describe('taskStats', () => {
  it('counts per task, hardest first, with pass@k over graded samples', () => {
    const stats = taskStats([
      result('easy', 0, 'passed'), result('easy', 1, 'passed'),
      result('half', 0, 'passed'), result('half', 1, 'failed'),
      result('broken', 0, 'error'), result('broken', 1, 'error'),
    ], [1, 2]);
    expect(stats.map((s) => s.taskId)).toEqual(['half', 'easy', 'broken']);
    expect(stats[0]).toEqual({ taskId: 'half', done: 2, graded: 2, passed: 1, errors: 0, meanReward: 0.5, passAt: { 1: 0.5, 2: 1 }, metrics: {} });
    expect(stats[2]).toMatchObject({ errors: 2, graded: 0, meanReward: null, passAt: {} });
  });
});

describe('timelineBins', () => {
  it('bins episodes by when they ended, by status, the last one in the last bin', () => {
    const bins = timelineBins([result('a', 0, 'passed', 1), result('a', 1, 'failed', 5), result('a', 2, 'error', 10)], T0, T0 + 10_000, 2);
    expect(bins.map((b) => b.counts)).toEqual([
      { passed: 1, failed: 0, timeout: 0, cancelled: 0, error: 0 },
      { passed: 0, failed: 1, timeout: 0, cancelled: 0, error: 1 },
    ]);
  });
});

describe('episode filter', () => {
  it('keeps known values only, and a positive page', () => {
    expect(parseEpisodeFilter({ status: 'failed', kind: 'infra', task: 'a', page: '3' })).toEqual({ status: 'failed', kind: 'infra', task: 'a', page: 3 });
    expect(parseEpisodeFilter({ status: '<script>', kind: 'nope', task: '', page: '-1' })).toEqual({ page: 1 });
    expect(parseEpisodeFilter({ status: ['pending', 'failed'], page: '1.5' })).toEqual({ status: 'pending', page: 1 });
    expect(filterHref('b', { status: 'failed', task: 'a b&c', page: 2 })).toBe('/batches/b?status=failed&task=a+b%26c&page=2');
    expect(filterHref('b', { page: 1 })).toBe('/batches/b');
  });

  it('lists only what it selects, a page at a time, and escapes task ids', () => {
    const results = [result('a', 0, 'failed'), result('a', 1, 'passed'), result('<b>x</b>', 0, 'failed'), result('a', 2, 'error')];
    const manifest = { batchId: 'b', name: 'n', createdAt: new Date(T0).toISOString(), episodeIds: [...results.map((r) => r.episodeId), 'b.a.3'] };
    const summary = summarize('b', manifest.episodeIds.length, results);
    const page = (query: Record<string, string>, pageSize = 200) => batchPage({ manifest, summary, results, filter: parseEpisodeFilter(query), pageSize, nowMs: T0 + 60_000 }, links).value;
    const rows = (markup: string) => [...markup.matchAll(/<tr data-episode="([^"]+)"/g)].map((m) => m[1]);

    expect(rows(page({}))).toEqual(manifest.episodeIds.map((id) => id.replace(/</g, '&lt;').replace(/>/g, '&gt;')));
    expect(rows(page({ status: 'failed' }))).toEqual(['b.a.0', 'b.&lt;b&gt;x&lt;/b&gt;.0']);
    expect(rows(page({ status: 'pending' }))).toEqual(['b.a.3']);
    expect(rows(page({ kind: 'infra' }))).toEqual(['b.a.2']);
    expect(rows(page({ task: 'a', status: 'failed' }))).toEqual(['b.a.0']);
    expect(page({})).not.toContain('<b>x</b>');
    // Transcript links for episodes with a result; none for the pending one.
    expect(page({ status: 'failed' })).toContain('<a class="transcript" href="/batches/b/episodes/b.a.0/transcript">');
    expect(page({ status: 'pending' })).not.toContain('class="transcript"');

    const second = page({ page: '2' }, 2);
    expect(rows(second)).toEqual(['b.&lt;b&gt;x&lt;/b&gt;.0', 'b.a.2']);
    expect(second).toContain('<a rel="prev" href="/batches/b#episodes">');
    expect(second).toContain('<a rel="next" href="/batches/b?page=3#episodes">');
    // A page past the end shows the last one.
    expect(rows(page({ page: '99' }, 2))).toEqual(['b.a.3']);
  });
});

describe('fleet page', () => {
  it('renders the view escaped, links only as given, and loads its script from this origin', () => {
    const view: FleetView = {
      at: '2026-01-01T00:00:00.000Z',
      fields: { workers: '1 worker on 1 host', slots: '1 of 2 episode slots in use', pooled: '0 warm sandboxes ready', lastMinute: '3', lastTen: '3 (0.3/min)', reapedTotal: '0', at: 'now' },
      tables: {
        workers: [{ key: 'w"1', cells: ['<host>', { text: '', meter: { value: 1, max: 2 } }] }],
        running: [{ key: 'b.t.0', cells: [{ text: '<e>', href: '/batches/b/episodes/b.t.0' }, { text: 'agent', cls: 'phase agent' }] }],
        queues: [],
      },
    };
    const markup = fleetPageHtml(view, links).value;
    expect(markup).toContain('<td>&lt;host&gt;</td>');
    expect(markup).toContain('<tr data-key="w&quot;1">');
    expect(markup).toContain('<meter min="0" max="2" value="1"></meter>');
    expect(markup).toContain('<a href="/batches/b/episodes/b.t.0">&lt;e&gt;</a>');
    expect(markup).toContain('<td class="phase agent">agent</td>');
    expect(markup).toContain('<table id="t-queues" data-table="queues"><thead><tr><th>queue</th>');
    expect(markup).toMatch(/<tr class="empty"><td class="muted" colspan="\d+">none<\/td><\/tr>/);
    expect(markup).toContain('<span data-field="lastMinute">3</span>');
    expect([...markup.matchAll(/<script[^>]*>/g)].map((m) => m[0])).toEqual(['<script src="/fleet.js" defer>']);
  });
});

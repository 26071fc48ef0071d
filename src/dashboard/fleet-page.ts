// /fleet: the fleet now, live. Workers by host (lease, slots in use, warm sandboxes, runtime
// generation, free disk), the episodes running with their phase and age, queue depths, episodes
// finished per minute over the last 10 minutes, runtime generations, and the reaper's last run on each
// engine (what it found: warm pooled sandboxes, orphans awaiting confirmation; what it removed).
// Everything is read from Redis: the workers' facts (host-facts.ts, refreshed within a moment of an
// episode changing phase), leases, the queues, the completion streams (completion-rates.ts), the
// runtime generations' last use and the reaper's records (reaper-runs.ts).
//
// The page is server-rendered from a view (fields and table rows); /fleet.json serves the same view,
// and /fleet.js, a small same-origin script, fetches it every 2 s and rebuilds the tables with
// createElement and textContent only: no markup from data, no reload. Its CSP allows that script
// and fetches to this origin, nothing else.
import { Router } from 'express';
import type { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { readReaperRuns } from '../cleanup/reaper-runs.ts';
import { leaseKey, reapedCountKey, runtimeLastUsedKey } from '../redis/redis-keys.ts';
import type { ResultsStore } from '../results/results-store.ts';
import { readHostFacts } from '../worker/host-facts.ts';
import { batchHref, episodeHref, layout, type Links } from './batch-view.ts';
import type { CompletionRates } from './completion-rates.ts';
import { QUEUE_STATES } from './fleet-metrics.ts';
import { SafeHtml, html } from './html.ts';
import { formatDuration } from './svg-charts.ts';

export const FLEET_POLL_MS = 2_000;

/** A table cell: text, or text with a link (a path of this dashboard), a class, or a meter. */
export type Cell = string | { text: string; href?: string; cls?: string; meter?: { value: number; max: number } };
export interface Row {
  /** data-key of the row (an episode, worker, queue...): what tests and people can find it by. */
  key: string;
  cells: Cell[];
}
export interface FleetView {
  /** Redis time of the snapshot. */
  at: string;
  fields: Record<string, string>;
  tables: Record<string, Row[]>;
}

const TABLES = {
  workers: { title: 'Workers by host', head: ['host', 'engine', 'worker', 'pid', 'lease', 'slots in use', '', 'warm sandboxes', 'runtime generation', 'free disk', 'reported'] },
  running: { title: 'Episodes running', head: ['episode', 'batch', 'task', 'phase', 'in phase', 'age', 'worker', 'host'] },
  queues: { title: 'Queues', head: ['queue', ...QUEUE_STATES] },
  throughput: { title: 'Episodes finished per minute', head: ['minute (UTC)', 'finished', ''] },
  generations: { title: 'Runtime generations', head: ['generation', 'last prepared', 'workers on it'] },
  reaper: { title: 'Reaper: last run per engine', head: ['engine', 'host', 'ran', 'took', 'sandboxes', 'warm (pooled)', 'orphans awaiting confirmation', 'removed', 'salvaged', 'old generations removed', 'error'] },
} as const satisfies Record<string, { title: string; head: readonly string[] }>;
type TableId = keyof typeof TABLES;

const FIELDS = ['workers', 'slots', 'pooled', 'lastMinute', 'lastTen', 'reapedTotal', 'at'] as const;

export interface FleetDeps {
  redis: Redis;
  prefix: string;
  queues: readonly Queue[];
  results: ResultsStore;
  rates: CompletionRates;
}

const ago = (nowMs: number, thenMs: number) => (Number.isNaN(thenMs) ? '-' : `${formatDuration(nowMs - thenMs)} ago`);
const short = (id: string | undefined, n = 12) => (id === undefined ? '-' : id.slice(0, n));
const gib = (bytes: number) => (bytes < 0 ? 'unknown' : `${(bytes / 2 ** 30).toFixed(1)} GiB`);

/** One snapshot of the fleet, as the page and /fleet.json show it. */
export async function readFleet(deps: FleetDeps): Promise<FleetView> {
  const { redis, prefix, rates } = deps;
  // The throughput of the newest batches (those finishing now are among them).
  await rates.refresh(await deps.results.listBatches(50));
  const now = rates.now();
  const [facts, queueCounts, lastUsed, reaperRuns, reapedTotal] = await Promise.all([
    readHostFacts(redis, prefix),
    Promise.all(deps.queues.map(async (q) => ({ name: q.name, counts: await q.getJobCounts(...QUEUE_STATES) }))),
    redis.hgetall(runtimeLastUsedKey(prefix)),
    readReaperRuns(redis, prefix),
    redis.get(reapedCountKey(prefix)),
  ]);
  const leasePipeline = redis.pipeline();
  for (const f of facts) leasePipeline.pttl(leaseKey(prefix, f.workerId));
  const leaseTtls = ((await leasePipeline.exec()) ?? []).map(([err, ttl]) => (err ? -2 : Number(ttl)));

  const workers = facts
    .map((f, i) => ({ f, leaseMs: leaseTtls[i] ?? -2 }))
    .sort((a, b) => a.f.host.localeCompare(b.f.host) || a.f.workerId.localeCompare(b.f.workerId));
  const running = workers.flatMap(({ f }) => (f.running ?? []).map((e) => ({ ...e, workerId: f.workerId, host: f.host })))
    .sort((a, b) => a.startedAt.localeCompare(b.startedAt));
  const slots = workers.reduce((n, { f }) => n + f.concurrency, 0);
  const pooled = workers.reduce((n, { f }) => n + (f.poolReady ?? 0), 0);
  const hosts = new Set(workers.map(({ f }) => f.host));
  const perMinute = rates.series(10 * 60_000, 60_000);
  const maxPerMinute = Math.max(1, ...perMinute.map((m) => m.count));
  const lastTen = perMinute.reduce((n, m) => n + m.count, 0);

  const tables: Record<TableId, Row[]> = {
    workers: workers.map(({ f, leaseMs }) => {
      const inUse = f.running?.length;
      return {
        key: f.workerId,
        cells: [
          f.host, short(f.engineId), f.workerId, String(f.pid),
          leaseMs >= 0 ? { text: `${(leaseMs / 1000).toFixed(1)} s left`, cls: 'lease' } : { text: 'missing', cls: 'error' },
          // Self-tuning: in use / allowed now, then the configured most.
          inUse === undefined ? '?' : f.admission?.autotune ? `${inUse}/${f.admission.allowance} (of ${f.concurrency})` : `${inUse}/${f.concurrency}`,
          inUse === undefined ? '' : { text: '', meter: { value: inUse, max: Math.max(1, f.concurrency) } },
          f.poolReady === undefined ? '-' : String(f.poolReady),
          short(f.runtimeGeneration) === '-' ? 'not yet' : short(f.runtimeGeneration),
          gib(f.freeDiskBytes),
          ago(now, Date.parse(f.reportedAt)),
        ],
      };
    }),
    running: running.map((e) => ({
      key: e.episodeId,
      cells: [
        { text: e.episodeId, href: episodeHref(e.batchId, e.episodeId) },
        e.batchId === '' ? '-' : { text: e.batchId, href: batchHref(e.batchId) },
        e.taskId,
        { text: e.phase, cls: `phase ${e.phase}` },
        formatDuration(now - Date.parse(e.phaseStartedAt)),
        formatDuration(now - Date.parse(e.startedAt)),
        e.workerId,
        e.host,
      ],
    })),
    queues: queueCounts.map(({ name, counts }) => ({ key: name, cells: [name, ...QUEUE_STATES.map((s) => ({ text: String(counts[s] ?? 0), cls: `num state-${s}` }))] })),
    throughput: perMinute.map((m, i) => ({
      key: String(m.startMs),
      cells: [
        `${new Date(m.startMs).toISOString().slice(11, 16)}${i === perMinute.length - 1 ? ' (this minute)' : ''}`,
        { text: String(m.count), cls: 'num' },
        { text: '', meter: { value: m.count, max: maxPerMinute } },
      ],
    })),
    generations: Object.entries(lastUsed)
      .map(([id, at]) => ({ id, at: Number(at) }))
      .sort((a, b) => b.at - a.at)
      .slice(0, 10)
      .map(({ id, at }) => ({
        key: id,
        cells: [short(id), ago(now, at), String(workers.filter(({ f }) => f.runtimeGeneration === id).length)],
      })),
    reaper: reaperRuns.slice(0, 20).map((r) => ({
      key: r.engineId,
      cells: [
        short(r.engineId), r.host, ago(now, Date.parse(r.at)), `${r.durationMs} ms`, String(r.inspected), String(r.pooled),
        String(r.awaitingConfirmation), String(r.removed), String(r.salvaged), String(r.staleGenerationsRemoved),
        r.error === undefined ? '' : { text: r.error, cls: 'error' },
      ],
    })),
  };
  const fields: Record<(typeof FIELDS)[number], string> = {
    workers: `${workers.length} worker${workers.length === 1 ? '' : 's'} on ${hosts.size} host${hosts.size === 1 ? '' : 's'}`,
    slots: `${running.length} of ${slots} episode slots in use`,
    pooled: `${pooled} warm sandbox${pooled === 1 ? '' : 'es'} ready`,
    lastMinute: String(rates.count(60_000)),
    lastTen: `${lastTen} (${(lastTen / 10).toFixed(1)}/min)`,
    reapedTotal: String(Number(reapedTotal ?? 0)),
    at: new Date(now).toISOString(),
  };
  return { at: fields.at, fields, tables };
}

function cellHtml(cell: Cell): SafeHtml {
  if (typeof cell === 'string') return html`<td>${cell}</td>`;
  const inner = cell.meter
    ? html`<meter min="0" max="${cell.meter.max}" value="${cell.meter.value}"></meter>`
    : cell.href
      ? html`<a href="${cell.href}">${cell.text}</a>`
      : html`${cell.text}`;
  return html`<td${cell.cls ? html` class="${cell.cls}"` : ''}>${inner}</td>`;
}

function tableHtml(id: TableId, rows: readonly Row[]): SafeHtml {
  const { title, head } = TABLES[id];
  return html`<section class="fleet-table"><h2>${title}</h2>
<table id="t-${id}" data-table="${id}"><thead><tr>${head.map((h) => html`<th>${h}</th>`)}</tr></thead><tbody>
${rows.length === 0
    ? html`<tr class="empty"><td class="muted" colspan="${head.length}">none</td></tr>`
    : rows.map((r) => html`<tr data-key="${r.key}">${r.cells.map(cellHtml)}</tr>`)}
</tbody></table></section>`;
}

const field = (view: FleetView, name: (typeof FIELDS)[number]) => html`<span data-field="${name}">${view.fields[name]}</span>`;

export function fleetPageHtml(view: FleetView, links: Links): SafeHtml {
  const body = html`<p class="summary">${field(view, 'workers')}; ${field(view, 'slots')}; ${field(view, 'pooled')}.</p>
<p class="summary">Episodes finished: <b>${field(view, 'lastMinute')}</b> in the last minute, ${field(view, 'lastTen')} in the last 10 minutes. Sandboxes removed by the reaper, ever: ${field(view, 'reapedTotal')}.</p>
<p class="muted">As of ${field(view, 'at')} (Redis time); <span id="live">updates every ${FLEET_POLL_MS / 1000} s</span>.</p>
${tableHtml('workers', view.tables.workers ?? [])}
${tableHtml('running', view.tables.running ?? [])}
<div class="charts">
${tableHtml('queues', view.tables.queues ?? [])}
${tableHtml('throughput', view.tables.throughput ?? [])}
</div>
<div class="charts">
${tableHtml('generations', view.tables.generations ?? [])}
${tableHtml('reaper', view.tables.reaper ?? [])}
</div>
<script src="/fleet.js" defer></script>`;
  return layout('Fleet', links, body);
}

/**
 * The page's script: fetch /fleet.json every FLEET_POLL_MS, set each [data-field] and rebuild each
 * table's body. Text goes in with textContent only; a link is kept only when it is a path of this
 * origin (never javascript: or another site).
 */
export const FLEET_SCRIPT = `'use strict';
(function () {
  var live = document.getElementById('live');
  function isPath(href) { return typeof href === 'string' && href.charAt(0) === '/' && href.charAt(1) !== '/' && href.charAt(1) !== '\\\\'; }
  function cell(c) {
    var td = document.createElement('td');
    if (typeof c === 'string') { td.textContent = c; return td; }
    if (c.cls) td.className = String(c.cls);
    if (c.meter) {
      var m = document.createElement('meter');
      m.min = 0; m.max = Number(c.meter.max) || 1; m.value = Number(c.meter.value) || 0;
      td.appendChild(m);
    } else if (isPath(c.href)) {
      var a = document.createElement('a');
      a.href = c.href; a.textContent = String(c.text);
      td.appendChild(a);
    } else {
      td.textContent = String(c.text);
    }
    return td;
  }
  function apply(view) {
    var fields = document.querySelectorAll('[data-field]');
    for (var i = 0; i < fields.length; i++) {
      var v = view.fields[fields[i].getAttribute('data-field')];
      if (typeof v === 'string' && fields[i].textContent !== v) fields[i].textContent = v;
    }
    var tables = document.querySelectorAll('table[data-table]');
    for (var t = 0; t < tables.length; t++) {
      var rows = view.tables[tables[t].getAttribute('data-table')];
      if (!Array.isArray(rows)) continue;
      var body = document.createElement('tbody');
      var columns = tables[t].querySelectorAll('thead th').length;
      if (rows.length === 0) {
        var tr0 = document.createElement('tr');
        tr0.className = 'empty';
        var td0 = document.createElement('td');
        td0.className = 'muted'; td0.colSpan = columns; td0.textContent = 'none';
        tr0.appendChild(td0); body.appendChild(tr0);
      }
      for (var r = 0; r < rows.length; r++) {
        var tr = document.createElement('tr');
        tr.setAttribute('data-key', String(rows[r].key));
        for (var k = 0; k < rows[r].cells.length; k++) tr.appendChild(cell(rows[r].cells[k]));
        body.appendChild(tr);
      }
      tables[t].replaceChild(body, tables[t].tBodies[0]);
    }
  }
  function tick() {
    fetch('/fleet.json', { cache: 'no-store', credentials: 'same-origin', headers: { accept: 'application/json' } })
      .then(function (res) { if (!res.ok) throw new Error('HTTP ' + res.status); return res.json(); })
      .then(function (view) { apply(view); live.textContent = 'live, every ${FLEET_POLL_MS / 1000} s'; live.className = ''; })
      .catch(function (err) { live.textContent = 'not updated: ' + err.message; live.className = 'error'; })
      .then(function () { setTimeout(tick, ${FLEET_POLL_MS}); });
  }
  setTimeout(tick, ${FLEET_POLL_MS});
})();
`;

/** Scripts from this origin, fetches to it; nothing inline, nothing from elsewhere. */
export const FLEET_CSP = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self'; base-uri 'none'; form-action 'self'";

export function fleetPage(opts: FleetDeps & { links: Links }): Router {
  const router = Router();
  router.get('/fleet.json', async (_req, res) => {
    res.set('Cache-Control', 'no-store').json(await readFleet(opts));
  });
  router.get('/fleet.js', (_req, res) => {
    res.type('application/javascript').set('Cache-Control', 'no-cache').send(FLEET_SCRIPT);
  });
  router.get('/fleet', async (_req, res) => {
    const view = await readFleet(opts);
    res.set('Content-Security-Policy', FLEET_CSP).set('Cache-Control', 'no-store').type('html').send(fleetPageHtml(view, opts.links).value);
  });
  return router;
}

// The HTML of the batch pages: pure functions from data to escaped markup (see html.ts), so they can
// be tested without a server and no value from a job, a task or an evidence file becomes markup.
import { EpisodeStatus, type EpisodeResult } from '../episode/episode-job.ts';
import { FAILURE_KINDS, type FailureKind } from '../errors/failure-kind.ts';
import type { BatchManifest } from '../results/results-store.ts';
import type { BatchSummary } from '../results/batch-summary.ts';
import type { ResultOutline } from '../results/result-outline.ts';
import { metricHistograms, phaseTimings, rewardHistogram, taskStats, timelineBins } from './batch-stats.ts';
import type { EvidenceFile } from './evidence-files.ts';
import { SafeHtml, html } from './html.ts';
import { redactSecrets } from './redact.ts';
import { formatDuration, formatMs, histogramSvg, phaseTimingSvg, timelineSvg } from './svg-charts.ts';

export interface Links {
  /** Where Bull Board is mounted, e.g. /queues. */
  bullBoardPath: string;
  /** Name of the episodes queue in Bull Board. */
  episodesQueue: string;
}

export const batchHref = (batchId: string) => `/batches/${encodeURIComponent(batchId)}`;
export const episodeHref = (batchId: string, episodeId: string) => `${batchHref(batchId)}/episodes/${encodeURIComponent(episodeId)}`;
/** The episode's transcript page (its own module, src/dashboard). */
export const transcriptHref = (batchId: string, episodeId: string) => `${episodeHref(batchId, episodeId)}/transcript`;
export const jobHref = (links: Links, jobId: string) =>
  `${links.bullBoardPath}/queue/${encodeURIComponent(links.episodesQueue)}/${encodeURIComponent(jobId)}`;

const STYLE = new SafeHtml(`body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:13px}th{background:#f3f3f3}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.5em;max-height:30em;overflow:auto;white-space:pre-wrap;word-break:break-all}
nav a{margin-right:1em}.passed{color:#1a7f37}.failed{color:#b35900}.error{color:#c62828}.timeout{color:#8250df}
.charts{display:flex;flex-wrap:wrap;gap:2em}.muted{color:#777}.num{text-align:right;font-variant-numeric:tabular-nums}
.scroll{max-height:28em;overflow:auto;display:inline-block}form.filters{margin:.5em 0}form.filters label{margin-right:1em}
.pages a,.pages span{margin-right:1em}meter{width:8em}`);

export function layout(title: string, links: Links, body: SafeHtml): SafeHtml {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${title} - rollout-fleet</title><style>${STYLE}</style></head>
<body><nav><a href="/batches">Batches</a><a href="/fleet">Fleet</a><a href="/hosts">Hosts</a><a href="${links.bullBoardPath}/">Queues (Bull Board)</a><a href="/metrics">Metrics</a></nav>
<h1>${title}</h1>
${body}
</body></html>`;
}

export interface BatchRow {
  batchId: string;
  name: string;
  createdAt: string;
  done: number;
  total: number;
  summary: BatchSummary;
  /** Episodes finished per minute: over the last minutes while running, over the whole run once done. */
  perMinute: number | null;
  /** Time left at the recent rate; null when finished or when nothing finished lately. */
  etaMs: number | null;
}

const fixed = (x: number | null | undefined, digits = 3) => (x === null || x === undefined ? '-' : x.toFixed(digits));
const percent = (part: number, whole: number) => (whole === 0 ? '-' : `${((100 * part) / whole).toFixed(1)}%`);
const kindsText = (byKind: BatchSummary['byKind']) => Object.entries(byKind).map(([k, n]) => `${k} ${n}`).join(', ');

export function batchListPage(rows: readonly BatchRow[], links: Links): SafeHtml {
  const body = rows.length === 0
    ? html`<p class="muted">No batch yet. Enqueue one with <code>rollout-fleet enqueue batch.yaml</code>.</p>`
    : html`<table class="batches"><thead><tr><th>batch</th><th>name</th><th>created</th><th>progress</th><th>pass rate</th><th>mean reward</th><th>failures by kind</th><th>throughput</th><th>ETA</th></tr></thead><tbody>
${rows.map((r) => {
    const s = r.summary;
    const finished = r.done >= r.total;
    return html`<tr data-batch="${r.batchId}"><td><a href="${batchHref(r.batchId)}">${r.batchId}</a></td><td>${r.name}</td><td>${r.createdAt}</td>
<td class="progress num">${r.done}/${r.total}${finished ? '' : ' (running)'}</td><td class="pass-rate num">${percent(s.byStatus.passed, s.done)}</td>
<td class="mean-reward num">${fixed(s.meanReward)}</td><td class="kinds">${kindsText(s.byKind) || html`<span class="muted">none</span>`}${s.byStatus.timeout > 0 ? `; timeout ${s.byStatus.timeout}` : ''}</td>
<td class="throughput num">${r.perMinute === null ? '-' : `${r.perMinute.toFixed(1)}/min`}</td><td class="eta num">${finished ? 'done' : r.etaMs === null ? '-' : formatDuration(r.etaMs)}</td></tr>
`;
  })}</tbody></table>
<p class="muted">Throughput: episodes finished per minute, over the last 5 minutes while a batch runs, over its whole run once done. ETA: the episodes left at that rate.</p>`;
  return layout('Batches', links, body);
}

/** Which episodes the batch page lists: by status (or pending), failure kind, task; 1-based page. */
export interface EpisodeFilter {
  status?: EpisodeStatus | 'pending';
  kind?: FailureKind;
  task?: string;
  page: number;
}

const first = (v: unknown) => (Array.isArray(v) ? v[0] : v);

/** The filter of a request's query; unknown values are dropped, never echoed as markup. */
export function parseEpisodeFilter(query: Record<string, unknown>): EpisodeFilter {
  const status = first(query.status);
  const kind = first(query.kind);
  const task = first(query.task);
  const page = Number(first(query.page));
  return {
    ...(typeof status === 'string' && (status === 'pending' || EpisodeStatus.safeParse(status).success) && { status: status as EpisodeStatus | 'pending' }),
    ...(typeof kind === 'string' && (FAILURE_KINDS as readonly string[]).includes(kind) && { kind: kind as FailureKind }),
    ...(typeof task === 'string' && task !== '' && task.length <= 200 && { task }),
    page: Number.isInteger(page) && page >= 1 ? page : 1,
  };
}

/** The batch page's own link with this filter (page 1 unless given). */
export function filterHref(batchId: string, filter: Omit<EpisodeFilter, 'page'> & { page?: number }): string {
  const q = new URLSearchParams();
  if (filter.status) q.set('status', filter.status);
  if (filter.kind) q.set('kind', filter.kind);
  if (filter.task) q.set('task', filter.task);
  if (filter.page !== undefined && filter.page > 1) q.set('page', String(filter.page));
  const query = q.toString();
  return query === '' ? batchHref(batchId) : `${batchHref(batchId)}?${query}`;
}

export interface BatchPageData {
  manifest: BatchManifest;
  summary: BatchSummary;
  results: readonly ResultOutline[];
  filter?: EpisodeFilter;
  /** Episodes finished per minute lately (see BatchRow), and the time left at that rate. */
  perMinute?: number | null;
  etaMs?: number | null;
  /** Now, for the timeline of a running batch (ms since the epoch). @default Date.now() */
  nowMs?: number;
  /** Episodes listed per page. @default 200 */
  pageSize?: number;
}

const option = (value: string, label: string, selected: boolean) => html`<option value="${value}"${selected ? new SafeHtml(' selected') : ''}>${label}</option>`;

export function batchPage(data: BatchPageData, links: Links): SafeHtml {
  const { manifest, summary, results } = data;
  const filter = data.filter ?? { page: 1 };
  const pageSize = data.pageSize ?? 200;
  const batchId = manifest.batchId;
  const byId = new Map(results.map((r) => [r.episodeId, r]));
  const histogram = rewardHistogram(results);
  const threshold = summary.passThreshold ?? 1;
  const kinds = Object.entries(summary.byKind);
  const ks = Object.keys(summary.passAt).map(Number).sort((a, b) => a - b);
  const tasks = taskStats(results, ks, summary.passThreshold);
  // A column per reward-file metric (Harbor tasks' reward.json keys), in name order.
  const metricKeys = [...new Set(tasks.flatMap((t) => Object.keys(t.metrics)))].sort();
  const createdMs = Date.parse(manifest.createdAt);
  // The last episode's end (a loop: spreading 100,000 values into Math.max overflows the stack).
  let lastEndMs = createdMs + 1;
  for (const r of results) {
    const t = r.endedAt === undefined ? Number.NaN : Date.parse(r.endedAt);
    if (t > lastEndMs) lastEndMs = t;
  }
  const endMs = summary.finished ? lastEndMs : (data.nowMs ?? Date.now());
  const timeline = timelineBins(results, createdMs, endMs);

  // The episodes the filter selects, in the manifest's order; one page of them is listed.
  const matches = manifest.episodeIds.filter((id) => {
    const r = byId.get(id);
    if (filter.status !== undefined && (r?.status ?? 'pending') !== filter.status) return false;
    if (filter.kind !== undefined && r?.error?.kind !== filter.kind) return false;
    if (filter.task !== undefined && r?.taskId !== filter.task) return false;
    return true;
  });
  const pages = Math.max(1, Math.ceil(matches.length / pageSize));
  const page = Math.min(filter.page, pages);
  const shown = matches.slice((page - 1) * pageSize, page * pageSize);
  const filtered = filter.status !== undefined || filter.kind !== undefined || filter.task !== undefined;
  const statusCount = (s: string) => (s === 'pending' ? summary.total - summary.done : summary.byStatus[s as EpisodeStatus]);
  const taskIds = tasks.map((t) => t.taskId).sort();

  const played = summary.model ?? manifest.model;
  const body = html`<p>name <b>${manifest.name}</b>, created ${manifest.createdAt}</p>
<p class="model">model endpoint <b class="model-endpoint">${played?.endpoint ?? 'default'}</b>${played?.name !== undefined ? html`, model <b class="model-name">${played.name}</b>` : ''}</p>
<p class="progress">progress: <b>${summary.done}/${summary.total}</b> done${summary.finished ? '' : ' (running)'}; pass rate <b class="pass-rate">${percent(summary.byStatus.passed, summary.done)}</b>; mean reward <b class="mean-reward">${fixed(summary.meanReward)}</b>${ks.map((k) => html`; pass@${k} <b>${fixed(summary.passAt[String(k)])}</b>`)}; passed means reward &gt;= <b class="pass-threshold">${threshold}</b></p>
<p class="rate">throughput ${data.perMinute === undefined || data.perMinute === null ? '-' : `${data.perMinute.toFixed(1)} episodes/min`}${summary.finished ? '' : `; ETA ${data.etaMs === undefined || data.etaMs === null ? '-' : formatDuration(data.etaMs)}`}</p>
<h2>Outcome</h2>
<table class="outcome"><thead><tr><th>status</th><th>episodes</th></tr></thead><tbody>
${Object.entries(summary.byStatus).map(([status, n]) => html`<tr><td class="${status}">${n > 0 ? html`<a href="${filterHref(batchId, { status: status as EpisodeStatus })}">${status}</a>` : status}</td><td class="num">${n}</td></tr>`)}
</tbody></table>
${kinds.length === 0
    ? html`<p class="muted">No failure of any kind.</p>`
    : html`<table class="kinds"><thead><tr><th>failure kind</th><th>episodes</th></tr></thead><tbody>
${kinds.map(([kind, n]) => html`<tr><td><a href="${filterHref(batchId, { kind: kind as FailureKind })}">${kind}</a></td><td class="num">${n}</td></tr>`)}</tbody></table>`}
<h2>Episodes finishing</h2>
${timelineSvg(timeline, createdMs, 'episodes finishing over time, by status')}
<div class="charts">
<section><h2>Reward</h2>${histogramSvg(histogram.bins, 'reward histogram', { marker: { at: threshold, label: `pass >= ${threshold}` } })}<p class="muted">${histogram.ungraded} not graded; the dashed line is the pass threshold</p></section>
${metricHistograms(results).map((m) => html`<section class="metric-histogram" data-metric="${m.metric}"><h2>Metric ${m.metric}</h2>${histogramSvg(m.bins, `${m.metric} histogram`, { axis: m.metric })}<p class="muted">${m.n} episodes reported it</p></section>`)}
<section><h2>Phase timings</h2>${phaseTimingSvg(phaseTimings(results), 'phase timings p50/p95')}</section>
</div>
<h2>Reward by task</h2>
<p class="muted">Hardest first (lowest mean reward); pass@k is the unbiased estimate over the task's graded samples.</p>
<div class="scroll"><table class="tasks"><thead><tr><th>task</th><th>done</th><th>passed</th><th>errors</th><th>mean reward</th><th></th>${ks.map((k) => html`<th>pass@${k}</th>`)}${metricKeys.map((m) => html`<th class="metric">${m}</th>`)}</tr></thead><tbody>
${tasks.map((t) => html`<tr data-task="${t.taskId}"><td><a href="${filterHref(batchId, { task: t.taskId })}">${t.taskId}</a></td><td class="num">${t.done}</td><td class="num">${t.passed}</td><td class="num">${t.errors}</td>
<td class="num">${fixed(t.meanReward)}</td><td>${t.meanReward === null ? '' : html`<meter min="0" max="1" value="${t.meanReward.toFixed(3)}"></meter>`}</td>${ks.map((k) => html`<td class="num">${fixed(t.passAt[k])}</td>`)}${metricKeys.map((m) => html`<td class="num metric">${fixed(t.metrics[m] ?? null)}</td>`)}</tr>
`)}</tbody></table></div>
<h2 id="episodes">Episodes</h2>
<form class="filters" method="get" action="${batchHref(batchId)}#episodes">
<label>status <select name="status">${option('', 'any', filter.status === undefined)}${[...EpisodeStatus.options, 'pending' as const].map((s) => option(s, `${s} (${statusCount(s)})`, filter.status === s))}</select></label>
<label>kind <select name="kind">${option('', 'any', filter.kind === undefined)}${FAILURE_KINDS.map((k) => option(k, `${k} (${summary.byKind[k] ?? 0})`, filter.kind === k))}</select></label>
<label>task <select name="task">${option('', 'any', filter.task === undefined)}${taskIds.map((t) => option(t, t, filter.task === t))}</select></label>
<button type="submit">Filter</button>${filtered ? html` <a class="clear" href="${batchHref(batchId)}#episodes">clear</a>` : ''}
</form>
<p class="matched">${filtered ? `${matches.length} of ${summary.total} episodes match` : `${summary.total} episodes`}${pages > 1 ? `; page ${page} of ${pages}` : ''}</p>
<table class="episodes"><thead><tr><th>episode</th><th>task</th><th>status</th><th>failure</th><th>reward</th><th>attempts</th><th>worker</th><th>total</th><th>transcript</th><th>job</th></tr></thead><tbody>
${shown.map((id) => {
    const r = byId.get(id);
    return html`<tr data-episode="${id}"><td><a class="episode" href="${episodeHref(batchId, id)}">${id}</a></td><td>${r?.taskId ?? ''}</td>
<td class="${r?.status ?? 'pending'}">${r?.status ?? 'pending'}</td><td>${r?.error ? `${r.error.kind}/${r.error.code}` : ''}</td>
<td>${r === undefined || r.reward === null ? '-' : r.reward}</td><td>${r?.attempts ?? ''}</td><td>${r?.workerId ?? ''}</td>
<td>${r ? formatMs(r.timings.totalMs) : ''}</td><td>${r ? html`<a class="transcript" href="${transcriptHref(batchId, id)}">transcript</a>` : ''}</td><td><a class="job" href="${jobHref(links, id)}">job</a></td></tr>
`;
  })}</tbody></table>
${pages > 1
    ? html`<p class="pages">${page > 1 ? html`<a rel="prev" href="${filterHref(batchId, { ...filter, page: page - 1 })}#episodes">previous</a>` : ''}<span>page ${page} of ${pages}</span>${page < pages ? html`<a rel="next" href="${filterHref(batchId, { ...filter, page: page + 1 })}#episodes">next</a>` : ''}</p>`
    : ''}`;
  return layout(`Batch ${batchId}`, links, body);
}

export interface EpisodePageData {
  batchId: string;
  episodeId: string;
  result: EpisodeResult | undefined;
  evidence: readonly EvidenceFile[];
  capBytes: number;
}

export function episodePage(data: EpisodePageData, links: Links): SafeHtml {
  const { result, evidence } = data;
  const body = html`<p><a href="${batchHref(data.batchId)}">batch ${data.batchId}</a> | <a class="transcript" href="${episodeHref(data.batchId, data.episodeId)}/transcript">transcript</a> | <a class="job" href="${jobHref(links, data.episodeId)}">job in Bull Board</a></p>
<h2>Result</h2>
${result === undefined ? html`<p class="muted">No result yet.</p>` : html`<pre class="result">${JSON.stringify(redactSecrets(result), null, 2)}</pre>`}
<h2>Evidence</h2>
${evidence.length === 0
    ? html`<p class="muted">No evidence files.</p>`
    : evidence.map((f) => html`<details open class="evidence"><summary>attempt-${f.attempt}/${f.name} (${f.sizeBytes} bytes${f.truncated ? `, first ${data.capBytes} shown` : ''})</summary><pre>${f.text}</pre></details>
`)}`;
  return layout(`Episode ${data.episodeId}`, links, body);
}

export function notFoundPage(what: string, links: Links): SafeHtml {
  return layout('Not found', links, html`<p>${what}</p>`);
}

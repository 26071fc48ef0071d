// The HTML of the batch pages: pure functions from data to escaped markup (see html.ts), so they can
// be tested without a server and no value from a job, a task or an evidence file becomes markup.
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { BatchManifest } from '../results/results-store.ts';
import type { BatchSummary } from '../results/batch-summary.ts';
import type { ResultOutline } from '../results/result-outline.ts';
import { phaseTimings, rewardHistogram } from './batch-stats.ts';
import type { EvidenceFile } from './evidence-files.ts';
import { SafeHtml, html } from './html.ts';
import { redactSecrets } from './redact.ts';
import { formatMs, histogramSvg, phaseTimingSvg } from './svg-charts.ts';

export interface Links {
  /** Where Bull Board is mounted, e.g. /queues. */
  bullBoardPath: string;
  /** Name of the episodes queue in Bull Board. */
  episodesQueue: string;
}

export const batchHref = (batchId: string) => `/batches/${encodeURIComponent(batchId)}`;
export const episodeHref = (batchId: string, episodeId: string) => `${batchHref(batchId)}/episodes/${encodeURIComponent(episodeId)}`;
export const jobHref = (links: Links, jobId: string) =>
  `${links.bullBoardPath}/queue/${encodeURIComponent(links.episodesQueue)}/${encodeURIComponent(jobId)}`;

const STYLE = new SafeHtml(`body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:13px}th{background:#f3f3f3}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.5em;max-height:30em;overflow:auto;white-space:pre-wrap;word-break:break-all}
nav a{margin-right:1em}.passed{color:#1a7f37}.failed{color:#b35900}.error{color:#c62828}.timeout{color:#8250df}
.charts{display:flex;flex-wrap:wrap;gap:2em}.muted{color:#777}`);

export function layout(title: string, links: Links, body: SafeHtml): SafeHtml {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${title} - rollout-fleet</title><style>${STYLE}</style></head>
<body><nav><a href="/batches">Batches</a><a href="/hosts">Hosts</a><a href="${links.bullBoardPath}/">Queues (Bull Board)</a><a href="/metrics">Metrics</a></nav>
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
}

export function batchListPage(rows: readonly BatchRow[], links: Links): SafeHtml {
  const body = rows.length === 0
    ? html`<p class="muted">No batch yet. Enqueue one with <code>rollout-fleet enqueue batch.yaml</code>.</p>`
    : html`<table><thead><tr><th>batch</th><th>name</th><th>created</th><th>progress</th></tr></thead><tbody>
${rows.map((r) => html`<tr><td><a href="${batchHref(r.batchId)}">${r.batchId}</a></td><td>${r.name}</td><td>${r.createdAt}</td><td>${r.done}/${r.total}${r.done >= r.total ? '' : ' (running)'}</td></tr>
`)}</tbody></table>`;
  return layout('Batches', links, body);
}

export interface BatchPageData {
  manifest: BatchManifest;
  summary: BatchSummary;
  results: readonly ResultOutline[];
}

export function batchPage(data: BatchPageData, links: Links): SafeHtml {
  const { manifest, summary, results } = data;
  const byId = new Map(results.map((r) => [r.episodeId, r]));
  const histogram = rewardHistogram(results);
  const kinds = Object.entries(summary.byKind);
  const body = html`<p>name <b>${manifest.name}</b>, created ${manifest.createdAt}</p>
<p class="progress">progress: <b>${summary.done}/${summary.total}</b> done${summary.finished ? '' : ' (running)'}; mean reward ${summary.meanReward === null ? '-' : summary.meanReward.toFixed(3)}</p>
<h2>Outcome</h2>
<table class="outcome"><thead><tr><th>status</th><th>episodes</th></tr></thead><tbody>
${Object.entries(summary.byStatus).map(([status, n]) => html`<tr><td class="${status}">${status}</td><td>${n}</td></tr>`)}
</tbody></table>
${kinds.length === 0
    ? html`<p class="muted">No failure of any kind.</p>`
    : html`<table class="kinds"><thead><tr><th>failure kind</th><th>episodes</th></tr></thead><tbody>
${kinds.map(([kind, n]) => html`<tr><td>${kind}</td><td>${n}</td></tr>`)}</tbody></table>`}
<div class="charts">
<section><h2>Reward</h2>${histogramSvg(histogram.bins, 'reward histogram')}<p class="muted">${histogram.ungraded} not graded</p></section>
<section><h2>Phase timings</h2>${phaseTimingSvg(phaseTimings(results), 'phase timings p50/p95')}</section>
</div>
<h2>Episodes</h2>
<table class="episodes"><thead><tr><th>episode</th><th>task</th><th>status</th><th>failure</th><th>reward</th><th>attempts</th><th>worker</th><th>total</th><th>job</th></tr></thead><tbody>
${manifest.episodeIds.map((id) => {
    const r = byId.get(id);
    return html`<tr data-episode="${id}"><td><a href="${episodeHref(manifest.batchId, id)}">${id}</a></td><td>${r?.taskId ?? ''}</td>
<td class="${r?.status ?? 'pending'}">${r?.status ?? 'pending'}</td><td>${r?.error ? `${r.error.kind}/${r.error.code}` : ''}</td>
<td>${r === undefined || r.reward === null ? '-' : r.reward}</td><td>${r?.attempts ?? ''}</td><td>${r?.workerId ?? ''}</td>
<td>${r ? formatMs(r.timings.totalMs) : ''}</td><td><a class="job" href="${jobHref(links, id)}">job</a></td></tr>
`;
  })}</tbody></table>`;
  return layout(`Batch ${manifest.batchId}`, links, body);
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
  const body = html`<p><a href="${batchHref(data.batchId)}">batch ${data.batchId}</a> | <a class="job" href="${jobHref(links, data.episodeId)}">job in Bull Board</a></p>
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

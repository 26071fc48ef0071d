// Charts of the batch page as inline SVG rendered on the server: no client script, no framework, and
// every label escaped like the rest of the page.
import type { HistogramBin, PhaseTiming } from './batch-stats.ts';
import { SafeHtml, html } from './html.ts';

const FONT = new SafeHtml('font-family="sans-serif" font-size="11"');

/** "850 ms", "3.4 s", "2.1 min". */
export function formatMs(ms: number | undefined): string {
  if (ms === undefined) return '-';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return `${(ms / 60_000).toFixed(1)} min`;
}

/** Vertical bars, one per bin, with its count above and its label below. */
export function histogramSvg(bins: readonly HistogramBin[], title: string): SafeHtml {
  const width = 520;
  const height = 220;
  const top = 24;
  const bottom = 36;
  const left = 32;
  const plotH = height - top - bottom;
  const slot = (width - left - 8) / Math.max(1, bins.length);
  const max = Math.max(1, ...bins.map((b) => b.count));
  const bars = bins.map((b, i) => {
    const h = Math.round((b.count / max) * plotH);
    const x = Math.round(left + i * slot + 3);
    const y = top + plotH - h;
    const w = Math.max(1, Math.round(slot - 6));
    return html`<g><rect class="bar" data-label="${b.label}" data-count="${b.count}" x="${x}" y="${y}" width="${w}" height="${h}" fill="#4c78a8"><title>${b.label}: ${b.count}</title></rect>
<text x="${x + w / 2}" y="${y - 4}" text-anchor="middle" ${FONT}>${b.count > 0 ? b.count : ''}</text>
<text x="${x + w / 2}" y="${height - bottom + 14}" text-anchor="middle" ${FONT}>${b.label}</text></g>`;
  });
  return html`<svg class="chart histogram" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="${title}">
<title>${title}</title>
<line x1="${left}" y1="${top + plotH}" x2="${width - 8}" y2="${top + plotH}" stroke="#888"/>
${bars}
<text x="${width / 2}" y="${height - 4}" text-anchor="middle" ${FONT}>reward</text>
</svg>`;
}

/** Horizontal bars per phase: p50 (dark) over p95 (light), on one time scale. */
export function phaseTimingSvg(timings: readonly PhaseTiming[], title: string): SafeHtml {
  const width = 520;
  const rowH = 40;
  const left = 60;
  const right = 90;
  const top = 10;
  const height = top + timings.length * rowH + 26;
  const max = Math.max(1, ...timings.map((t) => t.p95Ms ?? 0));
  const scale = (ms: number | undefined) => Math.round(((ms ?? 0) / max) * (width - left - right));
  const rows = timings.map((t, i) => {
    const y = top + i * rowH;
    return html`<g class="phase" data-phase="${t.phase}">
<text x="${left - 6}" y="${y + 18}" text-anchor="end" ${FONT}>${t.phase}</text>
<rect class="bar p95" data-ms="${t.p95Ms ?? ''}" x="${left}" y="${y + 4}" width="${scale(t.p95Ms)}" height="24" fill="#a6c8e8"><title>${t.phase} p95 ${formatMs(t.p95Ms)}</title></rect>
<rect class="bar p50" data-ms="${t.p50Ms ?? ''}" x="${left}" y="${y + 10}" width="${scale(t.p50Ms)}" height="12" fill="#2f5d8a"><title>${t.phase} p50 ${formatMs(t.p50Ms)}</title></rect>
<text x="${left + scale(t.p95Ms) + 6}" y="${y + 20}" ${FONT}>${formatMs(t.p50Ms)} / ${formatMs(t.p95Ms)}</text>
</g>`;
  });
  return html`<svg class="chart phases" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="${title}">
<title>${title}</title>
${rows}
<text x="${left}" y="${height - 6}" ${FONT}>dark: p50, light: p95 (over ${Math.max(0, ...timings.map((t) => t.count))} episodes)</text>
</svg>`;
}

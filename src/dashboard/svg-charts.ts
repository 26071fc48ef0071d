// Charts of the batch page as inline SVG rendered on the server: no client script, no framework, and
// every label escaped like the rest of the page.
import { TIMELINE_STATUSES, type HistogramBin, type PhaseTiming, type TimelineBin } from './batch-stats.ts';
import { SafeHtml, html } from './html.ts';

const FONT = new SafeHtml('font-family="sans-serif" font-size="11"');

/** "850 ms", "3.4 s", "2.1 min". */
export function formatMs(ms: number | undefined): string {
  if (ms === undefined) return '-';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return `${(ms / 60_000).toFixed(1)} min`;
}

/**
 * Vertical bars, one per bin, with its count above and its label below; `axis` names the values, and
 * `marker` draws a dashed line at a value within the bins' range (the pass threshold).
 */
export function histogramSvg(bins: readonly HistogramBin[], title: string, opts: { axis?: string; marker?: { at: number; label: string } } = {}): SafeHtml {
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
  const lo = bins[0]?.from ?? 0;
  const hi = bins.at(-1)?.to ?? 1;
  const { marker } = opts;
  const markerSvg = marker !== undefined && hi > lo && marker.at >= lo && marker.at <= hi
    ? (() => {
      const x = Math.round(left + ((marker.at - lo) / (hi - lo)) * slot * bins.length);
      // The label on the side of the line that has room: a threshold of 1 is at the plot's right edge.
      return html`<g class="marker" data-at="${marker.at}"><line x1="${x}" y1="${top - 12}" x2="${x}" y2="${top + plotH}" stroke="#c62828" stroke-dasharray="4 3"/>
<text x="${x > width / 2 ? x - 3 : x + 3}" y="${top - 14}" text-anchor="${x > width / 2 ? 'end' : 'start'}" ${FONT} fill="#c62828">${marker.label}</text></g>`;
    })()
    : '';
  return html`<svg class="chart histogram" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="${title}">
<title>${title}</title>
<line x1="${left}" y1="${top + plotH}" x2="${width - 8}" y2="${top + plotH}" stroke="#888"/>
${bars}
${markerSvg}
<text x="${width / 2}" y="${height - 4}" text-anchor="middle" ${FONT}>${opts.axis ?? 'reward'}</text>
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

export const STATUS_COLORS: Record<(typeof TIMELINE_STATUSES)[number], string> = {
  passed: '#1a7f37', failed: '#d9822b', timeout: '#8250df', cancelled: '#999999', error: '#c62828',
};

/** "42 s", "12 min", "3.5 h": a coarse duration for axes and ETAs. */
export function formatDuration(ms: number): string {
  if (ms < 60_000) return `${Math.max(0, Math.round(ms / 1000))} s`;
  if (ms < 3_600_000) return `${Math.round(ms / 60_000)} min`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

/** Episodes finishing over time: one stacked bar per bin, a segment per status, time since `originMs` below. */
export function timelineSvg(bins: readonly TimelineBin[], originMs: number, title: string): SafeHtml {
  const width = 1060;
  const height = 200;
  const top = 16;
  const bottom = 34;
  const left = 40;
  const plotH = height - top - bottom;
  const slot = (width - left - 8) / Math.max(1, bins.length);
  const total = (b: TimelineBin) => TIMELINE_STATUSES.reduce((s, k) => s + b.counts[k], 0);
  const max = Math.max(1, ...bins.map(total));
  const bars = bins.map((b, i) => {
    const x = Math.round(left + i * slot + 1);
    const w = Math.max(1, Math.round(slot - 2));
    let y = top + plotH;
    const segments = TIMELINE_STATUSES.flatMap((status) => {
      const n = b.counts[status];
      if (n === 0) return [];
      const h = Math.max(1, Math.round((n / max) * plotH));
      y -= h;
      return [html`<rect class="seg ${status}" x="${x}" y="${y}" width="${w}" height="${h}" fill="${STATUS_COLORS[status]}"/>`];
    });
    const label = `${formatDuration(b.fromMs - originMs)}-${formatDuration(b.toMs - originMs)}: ${TIMELINE_STATUSES.filter((k) => b.counts[k] > 0).map((k) => `${k} ${b.counts[k]}`).join(', ') || 'none'}`;
    return html`<g class="bin" data-count="${total(b)}"><title>${label}</title>${segments}</g>`;
  });
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => {
    const x = Math.round(left + f * (width - left - 8));
    const at = bins.length === 0 ? originMs : bins[0]!.fromMs + f * (bins.at(-1)!.toMs - bins[0]!.fromMs);
    return html`<text x="${x}" y="${height - bottom + 14}" text-anchor="${f === 0 ? 'start' : f === 1 ? 'end' : 'middle'}" ${FONT}>+${formatDuration(at - originMs)}</text>`;
  });
  const legend = TIMELINE_STATUSES.map((status, i) => html`<rect x="${left + i * 90}" y="${height - 12}" width="10" height="10" fill="${STATUS_COLORS[status]}"/><text x="${left + i * 90 + 14}" y="${height - 3}" ${FONT}>${status}</text>`);
  return html`<svg class="chart timeline" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="${title}">
<title>${title}</title>
<line x1="${left}" y1="${top + plotH}" x2="${width - 8}" y2="${top + plotH}" stroke="#888"/>
<text x="${left - 4}" y="${top + 8}" text-anchor="end" ${FONT}>${max}</text>
${bars}
${ticks}
${legend}
</svg>`;
}

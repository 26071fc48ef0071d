// The transcript page's HTML: every attempt of an episode side by side, each its conversation turn by
// turn, its checkpoints, the agent's and the verifier's output, the outcome and the workspace diff.
// Everything the agent wrote goes through `html` (escaped), with control and bidi characters made
// visible; long text is folded in <details>, and the whole page has a budget of characters so a
// megabyte-long tool output cannot make it slow. No script.
import type { EpisodeResult } from '../episode/episode-job.ts';
import { batchHref, episodeHref, jobHref, layout, type Links } from './batch-view.ts';
import { SafeHtml, html as escaped } from './html.ts';
import type { ReadFile } from './transcript-evidence.ts';
import type { AttemptTranscript, ToolCallView, TranscriptItem, TurnTiming } from './transcript-model.ts';
import { formatMs } from './svg-charts.ts';

export const transcriptHref = (batchId: string, episodeId: string) => `${episodeHref(batchId, episodeId)}/transcript`;

/** Characters of text one block shows at most, and the whole page (shared by its attempts). */
export const BLOCK_CHARS = 64_000;
export const PAGE_CHARS = 2_000_000;
/** Text longer than this (characters or lines) is folded. */
const FOLD_CHARS = 1_000;
const FOLD_LINES = 12;

const STYLE = new SafeHtml(`.summary b{font-size:1.1em}
.attempts{display:grid;grid-auto-flow:column;grid-auto-columns:minmax(32em,1fr);gap:1.2em;overflow-x:auto;align-items:start}
.attempt{min-width:0;border:1px solid #ccc;border-radius:4px;padding:0 .8em .8em}
.attempt h2{margin:.5em 0}.attempt h3{margin:1em 0 .3em;font-size:1em;border-bottom:1px solid #eee}
.meta{font-size:13px;color:#444}.note{background:#fff8e1;border:1px solid #f0d98c;padding:.3em .5em;font-size:13px}
ol.conversation{list-style:none;padding:0;margin:0}
ol.conversation>li,.inherited ol>li{margin:.4em 0;padding:.3em .5em;border-left:4px solid #ccc;background:#fcfcfc}
.role{font-weight:bold;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
.r-system{border-color:#8250df!important}.r-user{border-color:#0969da!important}.r-assistant{border-color:#1a7f37!important}.r-tool{border-color:#9a6700!important}
.timing{font-size:12px;color:#555;margin-left:.5em}
.tool-call{border:1px solid #e3e3e3;background:#fff;margin:.4em 0;padding:.3em .5em}
.tool-name{font-family:monospace;font-weight:bold}.tool-id{font-size:11px;color:#888;margin-left:.5em}
.ok{color:#1a7f37}.fail{color:#c62828}
dl.args{margin:.2em 0}dl.args dt{font-family:monospace;font-size:12px;color:#555}dl.args dd{margin:0 0 .3em 1em}
.label{font-size:12px;color:#555}
li.checkpoint{border-color:#0969da!important;background:#eef5ff!important;font-size:13px}
li.resumed{border-color:#8250df!important;background:#f5f0ff!important;font-size:13px;font-weight:bold}
.inherited>details>summary{font-size:13px;color:#555}.inherited ol{list-style:none;padding:0}
pre{margin:.2em 0;max-height:40em}details.fold>summary{cursor:pointer;font-family:monospace;font-size:12px;color:#333;overflow-wrap:anywhere}
pre.diff .dh{font-weight:bold;color:#222}pre.diff .dk{color:#8250df}pre.diff .da{color:#116329;background:#dafbe1}
pre.diff .dd{color:#82071e;background:#ffebe9}pre.diff .dm,pre.diff .dn{color:#777}
.outcome{font-size:14px}`);

/** Keeps the page's size bounded: each block takes what it shows from one budget. */
export class PageBudget {
  constructor(public remaining: number = PAGE_CHARS) {}
  take(text: string): { shown: string; cut: number } {
    const n = Math.max(0, Math.min(text.length, BLOCK_CHARS, this.remaining));
    this.remaining -= n;
    return { shown: text.slice(0, n), cut: text.length - n };
  }
}

// C0 controls but tab and newline, DEL and C1 as their visible pictures; bidi overrides and isolates
// (which would reorder what an operator reads) as their code points.
const CONTROL = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F]/g;
const BIDI = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;
export function visibleText(text: string): string {
  return text
    .replace(CONTROL, (c) => {
      const code = c.charCodeAt(0);
      return code < 0x20 ? String.fromCharCode(0x2400 + code) : code === 0x7f ? '\u2421' : `\\x${code.toString(16)}`;
    })
    .replace(BIDI, (c) => `<U+${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, '0')}>`);
}

/** `html` (escaping every value) with control and bidi characters of every string made visible too. */
function html(strings: TemplateStringsArray, ...values: unknown[]): SafeHtml {
  return escaped(strings, ...values.map((v) => (typeof v === 'string' ? visibleText(v) : v)));
}

function firstLine(text: string): string {
  const line = text.split('\n', 1)[0] ?? '';
  return line.length > 120 ? `${line.slice(0, 120)}…` : line;
}

/** Text in a <pre>: control characters visible, cut to the budget, folded when long. */
export function textBlock(text: string, budget: PageBudget, opts: { cls?: string; open?: boolean; fold?: boolean } = {}): SafeHtml {
  const { shown, cut } = budget.take(text);
  const pre = html`<pre class="${opts.cls ?? 'text'}">${shown}${cut > 0 ? html`<span class="muted">
[... ${cut} more characters not shown: see the evidence files]</span>` : ''}</pre>`;
  const lines = text.split('\n').length;
  if (opts.fold === false || (text.length <= FOLD_CHARS && lines <= FOLD_LINES)) return pre;
  return html`<details class="fold"${opts.open ? html` open` : ''}><summary>${firstLine(text)} <span class="muted">(${lines} lines, ${text.length} characters)</span></summary>${pre}</details>`;
}

/** Message content: a string, parts (text shown as text, any other part as JSON), or anything else as JSON. */
function content(value: unknown, budget: PageBudget): SafeHtml {
  if (value === undefined || value === null || value === '') return html``;
  if (typeof value === 'string') return textBlock(value, budget);
  if (Array.isArray(value)) {
    return html`${value.map((part) => {
      const p = part as { type?: unknown; text?: unknown } | null;
      return typeof p?.text === 'string'
        ? textBlock(p.text, budget)
        : html`<div class="label">${typeof p?.type === 'string' ? p.type : 'part'}</div>${textBlock(JSON.stringify(part, null, 2), budget)}`;
    })}`;
  }
  return textBlock(JSON.stringify(value, null, 2), budget);
}

const roleClass = (role: string) => (['system', 'user', 'assistant', 'tool'].includes(role) ? `r-${role}` : 'r-other');

function toolCall(call: ToolCallView, budget: PageBudget): SafeHtml {
  const ev = call.event;
  const status = ev === undefined ? '' : html`<span class="${ev.ok ? 'ok' : 'fail'}">${ev.ok ? 'ok' : 'failed'}${ev.exitCode === undefined || ev.exitCode === null ? '' : `, exit ${ev.exitCode}`}, ${formatMs(ev.durationMs)}</span>`;
  const args = call.arguments === undefined
    ? html`<div class="label">arguments (not a JSON object)</div>${textBlock(call.rawArguments, budget)}`
    : html`<dl class="args">${Object.entries(call.arguments).map(([k, v]) => html`<dt>${k}</dt><dd>${textBlock(typeof v === 'string' ? v : JSON.stringify(v, null, 2), budget)}</dd>`)}</dl>`;
  const output = call.output === undefined
    ? html`<div class="label muted">no tool output in the conversation</div>`
    : html`<div class="tool-output"><div class="label">output</div>${call.output === null || call.output === '' ? html`<p class="muted">(empty)</p>` : content(call.output, budget)}</div>`;
  return html`<div class="tool-call" data-tool="${call.name}"><div><span class="tool-name">${call.name}</span><span class="tool-id">${call.id}</span> ${status}</div>
${args}${output}</div>`;
}

function timing(t: TurnTiming): SafeHtml {
  const tokens = [
    t.promptTokens !== undefined && `${t.promptTokens} prompt`,
    t.completionTokens !== undefined && `${t.completionTokens} completion`,
  ].filter(Boolean).join(' + ');
  return html`<span class="timing" data-duration-ms="${t.durationMs}">${formatMs(t.durationMs)}${tokens ? ` · ${tokens} tokens` : ''}${t.finishReason ? ` · finish ${t.finishReason}` : ''}${t.streamed ? ' · streamed' : ''}${t.tokenIds !== undefined ? ` · ${t.tokenIds} token ids` : ''}</span>`;
}

function assistantBody(message: Record<string, unknown>, calls: readonly ToolCallView[], budget: PageBudget): SafeHtml {
  const reasoning = typeof message.reasoning_content === 'string' ? message.reasoning_content : typeof message.reasoning === 'string' ? message.reasoning : undefined;
  return html`${reasoning === undefined ? '' : html`<div class="label">reasoning</div>${textBlock(reasoning, budget)}`}${content(message.content, budget)}${calls.map((c) => toolCall(c, budget))}`;
}

function item(it: TranscriptItem, budget: PageBudget): SafeHtml {
  switch (it.kind) {
    case 'turn':
      return html`<li class="turn r-assistant" data-seq="${it.timing.seq}" data-index="${it.index}"><span class="role">assistant · turn ${it.number}</span>${timing(it.timing)}
${assistantBody(it.message, it.toolCalls, budget)}</li>
`;
    case 'message': {
      const toolId = it.role === 'tool' && typeof it.message.tool_call_id === 'string' ? ` (${it.message.tool_call_id})` : '';
      return html`<li class="msg ${roleClass(it.role)}" data-role="${it.role}" data-index="${it.index}"><span class="role">${it.role}${toolId}</span>
${it.role === 'assistant' ? assistantBody(it.message, it.toolCalls, budget) : content(it.message.content, budget)}</li>
`;
    }
    case 'checkpoint':
      return html`<li class="checkpoint" data-seq="${it.seq}">⚑ checkpoint ${it.seq} offered after turn ${it.turn}</li>
`;
    case 'resumed':
      return html`<li class="resumed" data-seq="${it.seq}">↻ resumed from checkpoint ${it.seq}: this attempt picks up here</li>
`;
    case 'inherited':
      return html`<li class="inherited"><details><summary>${it.items.length} entries from checkpoint ${it.seq} (earlier attempts)</summary><ol>${it.items.map((i) => item(i, budget))}</ol></details></li>
`;
  }
}

function outputFile(label: string, file: ReadFile | undefined, budget: PageBudget, cls: string): SafeHtml {
  if (file === undefined) return html``;
  const cut = file.truncated ? html` <span class="muted">(first ${file.text.length} of ${file.sizeBytes} bytes)</span>` : '';
  return html`<div class="label">${label}${cut}</div>${file.text === '' ? html`<p class="muted">(empty)</p>` : textBlock(file.text, budget, { cls })}`;
}

const DIFF_LINE: Array<[RegExp, string]> = [
  [/^(\+\+\+|---) /, 'dh'], [/^@@/, 'dk'], [/^\+/, 'da'], [/^-/, 'dd'], [/^(Index:|={10,}|\\ )/, 'dm'], [/^(File |Binary file )/, 'dn'],
];

/** The unified diff with its lines classed: file headers, hunks, additions, removals. */
export function diffBlock(diff: string, budget: PageBudget): SafeHtml {
  const { shown, cut } = budget.take(diff);
  const lines = shown.split('\n');
  if (lines.at(-1) === '') lines.pop();
  return html`<pre class="diff">${lines.map((line) => {
    const cls = DIFF_LINE.find(([re]) => re.test(line))?.[1];
    return cls === undefined ? html`${line}\n` : html`<span class="${cls}">${line}</span>\n`;
  })}${cut > 0 ? html`<span class="muted">[... ${cut} more characters not shown: see workspace.diff]</span>` : ''}</pre>`;
}

function outcome(r: EpisodeResult | undefined): SafeHtml {
  if (r === undefined) return html`<p class="outcome muted">No result for this attempt.</p>`;
  return html`<p class="outcome">status <b class="status ${r.status}">${r.status}</b> · reward <b class="reward">${r.reward === null ? 'not graded' : r.reward}</b>${r.verifier ? ` · verifier exit ${r.verifier.exitCode ?? '-'}${r.verifier.timedOut ? ' (timed out)' : ''} in ${formatMs(r.verifier.durationMs)}` : ''}</p>
${r.error ? html`<p class="outcome error">${r.error.kind}/${r.error.code}: ${r.error.message}</p>` : ''}`;
}

/** Which copy of the workspace the diff is of (older evidence does not say). */
function takenAtNote(takenAt: string | undefined): string {
  if (takenAt === 'agent-stopped') return ' · the workspace as the agent left it';
  if (takenAt === 'close') return ' · copied after the verifier ran (the copy at the agent\'s stop could not be taken)';
  return '';
}

function attemptSection(t: AttemptTranscript, budget: PageBudget): SafeHtml {
  const r = t.result;
  const calls = t.calls === undefined ? '' : Object.entries(t.calls).filter(([, n]) => n > 0).map(([k, n]) => `${n} ${k}`).join(', ');
  const ch = t.changes;
  return html`<section class="attempt" data-attempt="${t.attempt}">
<h2>Attempt ${t.attempt} ${r ? html`<span class="status ${r.status}">${r.status}</span>` : html`<span class="muted">(no result)</span>`}</h2>
<p class="meta">${r ? `worker ${r.workerId} · ${r.startedAt} · ${formatMs(r.timings.totalMs)} in all${r.timings.agentMs !== undefined ? `, agent ${formatMs(r.timings.agentMs)}` : ''}` : ''}${r?.resumedFrom !== undefined ? html` · <b>resumed from checkpoint ${r.resumedFrom}</b>` : ''}
${t.source ? html`<br>${t.turnCount} ${t.turnCount === 1 ? 'turn' : 'turns'} · model calls: ${calls || 'none'} · model time ${formatMs(t.totals.modelMs)} · ${t.totals.promptTokens} prompt + ${t.totals.completionTokens} completion tokens` : ''}</p>
${t.notes.map((n) => html`<p class="note">${n}</p>`)}
<h3>Conversation${t.source ? html` <span class="muted">(${t.source})</span>` : ''}</h3>
${t.source === undefined
    ? html`<p class="muted">No model calls recorded: this agent did not call the model through the proxy. Its output is below.</p>${t.items.length > 0 ? html`<ol class="conversation">${t.items.map((i) => item(i, budget))}</ol>` : ''}`
    : html`<ol class="conversation">${t.items.map((i) => item(i, budget))}</ol>`}
${t.offPath.length === 0 ? '' : html`<h3>Calls outside the final conversation</h3><p class="muted">Their prompts were not a prefix of the conversation above (the agent rewrote its history).</p>
<ol class="conversation">${t.offPath.map((turn) => html`<li class="turn r-assistant" data-seq="${turn.timing.seq}"><span class="role">assistant · call ${turn.number}</span>${timing(turn.timing)}
<details class="fold"><summary>its prompt: ${turn.prompt.length} messages</summary>${textBlock(JSON.stringify(turn.prompt, null, 2), budget, { fold: false })}</details>
${assistantBody(turn.message, turn.toolCalls, budget)}</li>`)}</ol>`}
<h3>Agent output</h3>
${t.agentStdout === undefined && t.agentStderr === undefined ? html`<p class="muted">No agent output recorded.</p>` : ''}
${t.agentStdout && t.agentStdout.hiddenEventLines > 0 ? html`<p class="muted">${t.agentStdout.hiddenEventLines} event lines of the reference agent not shown (they are the turns above).</p>` : ''}
${outputFile('stdout', t.agentStdout, budget, 'agent-stdout')}${outputFile('stderr', t.agentStderr, budget, 'agent-stderr')}
<h3>Verifier</h3>
${t.verifierStdout === undefined && t.verifierStderr === undefined ? html`<p class="muted">No verifier output (not verified).</p>` : ''}
${outputFile('stdout', t.verifierStdout, budget, 'verifier-stdout')}${outputFile('stderr', t.verifierStderr, budget, 'verifier-stderr')}
<h3>Outcome</h3>
${outcome(r)}
<h3>Workspace diff</h3>
${ch ? html`<p class="meta">${ch.added.length} added, ${ch.modified.length} modified, ${ch.removed.length} removed${takenAtNote(ch.takenAt)}</p>` : ''}
${t.diff === undefined ? html`<p class="muted">No workspace diff.</p>` : t.diff.text === '' ? html`<p class="muted">No change.</p>` : diffBlock(t.diff.text, budget)}
</section>`;
}

export interface TranscriptPageData {
  batchId: string;
  episodeId: string;
  /** The episode's final result, when it has one. */
  result: EpisodeResult | undefined;
  attempts: readonly AttemptTranscript[];
}

export function transcriptPage(data: TranscriptPageData, links: Links): SafeHtml {
  const { result, attempts } = data;
  // Each attempt its share of the page, so the first cannot leave nothing to the others.
  const budgets = attempts.map(() => new PageBudget(Math.floor(PAGE_CHARS / Math.max(1, attempts.length))));
  const body = html`<style>${STYLE}</style>
<p><a href="${batchHref(data.batchId)}">batch ${data.batchId}</a> | <a href="${episodeHref(data.batchId, data.episodeId)}">episode page (result and evidence files)</a> | <a class="job" href="${jobHref(links, data.episodeId)}">job in Bull Board</a></p>
<p class="summary">${result === undefined
    ? html`<span class="muted">No result yet.</span>`
    : html`task <b>${result.taskId}</b> · agent <b>${result.provenance.agent.kind}</b> · final status <b class="status ${result.status}">${result.status}</b> · reward <b class="final-reward">${result.reward === null ? 'not graded' : result.reward}</b> · ${result.attempts} ${result.attempts === 1 ? 'attempt' : 'attempts'}`}</p>
${attempts.length === 0 ? html`<p class="muted">No evidence of any attempt.</p>` : ''}`;
  const sections = attempts.length === 0 ? html`` : html`<div class="attempts">${attempts.map((a, i) => attemptSection(a, budgets[i]!))}</div>`;
  const cut = budgets.some((b) => b.remaining <= 0)
    ? html`<p class="note">This page shows ${PAGE_CHARS} characters of the episode's text, shared by its attempts; the rest is in the evidence files.</p>`
    : '';
  return layout(`Transcript of ${data.episodeId}`, links, html`${body}
${cut}
${sections}`);
}

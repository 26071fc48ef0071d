// The transcript page's pure parts on made-up evidence: turns, tool calls matched with their outputs
// and the reference agent's events, checkpoint marks, a resumed attempt's inherited messages, the
// diff's classes, the page budget, and hostile text that must stay text.
import { describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import { formatEvent } from '../../src/agent/reference/agent-events.ts';
import type { AttemptFiles, ReadFile } from '../../src/dashboard/transcript-evidence.ts';
import { buildAttemptTranscript } from '../../src/dashboard/transcript-model.ts';
import { strictPolicy } from '../../src/dashboard/transcript-page.ts';
import { PageBudget, diffBlock, textBlock, transcriptPage, visibleText } from '../../src/dashboard/transcript-view.ts';

const links = { bullBoardPath: '/queues', episodesQueue: 'episodes' };
const file = (text: string): ReadFile => ({ text, sizeBytes: Buffer.byteLength(text), truncated: false });
const result = (over: Partial<EpisodeResult> = {}): EpisodeResult => ({
  episodeId: 'b.t.0', batchId: 'b', taskId: 't', sample: 0, status: 'passed', reward: 1, attempts: 1, workerId: 'w',
  timings: { totalMs: 1200, agentMs: 800 }, provenance: { taskDigest: 'x', image: 'i', agent: { kind: 'llm', maxTurns: 10, contextWindowTokens: 32000, outputReserveTokens: 1024, bashTimeoutSec: 60, model: 'm' } as EpisodeResult['provenance']['agent'] },
  startedAt: '2026-01-01T00:00:00.000Z', endedAt: '2026-01-01T00:00:01.200Z', ...over,
});
const call = (id: string, name: string, args: unknown) => ({ id, type: 'function', function: { name, arguments: typeof args === 'string' ? args : JSON.stringify(args) } });
const turn = (seq: number, messageIndex: number, message: unknown, extra: Record<string, unknown> = {}) => ({
  seq, startedAt: '2026-01-01T00:00:00.000Z', durationMs: 100 + seq, streamed: false, messageIndex, message,
  finishReason: 'tool_calls', usage: { prompt_tokens: 10 * (seq + 1), completion_tokens: seq + 1, total_tokens: 11 * (seq + 1) }, ...extra,
});

const messages = [
  { role: 'system', content: 'You are an agent.' },
  { role: 'user', content: 'Fix greet.sh' },
  { role: 'assistant', content: null, tool_calls: [call('c1', 'bash', { command: 'ls -la', timeoutSec: 60 })] },
  { role: 'tool', tool_call_id: 'c1', content: 'exit code 0\ngreet.sh' },
  { role: 'assistant', content: 'Writing it.', tool_calls: [call('c2', 'write_file', { path: 'greet.sh', content: 'echo hi\n', apiKey: 'sk-secret' }), call('c3', 'finish', '{not json')] },
  { role: 'tool', tool_call_id: 'c2', content: 'wrote 8 characters' },
  { role: 'tool', tool_call_id: 'c3', content: 'finished' },
];
const trajectory = (msgs: unknown[], turns: unknown[]) => file(JSON.stringify({ version: 1, episodeId: 'b.t.0', taskId: 't', attempt: 1, messages: msgs, turns, calls: { answered: turns.length, refused: 0, upstream_failed: 1, aborted: 0 }, turnsWithTokenIds: 0 }));
const events = [
  formatEvent({ type: 'model_call', turn: 0, durationMs: 101, usage: { promptTokens: 10, completionTokens: 1, totalTokens: 11 }, finishReason: 'tool_calls' }),
  formatEvent({ type: 'tool_call', turn: 0, name: 'bash', ok: true, exitCode: 0, durationMs: 42 }),
  formatEvent({ type: 'checkpoint', seq: 1, turn: 1, messages: messages.slice(0, 4), usage: { promptTokens: 10, completionTokens: 1, totalTokens: 11 }, agentMs: 200 }),
  'plain output line\n',
  formatEvent({ type: 'model_call', turn: 1, durationMs: 102, usage: { promptTokens: 20, completionTokens: 2, totalTokens: 22 }, finishReason: 'tool_calls' }),
  formatEvent({ type: 'tool_call', turn: 1, name: 'write_file', ok: true, exitCode: null, durationMs: 3 }),
  formatEvent({ type: 'tool_call', turn: 1, name: 'finish', ok: true, exitCode: null, durationMs: 1 }),
  formatEvent({ type: 'checkpoint', seq: 2, turn: 2, messages, usage: { promptTokens: 30, completionTokens: 3, totalTokens: 33 }, agentMs: 400 }),
].join('');

const attempt1: AttemptFiles = {
  attempt: 1,
  files: {
    'result.json': file(JSON.stringify(result())),
    // The last call's answer ends the trajectory: the outputs of its tools are in the newest checkpoint only.
    'trajectory.json': trajectory(messages.slice(0, 5), [turn(0, 2, messages[2]), turn(1, 4, messages[4])]),
    'agent.stdout.txt': file(events),
    'verifier.stdout.txt': file('ok\n'),
    'workspace.diff': file('Index: greet.sh\n===================================================================\n--- a/greet.sh\n+++ b/greet.sh\n@@ -1,1 +1,1 @@\n-echo bye\n+echo hi\n'),
    'evidence.json': file(JSON.stringify({ workspace: { takenAt: 'agent-stopped', added: [], removed: [], modified: ['greet.sh'] } })),
  },
};

describe('buildAttemptTranscript', () => {
  it('gives every turn its timing and tokens, every tool call its arguments, output and event, and places the checkpoints', () => {
    const t = buildAttemptTranscript(attempt1, { episodeId: 'b.t.0', taskId: 't' });
    expect(t.source).toBe('trajectory.json');
    expect(t.turnCount).toBe(2);
    expect(t.items.map((i) => (i.kind === 'message' ? i.role : i.kind === 'checkpoint' ? `cp${i.seq}` : i.kind))).toEqual(['system', 'user', 'turn', 'cp1', 'turn', 'cp2']);
    const turns = t.items.filter((i) => i.kind === 'turn');
    expect(turns.map((i) => [i.number, i.timing.durationMs, i.timing.promptTokens, i.timing.completionTokens])).toEqual([[1, 100, 10, 1], [2, 101, 20, 2]]);
    const [bash] = turns[0]!.toolCalls;
    expect(bash).toMatchObject({ name: 'bash', arguments: { command: 'ls -la', timeoutSec: 60 }, output: 'exit code 0\ngreet.sh', event: { ok: true, exitCode: 0, durationMs: 42 } });
    const [write, finish] = turns[1]!.toolCalls;
    expect(write).toMatchObject({ name: 'write_file', arguments: { path: 'greet.sh', apiKey: '[redacted]' }, output: 'wrote 8 characters' });
    expect(finish).toMatchObject({ name: 'finish', rawArguments: '{not json', output: 'finished' });
    expect(finish!.arguments).toBeUndefined();
    expect(t.totals).toEqual({ modelMs: 201, promptTokens: 30, completionTokens: 3 });
    expect(t.agentStdout).toMatchObject({ hiddenEventLines: 7 });
    expect(t.agentStdout!.text.trim()).toBe('plain output line');
    expect(t.changes).toEqual({ added: [], removed: [], modified: ['greet.sh'], takenAt: 'agent-stopped' });
    const page = transcriptPage({ batchId: 'b', episodeId: 'b.t.0', result: undefined, attempts: [t] }, links).value;
    expect(page).toContain('0 added, 1 modified, 0 removed · the workspace as the agent left it');
  });

  it('folds what a resumed attempt got from its checkpoint and marks where it picked up', () => {
    const t = buildAttemptTranscript({
      attempt: 2,
      files: {
        'result.json': file(JSON.stringify(result({ attempts: 2, resumedFrom: 1 }))),
        'trajectory.json': trajectory(messages, [turn(0, 4, messages[4])]),
      },
    }, { episodeId: 'b.t.0', taskId: 't' });
    expect(t.items.map((i) => i.kind)).toEqual(['inherited', 'resumed', 'turn']);
    const inherited = t.items[0] as Extract<typeof t.items[number], { kind: 'inherited' }>;
    expect(inherited.seq).toBe(1);
    // The earlier assistant message keeps its tool call and output, without a timing of this attempt.
    expect(inherited.items.map((i) => i.kind === 'message' && i.role)).toEqual(['system', 'user', 'assistant']);
    expect((inherited.items[2] as { toolCalls: unknown[] }).toolCalls).toHaveLength(1);
  });

  it('rebuilds the conversation from model-calls.jsonl when the attempt did not close, and says why', () => {
    const record = { seq: 0, episodeId: 'b.t.0', taskId: 't', startedAt: 'x', durationMs: 5, method: 'POST', path: '/v1/chat/completions', status: 200, outcome: 'answered',
      request: { messages: messages.slice(0, 2) }, response: { choices: [{ index: 0, message: messages[2], finish_reason: 'tool_calls' }], usage: { prompt_tokens: 7, completion_tokens: 1 } } };
    const t = buildAttemptTranscript({ attempt: 1, files: { 'model-calls.jsonl': file(`${JSON.stringify(record)}\n{"cut`) } }, { episodeId: 'b.t.0', taskId: 't' });
    expect(t.source).toBe('model-calls.jsonl');
    expect(t.turnCount).toBe(1);
    expect(t.notes.join(' ')).toMatch(/No result\.json.*rebuilt from model-calls\.jsonl/);
  });

  it('says so when the trajectory is too large, and reads no events of an agent that is not the reference one', () => {
    const big = { ...file('{"messages":['), sizeBytes: 20 * 1024 * 1024, truncated: true };
    const command = result({ provenance: { taskDigest: 'x', image: 'i', agent: { kind: 'command', command: 'x' } as EpisodeResult['provenance']['agent'] } });
    const t = buildAttemptTranscript({ attempt: 1, files: { 'trajectory.json': big, 'result.json': file(JSON.stringify(command)), 'agent.stdout.txt': file(events) } }, { episodeId: 'b.t.0', taskId: 't' });
    expect(t.source).toBeUndefined();
    expect(t.notes.join(' ')).toContain('more than this page reads');
    expect(t.agentStdout!.hiddenEventLines).toBe(0);
    expect(t.agentStdout!.text).toBe(events);
  });
});

describe('transcript view', () => {
  it('classes the diff lines and cuts text to the page budget', () => {
    const diff = diffBlock(attempt1.files['workspace.diff']!.text, new PageBudget()).value;
    expect(diff).toContain('<span class="dh">--- a/greet.sh</span>');
    expect(diff).toContain('<span class="dk">@@ -1,1 +1,1 @@</span>');
    expect(diff).toContain('<span class="dd">-echo bye</span>');
    expect(diff).toContain('<span class="da">+echo hi</span>');
    const budget = new PageBudget(10);
    expect(textBlock('x'.repeat(25), budget, { fold: false }).value).toContain('15 more characters not shown');
    expect(textBlock('y', budget).value).toContain('1 more characters not shown');
    const long = textBlock(`first line\n${'z\n'.repeat(40)}`, new PageBudget()).value;
    expect(long).toMatch(/^<details class="fold"><summary>first line <span class="muted">\(42 lines/);
  });

  it('shares the page between the attempts: a huge first one leaves the others their part', () => {
    const huge = 'h'.repeat(50_000);
    const big = (attempt: number): AttemptFiles => ({ attempt, files: { 'trajectory.json': trajectory(Array.from({ length: 40 }, () => ({ role: 'user', content: `attempt ${attempt}\n${huge}` })), []) } });
    const page = transcriptPage({ batchId: 'b', episodeId: 'b.t.0', result: undefined, attempts: [1, 2].map((n) => buildAttemptTranscript(big(n), { episodeId: 'b.t.0', taskId: 't' })) }, links).value;
    expect(page).toContain('shared by its attempts');
    expect(page.length).toBeLessThan(2_200_000);
    const second = page.slice(page.indexOf('data-attempt="2"'));
    expect(second).toContain('attempt 2\nhhh');
  });

  it('keeps hostile text inert: only its own tags on the page, control and bidi characters visible', () => {
    const evil = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"></details></pre><a href="javascript:alert(1)">x</a>\u0000\u0007\u001b[31m\u202Eevil\u009b';
    const hostile = [
      { role: 'system', content: evil },
      { role: 'user', content: [{ type: 'text', text: evil }, { type: 'image_url', image_url: { url: 'javascript:alert(1)' } }] },
      { role: evil, content: evil },
      { role: 'assistant', content: evil, reasoning_content: evil, tool_calls: [call(evil, evil, { [evil]: evil }), call('c9', 'x', evil)] },
      { role: 'tool', tool_call_id: evil, content: evil },
    ];
    const t = buildAttemptTranscript({
      attempt: 1,
      files: {
        'result.json': file(JSON.stringify(result({ status: 'error', reward: null, error: { kind: 'agent', code: 'agent_crashed', message: evil } }))),
        'trajectory.json': trajectory(hostile, [turn(0, 3, hostile[3], { finishReason: evil })]),
        'agent.stdout.txt': file(evil), 'agent.stderr.txt': file(evil), 'verifier.stdout.txt': file(evil), 'workspace.diff': file(`+${evil}\n-${evil}\n`),
      },
    }, { episodeId: 'b.t.0', taskId: 't' });
    const page = transcriptPage({ batchId: 'b', episodeId: 'b.t.0', result: result(), attempts: [t] }, links).value;
    const tags = new Set([...page.matchAll(/<\/?([a-zA-Z][a-zA-Z0-9]*)/g)].map((m) => m[1]!.toLowerCase()));
    expect([...tags].filter((tag) => !['html', 'head', 'meta', 'title', 'style', 'body', 'nav', 'a', 'h1', 'h2', 'h3', 'p', 'b', 'br', 'span', 'div', 'section', 'ol', 'li', 'pre', 'details', 'summary', 'dl', 'dt', 'dd'].includes(tag))).toEqual([]);
    // Every tag is whole and has only its own attributes: no quote of a value was left unescaped.
    const attributes = new Set([...page.matchAll(/<[a-zA-Z][a-zA-Z0-9]*((?:\s+[a-z-]+(?:="[^"<>]*")?)*)\s*>|<[a-zA-Z][^>]*>/g)].flatMap((m) => {
      if (m[1] === undefined) return [`malformed: ${m[0]}`];
      return [...m[1].matchAll(/\s+([a-z-]+)(?:="[^"]*")?/gy)].map((a) => a[1]!.replace(/^data-.*/, 'data-*'));
    }));
    expect([...attributes].sort()).toEqual(['charset', 'class', 'data-*', 'href', 'lang']);
    expect([...page.matchAll(/href="([^"]*)"/g)].map((m) => m[1]!).filter((href) => !href.startsWith('/'))).toEqual([]);
    expect(page).not.toMatch(/[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u202E]/);
    expect(page).toContain('&lt;script&gt;window.__pwned=1&lt;/script&gt;');
    expect(page).toContain('\u2400\u2407\u241b[31m&lt;U+202E&gt;evil\\x9b');
    // The call was answered by the tool message with its (hostile) id.
    expect(t.items.filter((i) => i.kind === 'message').map((i) => i.kind === 'message' && i.role)).toEqual(['system', 'user', evil]);
    expect(visibleText('a\tb\nc\rd')).toBe('a\tb\nc\u240dd');
  });

  it('allows only its own style blocks, by hash', () => {
    const page = transcriptPage({ batchId: 'b', episodeId: 'b.t.0', result: undefined, attempts: [] }, links).value;
    const policy = strictPolicy(page);
    expect(policy).toMatch(/^default-src 'none'; style-src 'sha256-[A-Za-z0-9+/=]{44}' 'sha256-[A-Za-z0-9+/=]{44}'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'$/);
    expect(policy).not.toContain('unsafe');
  });
});

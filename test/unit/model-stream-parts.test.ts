// The pure parts of streaming and capture: the event-stream parser (any split of the bytes gives the
// same events), the reassembly of chunks, token extraction from vLLM's shapes, and the trajectory of
// an agent that rewrote its history.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { buildTrajectory } from '../../src/evidence/trajectory.ts';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { SseParser } from '../../src/model/sse.ts';
import { StreamAssembler } from '../../src/model/stream-assembly.ts';
import { extractTokens } from '../../src/model/token-capture.ts';

describe('SseParser', () => {
  it('gives the same events however the bytes are split, for \\n, \\r\\n and \\r line ends', () => {
    const datas = fc.array(fc.string({ unit: 'grapheme', maxLength: 30 }).filter((s) => !/[\r\n]/.test(s)), { minLength: 1, maxLength: 8 });
    fc.assert(fc.property(datas, fc.constantFrom('\n', '\r\n', '\r'), fc.array(fc.nat(), { maxLength: 6 }), (items, eol, cuts) => {
      const text = items.map((d) => `: comment${eol}data: ${d}${eol}${eol}`).join('');
      const bytes = Buffer.from(text, 'utf8');
      const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
      const parser = new SseParser();
      const got: string[] = [];
      let from = 0;
      for (const p of [...points, bytes.length]) {
        got.push(...parser.push(bytes.subarray(from, p)).map((e) => e.data));
        from = p;
      }
      // A trailing \r may be the first half of \r\n: the last event of a \r stream waits for the end.
      got.push(...parser.end().map((e) => e.data));
      expect(got).toEqual(items);
      expect(parser.pending).toBe(false);
    }));
  });

  it('joins multi-line data and refuses a line longer than its limit', () => {
    const parser = new SseParser(64);
    expect(parser.push(Buffer.from('event: x\ndata: a\ndata: b\n\n'))).toEqual([{ data: 'a\nb', event: 'x' }]);
    expect(() => parser.push(Buffer.from(`data: ${'y'.repeat(100)}`))).toThrow(/longer than 64/);
  });
});

describe('StreamAssembler and extractTokens', () => {
  it('reassembles content, tool calls by index, logprobs and token ids in order', () => {
    const a = new StreamAssembler();
    a.push({ id: 'c1', model: 'm', prompt_token_ids: [1, 2], choices: [{ index: 0, delta: { role: 'assistant', content: null } }] });
    a.push({ id: 'c1', choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 't0', type: 'function', function: { name: 'bash', arguments: '' } }] } }] });
    a.push({ id: 'c1', choices: [{ index: 0, delta: { tool_calls: [{ index: 1, id: 't1', function: { name: 'finish', arguments: '{}' } }] }, token_ids: [9], logprobs: { content: [{ token: 'token_id:9', logprob: -0.5 }] } }] });
    a.push({ id: 'c1', choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"command":"ls"}' } }] }, token_ids: [7, 8], logprobs: { content: [{ token: 'token_id:7', logprob: -1 }, { token: 'token_id:8', logprob: 0 }] } }] });
    a.push({ id: 'c1', choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] });
    a.push({ id: 'c1', choices: [], usage: { total_tokens: 5 } });
    const completion = a.result();
    expect(completion).toMatchObject({
      id: 'c1',
      usage: { total_tokens: 5 },
      prompt_token_ids: [1, 2],
      choices: [{ index: 0, finish_reason: 'tool_calls', token_ids: [9, 7, 8], message: { role: 'assistant', content: null, tool_calls: [
        { id: 't0', type: 'function', function: { name: 'bash', arguments: '{"command":"ls"}' } },
        { id: 't1', type: 'function', function: { name: 'finish', arguments: '{}' } },
      ] } }],
    });
    expect(extractTokens(completion)).toEqual({ promptTokenIds: [1, 2], choices: [{ index: 0, tokenIds: [9, 7, 8], logprobs: [-0.5, -1, 0] }] });
  });

  it('reads token ids from `token_id:<id>` logprobs when the endpoint sends no token_ids, and keeps plain token strings', () => {
    expect(extractTokens({ choices: [{ index: 0, logprobs: { content: [{ token: 'token_id:42', logprob: -0.1 }] } }] }))
      .toEqual({ choices: [{ index: 0, tokenIds: [42], logprobs: [-0.1] }] });
    expect(extractTokens({ choices: [{ index: 0, logprobs: { content: [{ token: 'Hi', logprob: -0.2 }] } }] }))
      .toEqual({ choices: [{ index: 0, logprobs: [-0.2], tokens: ['Hi'] }] });
    expect(extractTokens({ choices: [{ index: 0, message: { content: 'x' } }] })).toBeUndefined();
  });
});

describe('buildTrajectory', () => {
  const call = (seq: number, messages: unknown[], answer: unknown, outcome: ModelCallRecord['outcome'] = 'answered'): ModelCallRecord => ({
    seq, episodeId: 'e', taskId: 't', startedAt: '2026-01-01T00:00:00Z', durationMs: 1, method: 'POST', path: '/v1/chat/completions',
    status: outcome === 'answered' ? 200 : 429, outcome, request: { messages }, response: { choices: [{ index: 0, message: answer, finish_reason: 'stop' }] },
  });
  it('places each answer after its prompt, and keeps the prompt of a turn whose history was rewritten', () => {
    const u = { role: 'user', content: 'hi' };
    const a1 = { role: 'assistant', content: 'one' };
    const a2 = { role: 'assistant', content: 'two' };
    const summary = { role: 'user', content: 'summary of before' };
    const t = buildTrajectory([
      call(1, [u], a1),
      call(2, [u, a1, u], a1, 'refused'),
      call(3, [summary], a2),
    ], { episodeId: 'e', taskId: 't', attempt: 1 });
    expect(t.messages).toEqual([summary, a2]);
    expect(t.calls).toEqual({ answered: 2, refused: 1, upstream_failed: 0, aborted: 0 });
    expect(t.turns.map((x) => [x.seq, x.messageIndex, x.prompt])).toEqual([[1, -1, [u]], [3, 1, undefined]]);
  });
});

// Streamed chat completions through the model proxy, from the host side over its real Unix socket, in
// front of the real scripted policy server (and, for broken streams, small upstreams written here):
// event-by-event relay, usage and budgets, the stream reassembled into the evidence, token ids and
// logprobs captured exactly, a client that goes away, and upstreams that misbehave mid-stream.
import { once } from 'node:events';
import { mkdtemp, readFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy, type ModelProxy, type ModelProxyOptions } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { stubTokens } from '../../src/model/stub-tokens.ts';
import { silentLog, waitFor } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS, TOOLS, bodyOf, chat, conversation, streamChat } from '../helpers/model.ts';

const API_KEY = 'sk-stream-test-91c0d2';

type Chunk = {
  choices: { delta: { content?: string | null; tool_calls?: { function: { arguments?: string } }[] }; token_ids?: number[]; logprobs?: { content: { token: string; logprob: number }[] } | null }[];
  usage?: { total_tokens: number } | null;
  prompt_token_ids?: number[];
  error?: { type: string; message: string };
};

describe('model proxy: streaming', () => {
  let stub: ModelStub;
  let slowStub: ModelStub;
  let dataDir: string;
  const proxies: ModelProxy[] = [];
  const upstreams: http.Server[] = [];
  let n = 0;

  beforeAll(async () => {
    stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, requireKey: API_KEY, log: silentLog });
    slowStub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, requireKey: API_KEY, streamChunkDelayMs: 50, log: silentLog });
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-stream-'));
  });
  afterEach(async () => {
    await Promise.all(proxies.splice(0).map((p) => p.close()));
    await Promise.all(upstreams.splice(0).map((s) => new Promise((resolve) => {
      s.close(resolve);
      s.closeAllConnections();
    })));
  });
  afterAll(async () => {
    await stub?.close();
    await slowStub?.close();
  });

  async function proxy(overrides: Partial<ModelProxyOptions> = {}) {
    const episodeId = `stream-test.fix-greeting.${n++}`;
    const evidenceFile = path.join(dataDir, 'evidence', episodeId, 'attempt-1', MODEL_CALLS_FILE);
    const p = await startModelProxy({
      socketPath: modelSocketPath(dataDir, episodeId),
      upstreamBaseUrl: stub.baseUrl!,
      apiKey: API_KEY,
      budget: { maxCalls: 20, maxTokens: 100_000 },
      evidenceFile,
      episodeId,
      taskId: 'fix-greeting',
      log: silentLog,
      retry: { retries: 1, baseDelayMs: 5, maxDelayMs: 20 },
      ...overrides,
    });
    proxies.push(p);
    const records = async () => (await readFile(evidenceFile, 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
    return { proxy: p, target: { socketPath: p.socketPath }, episodeId, records };
  }

  /** An upstream that answers every chat call with `write(res)`: for streams the stub never sends. */
  async function rawUpstream(write: (res: http.ServerResponse) => void): Promise<string> {
    const server = http.createServer((req, res) => {
      req.resume();
      req.once('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        write(res);
      });
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    upstreams.push(server);
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  }

  const parse = (events: string[]) => events.filter((e) => e !== '[DONE]').map((e) => JSON.parse(e) as Chunk);

  it('relays the stream event by event and records it reassembled, equal to the same call unstreamed', async () => {
    const { proxy: p, target, records } = await proxy({ upstreamBaseUrl: slowStub.baseUrl! });
    const body = { model: 'm', messages: conversation('Solve the task.'), tools: TOOLS };
    let completedAtFirstContent: number | undefined;
    const streamed = await streamChat(target, { ...body, stream: true }, (data, i) => {
      // The stub spaces its events 50 ms apart: the first ones reach the client long before it ends.
      if (i === 1) completedAtFirstContent = slowStub.streams().completed;
    });
    expect(streamed.status).toBe(200);
    expect(streamed.headers['content-type']).toMatch(/^text\/event-stream/);
    expect(completedAtFirstContent).toBe(0);
    expect(streamed.events.at(-1)).toBe('[DONE]');
    const chunks = parse(streamed.events);
    expect(chunks.length).toBeGreaterThan(5);
    // The agent did not ask for usage: the usage chunk the proxy asked for upstream is not passed on.
    expect(chunks.every((c) => c.choices.length > 0)).toBe(true);
    const args = chunks.flatMap((c) => c.choices[0]!.delta.tool_calls ?? []).map((t) => t.function.arguments ?? '').join('');

    const plain = await chat(target, body);
    const plainCall = bodyOf(plain).choices![0]!.message!.tool_calls![0]!;
    expect(args).toBe(plainCall.function.arguments);

    const [streamRecord, plainRecord] = await records();
    expect(streamRecord).toMatchObject({ outcome: 'answered', status: 200, stream: { events: chunks.length } });
    expect((streamRecord!.request as { stream: boolean }).stream).toBe(true);
    const reassembled = streamRecord!.response as { choices: { message: unknown; finish_reason: string }[]; usage: { total_tokens: number } };
    expect(reassembled.choices[0]).toEqual({ index: 0, message: bodyOf(plain).choices![0]!.message, finish_reason: 'tool_calls' });
    // Usage came from the chunk the proxy asked for, so the budget was charged what the model said.
    expect(reassembled.usage).toEqual(bodyOf(plain).usage);
    expect(streamRecord!.tokens).toBe(bodyOf(plain).usage!.total_tokens);
    expect(plainRecord!.outcome).toBe('answered');
    expect(p.stats()).toMatchObject({ calls: 2, tokens: 2 * bodyOf(plain).usage!.total_tokens, failed: 0 });
  });

  it('passes the usage chunk on when the agent asks for it, and enforces the token budget on streams', async () => {
    const { target } = await proxy({ budget: { maxCalls: 20, maxTokens: 150 } });
    const body = { messages: conversation('Solve the task.'), stream: true, stream_options: { include_usage: true } };
    const first = parse((await streamChat(target, body)).events);
    const usage = first.at(-1)!;
    expect(usage.choices).toEqual([]);
    expect(usage.usage!.total_tokens).toBeGreaterThan(0);
    // Each call uses about 50 tokens: the budget of 150 runs out at the fourth call at the latest.
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await streamChat(target, body));
    const refused = answers.find((a) => a.status === 429);
    expect(refused, 'a streamed call past the token budget is refused').toBeDefined();
    expect(JSON.parse(refused!.text)).toMatchObject({ error: { type: 'budget_exceeded', budget: 'tokens' } });
  });

  it('captures token ids and logprobs exactly as the endpoint returned them, streamed and not', async () => {
    const { target, records } = await proxy({ captureTokens: true });
    const body = { messages: conversation('Solve the task.'), tools: TOOLS };
    const plain = await chat(target, body);
    const streamed = parse((await streamChat(target, { ...body, stream: true })).events);
    const [plainRecord, streamRecord] = await records();
    // The proxy asked for them (vLLM's fields) although the agent did not.
    expect(plainRecord!.request).not.toHaveProperty('return_token_ids');
    const args = bodyOf(plain).choices![0]!.message!.tool_calls![0]!.function.arguments;
    const expected = stubTokens(args, 'completion');
    for (const record of [plainRecord!, streamRecord!]) {
      expect(record.capture!.choices).toEqual([{ index: 0, tokenIds: expected.map((t) => t.id), logprobs: expected.map((t) => t.logprob) }]);
      expect(record.capture!.promptTokenIds).toHaveLength(bodyOf(plain).usage!.prompt_tokens);
    }
    expect(streamRecord!.capture!.promptTokenIds).toEqual(plainRecord!.capture!.promptTokenIds);
    // The agent got them too, token by token.
    expect(streamed.flatMap((c) => c.choices[0]?.token_ids ?? [])).toEqual(expected.map((t) => t.id));
    expect(streamed.flatMap((c) => c.choices[0]?.logprobs?.content ?? []).map((l) => l.token)).toEqual(expected.map((t) => `token_id:${t.id}`));
  });

  it('aborts the upstream call when the client goes away mid-stream, and records it', async () => {
    const { target, records } = await proxy({ upstreamBaseUrl: slowStub.baseUrl! });
    const before = slowStub.streams();
    const answer = await streamChat(target, { messages: conversation('Solve the task.'), stream: true }, (_data, i) => (i === 2 ? 'disconnect' : undefined));
    expect(answer.events).toHaveLength(3);
    await waitFor('the stub to see its stream aborted', async () => slowStub.streams().aborted === before.aborted + 1);
    expect(slowStub.streams().completed).toBe(before.completed);
    await waitFor('the aborted call in the evidence', async () => (await records().catch(() => [])).length === 1);
    expect((await records())[0]).toMatchObject({ outcome: 'aborted', status: 0 });
  });

  it('ends a stream whose upstream sends what is not JSON with an error event the agent sees, and records it', async () => {
    const upstream = await rawUpstream((res) => {
      res.write(`data: ${JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { content: 'Hel' } }] })}\n\n`);
      res.write('data: {"choices": [ this is not json\n\n');
    });
    const { target, records } = await proxy({ upstreamBaseUrl: upstream });
    const answer = await streamChat(target, { messages: conversation('x'), stream: true });
    const chunks = parse(answer.events);
    expect(chunks[0]!.choices[0]!.delta.content).toBe('Hel');
    expect(chunks.at(-1)!.error).toMatchObject({ type: 'upstream_malformed', message: expect.stringContaining('not JSON') });
    expect(answer.events).not.toContain('[DONE]');
    const [record] = await records();
    expect(record).toMatchObject({ outcome: 'upstream_failed', error: { type: 'upstream_malformed' } });
    // What arrived before the break is in the evidence.
    expect((record!.response as { choices: { message: { content: string } }[] }).choices[0]!.message.content).toBe('Hel');
  });

  it('ends a stream whose upstream stalls mid-stream at the idle deadline, with an error event', async () => {
    const upstream = await rawUpstream((res) => {
      res.write(`data: ${JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { content: 'thinking' } }] })}\n\n`);
      // ...and nothing more, the connection left open.
    });
    const { target, records } = await proxy({ upstreamBaseUrl: upstream, streamIdleTimeoutMs: 300 });
    const started = performance.now();
    const answer = await streamChat(target, { messages: conversation('x'), stream: true });
    expect(performance.now() - started).toBeLessThan(5_000);
    expect(parse(answer.events).at(-1)!.error).toMatchObject({ type: 'upstream_timeout', message: expect.stringContaining('300 ms') });
    expect((await records())[0]).toMatchObject({ outcome: 'upstream_failed', error: { type: 'upstream_timeout' } });
  });

  it('treats a stream that ends without [DONE] as cut, and an upstream error event as a failure', async () => {
    const cut = await rawUpstream((res) => {
      res.end(`data: ${JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { content: 'par' } }] })}\n\n`);
    });
    const errs = await rawUpstream((res) => {
      res.end(`data: ${JSON.stringify({ error: { message: 'CUDA out of memory', code: 500 } })}\n\n`);
    });
    const a = await proxy({ upstreamBaseUrl: cut });
    expect(parse((await streamChat(a.target, { messages: conversation('x'), stream: true })).events).at(-1)!.error).toMatchObject({ type: 'upstream_malformed', message: expect.stringContaining('without [DONE]') });
    const b = await proxy({ upstreamBaseUrl: errs });
    expect(parse((await streamChat(b.target, { messages: conversation('x'), stream: true })).events).at(-1)!.error).toMatchObject({ type: 'upstream_failed', message: expect.stringContaining('CUDA out of memory') });
    expect((await b.records())[0]).toMatchObject({ outcome: 'upstream_failed' });
  });

  it('refuses stream: true with n > 1 naming the field, and records the refusal', async () => {
    const { target, records } = await proxy();
    const answer = await chat(target, { messages: conversation('x'), stream: true, n: 3 });
    expect(answer.status).toBe(400);
    expect(bodyOf(answer).error).toMatchObject({ type: 'invalid_request', param: 'n', message: expect.stringContaining('n is 3') });
    expect((await records())[0]).toMatchObject({ outcome: 'refused', status: 400, error: { type: 'invalid_request' } });
  });
});

// The Responses API (POST /v1/responses) through the model proxy, over its real Unix socket, in front of
// the real scripted policy server on loopback and the fleet-wide limiter on a real Redis: the key added,
// the call recorded in model-calls.jsonl with its usage, charged to the episode's budgets and to the
// endpoint's tokens per minute, streamed (event: lines relayed as they come) and not.
import { mkdtemp, readFile } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { endpointLimiter, readEndpointLimitMetrics } from '../../src/model/fleet-limits.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy, type ModelProxy, type ModelProxyOptions } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { STUB_SOLUTION_DIR } from '../../src/model/stub-script.ts';
import { silentLog } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS, request } from '../helpers/model.ts';

const API_KEY = 'sk-responses-test-5d1e0a9c';

interface SseFrame { event: string | undefined; data: string }

/** POST a streamed Responses call over the socket; every frame (its `event:` name and data) in order of arrival. */
function streamResponses(socketPath: string, body: unknown): Promise<{ status: number; contentType: string | undefined; frames: SseFrame[]; text: string }> {
  const payload = Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, path: '/v1/responses', method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': payload.length } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => {
        const frames = text.split('\n\n').filter((b) => b.trim() !== '').map((block) => {
          const lines = block.split('\n');
          return { event: lines.find((l) => l.startsWith('event: '))?.slice(7), data: lines.filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n') };
        });
        resolve({ status: res.statusCode ?? 0, contentType: res.headers['content-type'], frames, text });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(payload);
  });
}

const INSTRUCTION = 'Solve the task.';

describe('Responses API through the model proxy', () => {
  let stub: ModelStub;
  let redis: PrivateRedis;
  let client: Redis;
  let dataDir: string;
  const proxies: ModelProxy[] = [];
  let n = 0;
  const prefix = `resp${process.pid}`;

  beforeAll(async () => {
    stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, requireKey: API_KEY, log: silentLog });
    redis = await startPrivateRedis();
    client = new Redis(redis.url, { maxRetriesPerRequest: null });
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-responses-'));
  });
  afterEach(async () => {
    await Promise.all(proxies.splice(0).map((p) => p.close()));
  });
  afterAll(async () => {
    await stub?.close();
    await client?.quit();
    await redis?.stop();
  });

  async function proxy(overrides: Partial<ModelProxyOptions> = {}) {
    const episodeId = `responses-test.fix-greeting.${n++}`;
    const evidenceFile = path.join(dataDir, 'evidence', episodeId, 'attempt-1', MODEL_CALLS_FILE);
    const p = await startModelProxy({
      socketPath: modelSocketPath(dataDir, episodeId), upstreamBaseUrl: stub.baseUrl!, apiKey: API_KEY,
      budget: { maxCalls: 20, maxTokens: 100_000 }, evidenceFile, episodeId, taskId: 'fix-greeting', log: silentLog,
      retry: { retries: 1, baseDelayMs: 5, maxDelayMs: 20 }, ...overrides,
    });
    proxies.push(p);
    const records = async () => (await readFile(evidenceFile, 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
    return { proxy: p, socketPath: p.socketPath, episodeId, records };
  }

  it('relays a Responses call whole, with the key added, recorded with its usage and charged to the budget and the tokens per minute', async () => {
    const limiter = endpointLimiter(stub.baseUrl!, { tokensPerMinute: 1_000_000 }, 30_000, { redis: client, prefix, log: silentLog });
    const { proxy: p, socketPath, episodeId, records } = await proxy({ limiter, model: 'fleet-model-7b' });
    const answer = await request({ socketPath }, 'POST', '/v1/responses', { model: 'agent-choice', input: INSTRUCTION });
    expect(answer.status).toBe(200);
    const body = answer.json as { object: string; model: string; output: { type: string; name: string; arguments: string }[]; usage: { input_tokens: number; output_tokens: number; total_tokens: number } };
    expect(body).toMatchObject({ object: 'response', model: 'fleet-model-7b' });
    // The stub answers the task's first scripted step (it found the task by the proxy's header, and had the key).
    expect(body.output[0]).toMatchObject({ type: 'function_call', name: 'write_file' });
    expect(JSON.parse(body.output[0]!.arguments)).toMatchObject({ path: `${STUB_SOLUTION_DIR}/solve.sh` });
    const { usage } = body;
    expect(usage.total_tokens).toBe(usage.input_tokens + usage.output_tokens);
    expect(usage.input_tokens).toBeGreaterThan(0);
    expect(stub.calls().filter((c) => c.episodeId === episodeId)).toEqual([{ episodeId, taskId: 'fix-greeting', turn: 0, count: 1 }]);
    expect(p.stats()).toMatchObject({ calls: 1, tokens: usage.total_tokens, refused: 0, failed: 0 });

    const [record] = await records();
    expect(record).toMatchObject({ path: '/v1/responses', status: 200, outcome: 'answered', tokens: usage.total_tokens, request: { model: 'agent-choice', input: INSTRUCTION } });
    expect((record!.response as { usage: unknown }).usage).toEqual(usage);
    expect(JSON.stringify(record)).not.toContain(API_KEY);
    // Charged to the endpoint's fleet-wide tokens of the last minute, as a chat call is.
    const [metrics] = await readEndpointLimitMetrics(client, prefix);
    expect(metrics?.tokensLastMinute).toBe(usage.total_tokens);
  });

  it('relays a streamed Responses call event by event, event: lines kept, and records the completed response with its usage', async () => {
    const { proxy: p, socketPath, records } = await proxy();
    const streamed = await streamResponses(socketPath, { input: [{ role: 'user', content: INSTRUCTION }], stream: true });
    expect(streamed.status).toBe(200);
    expect(streamed.contentType).toMatch(/^text\/event-stream/);
    const names = streamed.frames.map((f) => f.event);
    expect(names[0]).toBe('response.created');
    expect(names.at(-1)).toBe('response.completed');
    expect(names).toContain('response.function_call_arguments.delta');
    // Every frame is the stub's own, in order: each event names its type in its data too.
    for (const f of streamed.frames) expect((JSON.parse(f.data) as { type: string }).type).toBe(f.event);
    expect(streamed.text).not.toContain('[DONE]');
    const completed = JSON.parse(streamed.frames.at(-1)!.data) as { response: { usage: { total_tokens: number; input_tokens: number; output_tokens: number } } };
    const { usage } = completed.response;
    expect(usage.total_tokens).toBeGreaterThan(0);
    expect(p.stats()).toMatchObject({ calls: 1, tokens: usage.total_tokens });

    const [record] = await records();
    expect(record).toMatchObject({ path: '/v1/responses', status: 200, outcome: 'answered', tokens: usage.total_tokens, stream: { events: streamed.frames.length } });
    expect(record!.response).toEqual(completed.response);
  });

  it('refuses Responses calls past the call and token budgets with 429 naming the budget, streamed and not', async () => {
    const { socketPath, records } = await proxy({ budget: { maxCalls: 2, maxTokens: 100_000 } });
    expect((await request({ socketPath }, 'POST', '/v1/responses', { input: INSTRUCTION })).status).toBe(200);
    expect((await streamResponses(socketPath, { input: INSTRUCTION, stream: true })).status).toBe(200);
    const refused = await request({ socketPath }, 'POST', '/v1/responses', { input: INSTRUCTION, stream: true });
    expect(refused.status).toBe(429);
    expect(refused.json).toMatchObject({ error: { type: 'budget_exceeded', budget: 'calls', limit: 2, used: 2 } });
    expect((await records()).map((r) => [r.path, r.outcome, r.status])).toEqual([
      ['/v1/responses', 'answered', 200], ['/v1/responses', 'answered', 200], ['/v1/responses', 'refused', 429],
    ]);

    const small = await proxy({ budget: { maxCalls: 20, maxTokens: 50 } });
    const tooBig = await request({ socketPath: small.socketPath }, 'POST', '/v1/responses', { input: INSTRUCTION, max_output_tokens: 1_000 });
    expect(tooBig.status).toBe(429);
    expect(tooBig.json).toMatchObject({ error: { type: 'budget_exceeded', budget: 'tokens', limit: 50 } });
  });

  it('refuses a Responses request without input, naming the field, and a GET with 405', async () => {
    const { socketPath } = await proxy();
    const bad = await request({ socketPath }, 'POST', '/v1/responses', { model: 'm' });
    expect(bad.status).toBe(400);
    expect(bad.json).toMatchObject({ error: { type: 'invalid_request' } });
    expect((bad.json as { error: { message: string } }).error.message).toContain('input');
    const wrongMethod = await request({ socketPath }, 'GET', '/v1/responses');
    expect(wrongMethod.status).toBe(405);
    expect(wrongMethod.headers.allow).toBe('POST');
  });
});

// The model proxy from the host side, over its real Unix socket, in front of the real scripted policy
// server on loopback: forwarding with the key added, refusals, budgets, retries, evidence, the socket.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readFile, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy, type ModelProxy, type ModelProxyOptions } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { STUB_SOLUTION_DIR } from '../../src/model/stub-script.ts';
import { silentLog, waitFor } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS, TOOLS, bodyOf, chat, closedPort, conversation, request, toolCallOf } from '../helpers/model.ts';

const API_KEY = 'sk-proxy-test-3f9a1c77e0b2';

describe('model proxy', () => {
  let stub: ModelStub;
  let dataDir: string;
  const proxies: ModelProxy[] = [];
  let n = 0;

  beforeAll(async () => {
    stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, requireKey: API_KEY, log: silentLog });
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-proxy-'));
  });
  afterEach(async () => {
    await Promise.all(proxies.splice(0).map((p) => p.close()));
  });
  afterAll(async () => {
    await stub?.close();
  });

  async function proxy(overrides: Partial<ModelProxyOptions> = {}) {
    const episodeId = `proxy-test.fix-greeting.${n++}`;
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
      retry: { retries: 2, baseDelayMs: 5, maxDelayMs: 20 },
      ...overrides,
    });
    proxies.push(p);
    const records = async () => (await readFile(evidenceFile, 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
    return { proxy: p, target: { socketPath: p.socketPath }, episodeId, evidenceFile, records };
  }

  it('forwards a chat completion with the key and episode headers added; the scripted tool call comes back', async () => {
    const { proxy: p, target, episodeId } = await proxy();
    // The client sends no key and no task: the proxy adds both (the stub answers 401 without the key
    // and would not know the task without the header).
    const answer = await chat(target, { model: 'agent-choice', messages: conversation('Solve the task.'), tools: TOOLS });
    expect(answer.status).toBe(200);
    expect(toolCallOf(answer)).toMatchObject({ name: 'write_file', args: { path: `${STUB_SOLUTION_DIR}/solve.sh` } });
    expect(bodyOf(answer).usage!.total_tokens).toBeGreaterThan(0);
    expect(stub.calls().filter((c) => c.episodeId === episodeId)).toEqual([{ episodeId, taskId: 'fix-greeting', turn: 0, count: 1 }]);
    expect(p.stats()).toEqual({ calls: 1, tokens: bodyOf(answer).usage!.total_tokens, refused: 0, failed: 0, rateLimited: 0, inFlight: 0 });

    const models = await request(target, 'GET', '/v1/models');
    expect(models.status).toBe(200);
    expect(models.json).toMatchObject({ object: 'list', data: [{ id: 'scripted-policy' }] });
  });

  it('never forwards a key the sandbox sends itself, and puts MODEL_NAME in every request', async () => {
    const { target } = await proxy({ apiKey: undefined });
    const answer = await chat(target, { messages: conversation('Solve the task.') }, { authorization: `Bearer ${API_KEY}` });
    expect(answer.status).toBe(401);
    expect(bodyOf(answer).error).toMatchObject({ type: 'unauthorized' });

    const named = await proxy({ model: 'fleet-model-7b' });
    const renamed = await chat(named.target, { model: 'agent-choice', messages: conversation('Solve the task.') });
    expect(renamed.json).toMatchObject({ model: 'fleet-model-7b' });
  });

  it('refuses other paths, wrong methods, bad bodies and streaming with clear JSON errors', async () => {
    const { proxy: p, target, episodeId, records } = await proxy({ maxBodyBytes: 64 * 1024 });
    const cases = [
      [await request(target, 'GET', '/v1/chat/completions'), 405, 'method_not_allowed'],
      [await request(target, 'POST', '/v1/models', {}), 405, 'method_not_allowed'],
      [await request(target, 'POST', '/v1/embeddings', { input: 'x' }), 404, 'not_found'],
      [await request(target, 'GET', '/'), 404, 'not_found'],
      [await request(target, 'GET', '/v1/../etc/passwd'), 404, 'not_found'],
      [await chat(target, '{"messages": [oops'), 400, 'invalid_request'],
      [await chat(target, { messages: [] }), 400, 'invalid_request'],
      [await chat(target, { stream: true, n: 2, messages: conversation('x') }), 400, 'invalid_request'],
      [await chat(target, { messages: conversation('x'.repeat(100 * 1024)) }), 413, 'body_too_large'],
    ] as const;
    for (const [answer, status, type] of cases) {
      expect(answer.status, answer.text).toBe(status);
      expect(answer.headers['content-type']).toBe('application/json');
      expect(bodyOf(answer).error).toMatchObject({ type, message: expect.any(String) });
    }
    expect(cases[0][0].headers.allow).toBe('POST');
    expect(bodyOf(cases[2][0]).error!.message).toContain('/v1/chat/completions');
    expect(bodyOf(cases[6][0]).error!.message).toContain('messages');
    expect(p.stats()).toEqual({ calls: 0, tokens: 0, refused: cases.length, failed: 0, rateLimited: 0, inFlight: 0 });
    expect(stub.calls().filter((c) => c.episodeId === episodeId)).toEqual([]);
    expect((await records()).map((r) => [r.status, r.outcome])).toEqual(cases.map(([, status]) => [status, 'refused']));
  });

  it('refuses a call past the call budget with 429 naming the calls budget', async () => {
    const { proxy: p, target } = await proxy({ budget: { maxCalls: 2, maxTokens: 100_000 } });
    for (let i = 0; i < 2; i++) expect((await chat(target, { messages: conversation('x') })).status).toBe(200);
    const refused = await chat(target, { messages: conversation('x') });
    expect(refused.status).toBe(429);
    expect(bodyOf(refused).error).toMatchObject({ type: 'budget_exceeded', budget: 'calls', limit: 2, used: 2 });
    expect(p.stats()).toMatchObject({ calls: 2, refused: 1 });
  });

  it('refuses a call whose max_tokens passes the remaining tokens, and any call once they are used up', async () => {
    const { proxy: p, target } = await proxy({ budget: { maxCalls: 20, maxTokens: 300 } });
    const first = await chat(target, { messages: conversation('x'), max_tokens: 100 });
    expect(first.status).toBe(200);
    const used = bodyOf(first).usage!.total_tokens;
    expect(used).toBeGreaterThan(0);
    expect(used).toBeLessThan(300);

    const tooBig = await chat(target, { messages: conversation('x'), max_completion_tokens: 300 - used + 1 });
    expect(tooBig.status).toBe(429);
    expect(bodyOf(tooBig).error).toMatchObject({ type: 'budget_exceeded', budget: 'tokens', limit: 300, used });
    expect(bodyOf(tooBig).error!.message).toContain(`remaining token budget of ${300 - used}`);

    // Calls without max_tokens go on until the answers have used the budget up.
    let answer = first;
    for (let i = 0; i < 20 && answer.status === 200; i++) answer = await chat(target, { messages: conversation('x') });
    expect(answer.status).toBe(429);
    expect(bodyOf(answer).error).toMatchObject({ type: 'budget_exceeded', budget: 'tokens', limit: 300 });
    expect(p.stats().tokens).toBeGreaterThanOrEqual(300);
  });

  it('retries an endpoint that is down, then answers 502 without charging the budget', async () => {
    const { proxy: p, target, records } = await proxy({ upstreamBaseUrl: `http://127.0.0.1:${await closedPort()}/v1` });
    const answer = await chat(target, { messages: conversation('x') });
    expect(answer.status).toBe(502);
    expect(bodyOf(answer).error).toMatchObject({ type: 'upstream_failed', attempts: 3 });
    expect(bodyOf(answer).error!.message).toContain('ECONNREFUSED');
    expect(p.stats()).toEqual({ calls: 0, tokens: 0, refused: 0, failed: 1, rateLimited: 0, inFlight: 0 });
    const [record] = await records();
    expect(record).toMatchObject({ status: 502, outcome: 'upstream_failed' });
    expect(record!.attempts).toHaveLength(3);
    expect(record!.attempts!.every((a) => a.error?.startsWith('ECONNREFUSED'))).toBe(true);
  });

  it('retries 5xx answers: succeeds when one comes through, 502 when none does', async () => {
    const flaky = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, failFirst: 2, log: silentLog });
    try {
      const { target, records } = await proxy({ upstreamBaseUrl: flaky.baseUrl!, retry: { retries: 3, baseDelayMs: 5, maxDelayMs: 20 } });
      const ok = await chat(target, { messages: conversation('x') });
      expect(ok.status).toBe(200);
      expect((await records())[0]!.attempts!.map((a) => a.status)).toEqual([503, 503, 200]);

      const never = await proxy({ upstreamBaseUrl: flaky.baseUrl!, retry: { retries: 1, baseDelayMs: 5, maxDelayMs: 20 } });
      const failed = await chat(never.target, { messages: conversation('x') });
      expect(failed.status).toBe(502);
      expect(bodyOf(failed).error).toMatchObject({ type: 'upstream_failed', attempts: 2, upstreamStatus: 503 });
      // The stub answered each turn once: the failures it injected are not answers.
      expect(flaky.calls().map((c) => [c.turn, c.count])).toEqual([[0, 1]]);
    } finally {
      await flaky.close();
    }
  });

  it('gives up on an endpoint that does not answer in time, and answers calls in flight with 503 on close', async () => {
    const slow = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, delayMs: 60_000, log: silentLog });
    try {
      const timed = await proxy({ upstreamBaseUrl: slow.baseUrl!, requestTimeoutMs: 100, retry: { retries: 1, baseDelayMs: 5, maxDelayMs: 20 } });
      const late = await chat(timed.target, { messages: conversation('x') });
      expect(late.status).toBe(502);
      expect(bodyOf(late).error).toMatchObject({ type: 'upstream_failed', attempts: 2 });
      expect(bodyOf(late).error!.message).toContain('no answer within 100 ms');

      const { proxy: p, target, records } = await proxy({ upstreamBaseUrl: slow.baseUrl! });
      const pending = chat(target, { messages: conversation('x') });
      await waitFor('the call to be in flight', async () => p.stats().inFlight === 1, 10_000, 10);
      const started = Date.now();
      await p.close();
      expect(Date.now() - started).toBeLessThan(10_000);
      const answer = await pending;
      expect(answer.status).toBe(503);
      expect(bodyOf(answer).error).toMatchObject({ type: 'proxy_closing' });
      expect(await records()).toMatchObject([{ status: 503, outcome: 'aborted' }]);
      expect(p.stats()).toMatchObject({ calls: 0, inFlight: 0 });
      expect(slow.calls()).toEqual([]);
    } finally {
      await slow.close();
    }
  });

  it('records every call as evidence, with status and durations, and never the API key', async () => {
    const { target, episodeId, evidenceFile, records } = await proxy({ budget: { maxCalls: 2, maxTokens: 100_000 } });
    const first = await chat(target, { messages: conversation('Solve the task.'), tools: TOOLS });
    const call = toolCallOf(first)!;
    const turns = [{ toolCallId: call.id, name: call.name, arguments: JSON.stringify(call.args), result: 'written' }];
    // The sandbox tries to smuggle its own Authorization header; it is neither forwarded nor kept.
    await chat(target, { messages: conversation('Solve the task.', turns), tools: TOOLS }, { authorization: 'Bearer sandbox-made-up' });
    await chat(target, { messages: conversation('x') });
    await request(target, 'DELETE', '/v1/chat/completions');

    const lines = await records();
    expect(lines.map((r) => [r.seq, r.status, r.outcome])).toEqual([[1, 200, 'answered'], [2, 200, 'answered'], [3, 429, 'refused'], [4, 405, 'refused']]);
    for (const r of lines) {
      expect(r).toMatchObject({ episodeId, taskId: 'fix-greeting', startedAt: expect.any(String), durationMs: expect.any(Number) });
    }
    expect(lines[0]!.request).toMatchObject({ messages: conversation('Solve the task.') });
    expect(lines[0]!.response).toEqual(first.json);
    expect(lines[0]!.tokens).toBe(bodyOf(first).usage!.total_tokens);
    expect(lines[1]!.attempts).toEqual([{ status: 200, durationMs: expect.any(Number) }]);
    const text = await readFile(evidenceFile, 'utf8');
    expect(text).not.toContain(API_KEY);
    expect(text).not.toContain('sandbox-made-up');
    expect(text.toLowerCase()).not.toContain('authorization');
  });

  it('serves a socket only the sandbox user may use (0666 when it cannot chown), refuses to take over a live one, and removes it on close', async () => {
    const { proxy: p, episodeId } = await proxy();
    const socket = await stat(p.socketPath);
    expect(socket.isSocket()).toBe(true);
    if (process.getuid?.() === 0) {
      expect([socket.mode & 0o777, socket.uid, socket.gid]).toEqual([0o600, 1000, 1000]);
    } else {
      expect(socket.mode & 0o777).toBe(0o666);
    }
    expect((await stat(path.dirname(p.socketPath))).mode & 0o777).toBe(0o755);
    expect(p.socketPath).toBe(path.join(dataDir, 'run', episodeId, 'model.sock'));

    const evidenceFile = path.join(dataDir, 'second.jsonl');
    const second = { socketPath: p.socketPath, upstreamBaseUrl: stub.baseUrl!, budget: { maxCalls: 1, maxTokens: 1 }, evidenceFile, episodeId, taskId: 't', log: silentLog };
    await expect(startModelProxy(second)).rejects.toThrow(/another model proxy is listening/);

    await p.close();
    await p.close();
    await expect(stat(p.socketPath)).rejects.toMatchObject({ code: 'ENOENT' });

    // A socket left behind by a killed process (bound, never unlinked) is replaced.
    const holder = spawn(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(p.socketPath)}, () => console.log('bound'))`], { stdio: ['ignore', 'pipe', 'inherit'] });
    await once(holder.stdout, 'data');
    holder.kill('SIGKILL');
    await once(holder, 'exit');
    expect((await stat(p.socketPath)).isSocket()).toBe(true);
    const again = await startModelProxy(second);
    proxies.push(again);
    expect((await stat(again.socketPath)).isSocket()).toBe(true);
  });

  it('rejects options it cannot serve with errors naming the option', async () => {
    const base = { upstreamBaseUrl: stub.baseUrl!, budget: { maxCalls: 1, maxTokens: 1 }, evidenceFile: path.join(dataDir, 'x.jsonl'), episodeId: 'e', taskId: 't', log: silentLog };
    await expect(startModelProxy({ ...base, socketPath: 'relative.sock' })).rejects.toThrow(/`socketPath` to be an absolute path/);
    await expect(startModelProxy({ ...base, socketPath: `/tmp/${'x'.repeat(120)}.sock` })).rejects.toThrow(/at most 107 bytes/);
    await expect(startModelProxy({ ...base, socketPath: path.join(dataDir, 'a.sock'), upstreamBaseUrl: 'ftp://x/v1' })).rejects.toThrow(/`upstreamBaseUrl`/);
    await expect(startModelProxy({ ...base, socketPath: path.join(dataDir, 'b.sock'), budget: { maxCalls: 0, maxTokens: 1 } })).rejects.toThrow(/`maxCalls` to be an integer from 1 up, got `0`/);
  });
});

// Policy versions end to end, on a real Redis, real sandboxes and the scripted policy server: the
// trainer sets an endpoint's version (HTTP API, client, CLI) while episodes are mid-conversation, and
// every model call carries the version current when it started (model-calls.jsonl, trajectory.json),
// results and group events carry the versions seen, and maxStaleness restarts from scratch exactly the
// episodes that spanned two bumps, within its bound, with no episode lost or doubled. A gate in front of
// the stub (loopback) holds chosen calls, so each bump lands at a known point of each conversation.
import { readFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../src/api/api-server.ts';
import { FleetClient, type BatchEvent } from '../../src/client/fleet-client.ts';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { Trajectory } from '../../src/evidence/trajectory.ts';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { MODEL_CALLS_FILE } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { batchCompletionsKey } from '../../src/redis/redis-keys.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { EXAMPLES, runCli, silentLog, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { request } from '../helpers/model.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';
import { startGate, type Gate } from '../helpers/model-gate.ts';

const API_KEY = `sk-policy-test-${process.pid}`;
const TOKEN = 'policy-versions-token-7e1a';
const TASKS = ['fix-greeting', 'sum-column'].map((t) => path.join(EXAMPLES, 'tasks', t));

describe('policy versions', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let gate: Gate;
  let client: FleetClient;
  const workers: WorkerHandle[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0 }, requireKey: API_KEY, log: silentLog });
    gate = await startGate(stub);
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
    const model = { baseUrl: gate.baseUrl, apiKey: API_KEY, maxCalls: 20, maxTokens: 200_000, requestTimeoutMs: 60_000, upstreamRetries: 1 };
    for (const id of ['pv-w1', 'pv-w2']) workers.push(await startEnvWorker(env, id, { concurrency: 2, model }));
  });
  afterAll(async () => {
    gate?.release();
    await Promise.all(workers.map((w) => w.close()));
    await client?.close();
    await gate?.close();
    await stub?.close();
    await env?.close();
  });

  const calls = async (episodeId: string, attempt: number) =>
    (await readFile(path.join(env.dataDir, 'evidence', episodeId, `attempt-${attempt}`, MODEL_CALLS_FILE), 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
  const turnOf = (r: ModelCallRecord) => ((r.request as { messages?: { role: string }[] })?.messages ?? []).filter((m) => m.role === 'assistant').length;
  const enqueue = async (name: string, extra: string, samples = 1) => client.enqueue(await writeBatch(
    `name: ${name}\ntasks: ${JSON.stringify(TASKS)}\nsamples: ${samples}\nagent: { kind: llm, maxTurns: 10 }\n${extra}`, {},
  ));
  const events = async (batchId: string) => {
    const out: BatchEvent[] = [];
    for await (const e of client.results(batchId, { blockMs: 200 })) out.push(e);
    return out;
  };

  it('is set and read by the HTTP API, the client and the CLI, and only moves forward', async () => {
    const server = createApiApp({ client, token: TOKEN, log: silentLog }).listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    try {
      const api = { baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1` };
      const auth = { authorization: `Bearer ${TOKEN}` };
      const url = '/v1/endpoints/api-probe/policy-version';
      expect((await request(api, 'GET', url, undefined, auth)).status).toBe(404);
      const set = await request(api, 'PUT', url, { version: 3 }, auth);
      expect(set.status).toBe(200);
      const state = set.json as { endpoint: string; version: number; setAt: string };
      expect(state).toMatchObject({ endpoint: 'api-probe', version: 3 });
      expect(Date.parse(state.setAt)).not.toBeNaN();
      expect((await request(api, 'GET', url, undefined, auth)).json).toEqual(state);
      // The same again is kept (with its first setAt); a lower one is refused, naming the field.
      expect((await request(api, 'PUT', url, { version: 3 }, auth)).json).toEqual(state);
      const lower = await request(api, 'PUT', url, { version: 2 }, auth);
      expect(lower.status).toBe(409);
      expect(lower.json).toMatchObject({ error: { field: 'version' } });
      expect((lower.json as { error: { message: string } }).error.message).toContain('lower than the current version 3');
      for (const bad of [{ version: -1 }, { version: 1.5 }, { version: '4' }, {}, { version: 4, extra: 1 }]) {
        const answer = await request(api, 'PUT', url, bad, auth);
        expect(answer.status, JSON.stringify(bad)).toBe(400);
        expect((answer.json as { error: { field: string } }).error.field, JSON.stringify(bad)).toMatch(/^(version|extra|body)$/);
      }
      expect((await request(api, 'PUT', '/v1/endpoints/bad%20name/policy-version', { version: 1 }, auth)).json).toMatchObject({ error: { field: 'endpoint' } });
      expect((await request(api, 'PUT', url, { version: 9 })).status).toBe(401);
      // The OpenAPI document declares the route and its shapes.
      const doc = (await request(api, 'GET', '/openapi.json')).json as { paths: Record<string, Record<string, unknown>>; components: { schemas: Record<string, unknown> } };
      expect(Object.keys(doc.paths['/v1/endpoints/{endpoint}/policy-version'] ?? {}).sort()).toEqual(['get', 'put']);
      expect(doc.components.schemas).toHaveProperty('PolicyVersion');
    } finally {
      await new Promise((r) => server.close(r));
    }

    // The client's conflict names the field too.
    await expect(client.setPolicyVersion('api-probe', 1)).rejects.toThrow(/^version: 1 is lower than the current version 3/);
    // The CLI: --help exits 0; set, get, a lower one exits 3.
    const help = await runCli(['policy-version', '--help'], env.env);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('usage: rollout-fleet policy-version');
    const cliSet = await runCli(['policy-version', 'set', 'cli-probe', '7', '--json'], env.env);
    expect(cliSet.code, cliSet.stderr).toBe(0);
    expect(JSON.parse(cliSet.stdout)).toMatchObject({ endpoint: 'cli-probe', version: 7 });
    expect((await client.getPolicyVersion('cli-probe'))?.version).toBe(7);
    const cliGet = await runCli(['policy-version', 'get', 'cli-probe'], env.env);
    expect(cliGet.stdout).toMatch(/^cli-probe: version 7 \(set at /);
    const cliLower = await runCli(['policy-version', 'set', 'cli-probe', '6'], env.env);
    expect(cliLower.code).toBe(3);
    expect(cliLower.stderr).toContain('version: 6 is lower than the current version 7');
    expect((await runCli(['policy-version', 'set', 'cli-probe', 'x'], env.env)).code).toBe(2);
    expect((await runCli(['policy-version', 'get', 'never-set'], env.env)).code).toBe(1);
  });

  it('stamps every call with the version current when it started, bumped by the trainer mid-episode', async () => {
    await client.setPolicyVersion('default', 1);
    // Every episode's second call (turn 1) waits at the gate; it started (and was stamped) before the bump.
    gate.setHold((c) => c.episodeId.startsWith('stamps-') && c.turn === 1 && c.nth === 1);
    const plan = await enqueue('stamps', '', 2);
    expect(plan.jobs).toHaveLength(4);
    await gate.waitHeld(plan.batchId, 4);
    await client.setPolicyVersion('default', 2);
    gate.release(plan.batchId);
    const results = await waitForResults(env, plan.batchId, 4, 180_000);
    for (const r of results) {
      expect(r.status, `${r.episodeId}: ${JSON.stringify(r.error)}`).toBe('passed');
      expect(r.policyVersions).toEqual({ endpoint: 'default', first: 1, last: 2, seen: [1, 2] });
      expect(r.staleRestarts).toBeUndefined();
      const records = (await calls(r.episodeId, r.attempts)).filter((c) => c.path === '/v1/chat/completions');
      expect(records.map((c) => [turnOf(c), c.policyVersion])).toEqual([[0, 1], [1, 1], [2, 2]]);
      const trajectory = JSON.parse(await readFile(path.join(env.dataDir, 'evidence', r.episodeId, `attempt-${r.attempts}`, 'trajectory.json'), 'utf8')) as Trajectory;
      expect(trajectory.turns.map((t) => t.policyVersion)).toEqual([1, 1, 2]);
    }
    // Each group event carries the versions its episodes saw.
    const groups = (await events(plan.batchId)).filter((e) => e.kind === 'group');
    expect(groups).toHaveLength(2);
    for (const g of groups) expect(g.kind === 'group' && g.policyVersions).toEqual({ endpoint: 'default', first: 1, last: 2, seen: [1, 2] });
    await waitForNoContainers(plan.batchId);
  });

  it('maxStaleness 1 restarts from scratch exactly the episodes that spanned two bumps; none is lost or doubled', async () => {
    await client.setPolicyVersion('default', 10);
    // Batch A's episodes start at version 10 and wait at their second call; B's start at 11 and wait
    // likewise; then 12. A's next call would span 10..12: refused, and A restarts (its restart is not held).
    gate.setHold((c) => (c.episodeId.startsWith('stale-a-') || c.episodeId.startsWith('stale-b-')) && c.turn === 1 && c.nth === 1);
    const a = await enqueue('stale-a', 'maxStaleness: 1\n');
    await gate.waitHeld(a.batchId, 2);
    await client.setPolicyVersion('default', 11);
    const b = await enqueue('stale-b', 'maxStaleness: 1\n');
    await gate.waitHeld(b.batchId, 2);
    await client.setPolicyVersion('default', 12);
    gate.release();
    const resultsA = await waitForResults(env, a.batchId, 2, 180_000);
    const resultsB = await waitForResults(env, b.batchId, 2, 180_000);
    for (const r of resultsA) {
      expect(r.status, `${r.episodeId}: ${JSON.stringify(r.error)}`).toBe('passed');
      expect(r.staleRestarts).toBe(1);
      // The result is of the conversation after the restart, all of it at version 12, from scratch.
      expect(r.policyVersions).toEqual({ endpoint: 'default', first: 12, last: 12, seen: [12] });
      expect(r.resumedFrom).toBeUndefined();
      const first = await calls(r.episodeId, 1);
      const refused = first.filter((c) => c.status === 409);
      expect(refused).toHaveLength(1);
      expect(refused[0]).toMatchObject({ outcome: 'refused', policyVersion: 12, error: { type: 'policy_stale' } });
      const last = (await calls(r.episodeId, r.attempts)).filter((c) => c.path === '/v1/chat/completions');
      expect(last.map((c) => [turnOf(c), c.policyVersion])).toEqual([[0, 12], [1, 12], [2, 12]]);
    }
    for (const r of resultsB) {
      expect(r.status, `${r.episodeId}: ${JSON.stringify(r.error)}`).toBe('passed');
      expect(r.staleRestarts).toBeUndefined();
      expect(r.attempts).toBe(1);
      expect(r.policyVersions).toEqual({ endpoint: 'default', first: 11, last: 12, seen: [11, 12] });
    }
    // Exactly once: one completion entry per episode, and the summary counts the restarts apart from retries.
    for (const plan of [a, b]) expect(await env.client.xlen(batchCompletionsKey(env.prefix, plan.batchId))).toBe(2);
    expect((await client.status(a.batchId))?.staleRestarts).toEqual({ episodes: 2, restarts: 2 });
    expect((await client.status(b.batchId))?.staleRestarts).toEqual({ episodes: 0, restarts: 0 });
    // Each restarted turn was asked of the model twice (once per conversation), no turn of B more than once.
    const asked = stub.calls();
    for (const r of resultsA) expect(asked.filter((c) => c.episodeId === r.episodeId && c.turn <= 1).map((c) => c.count)).toEqual([2, 2]);
    for (const r of resultsB) expect(asked.filter((c) => c.episodeId === r.episodeId).every((c) => c.count === 1)).toBe(true);
    await waitForNoContainers(a.batchId);
    await waitForNoContainers(b.batchId);
  });

  it('ends an episode past its maxStaleRestarts with error policy_stale (kind model)', async () => {
    await client.setPolicyVersion('default', 20);
    // maxStaleness 0: any bump between two calls is too stale. Each attempt waits at its second call for a bump.
    gate.setHold((c) => c.episodeId.startsWith('bound-') && c.turn === 1);
    const plan = await client.enqueue(await writeBatch(
      `name: bound\ntasks: [${JSON.stringify(TASKS[0])}]\nagent: { kind: llm, maxTurns: 10 }\nmaxStaleness: 0\nmaxStaleRestarts: 1\n`, {},
    ));
    await gate.waitHeld(plan.batchId, 1);
    await client.setPolicyVersion('default', 21);
    gate.release(plan.batchId);
    // The restart waits at its second call too.
    await gate.waitHeld(plan.batchId, 1);
    await client.setPolicyVersion('default', 22);
    gate.release(plan.batchId);
    const [result] = await waitForResults(env, plan.batchId, 1, 180_000) as EpisodeResult[];
    expect(result).toMatchObject({ status: 'error', reward: null, error: { kind: 'model', code: 'policy_stale' }, staleRestarts: 1, attempts: 2 });
    expect(result!.error!.message).toContain('maxStaleRestarts of 1');
    expect((await client.status(plan.batchId))?.byKind).toEqual({ model: 1 });
    await waitForNoContainers(plan.batchId);
  });
});

// The HTTP API's result stream, consumed as a trainer in another language would: Server-Sent Events
// over plain HTTP, the connection dropped three times at random points and resumed with Last-Event-ID;
// every episode delivered exactly once, in completion order, each task's group event once. NDJSON
// resumes with ?after=. Without the bearer token: 401 naming the header; bad cursors and unknown
// batches: 400 and 404 naming the field.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../src/api/api-server.ts';
import { FleetClient } from '../../src/client/fleet-client.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { runCli, silentLog, startEnvWorker, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const TOKEN = 'api-test-token-7f3a';

interface Event { id?: string; event?: string; data: string }

/** GET an SSE stream; stop (destroy the connection) after `stopAfter` events, or read to the end. */
function sse(url: string, headers: Record<string, string>, stopAfter = Infinity): Promise<{ status: number; events: Event[] }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { headers: { accept: 'text/event-stream', ...headers } }, (res) => {
      const events: Event[] = [];
      let buffer = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buffer += chunk;
        let end: number;
        while ((end = buffer.indexOf('\n\n')) !== -1) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const e: Event = { data: '' };
          for (const line of block.split('\n')) {
            const [k, ...v] = line.split(': ');
            if (k === 'id') e.id = v.join(': ');
            else if (k === 'event') e.event = v.join(': ');
            else if (k === 'data') e.data = v.join(': ');
          }
          events.push(e);
          if (events.length >= stopAfter) {
            req.destroy();
            resolve({ status: res.statusCode ?? 0, events });
            return;
          }
        }
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, events }));
    });
    req.on('error', (err) => (req.destroyed ? undefined : reject(err)));
  });
}

describe('HTTP API: the result stream', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let client: FleetClient;
  let server: http.Server;
  let base: string;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'api-w', { concurrency: 4 });
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix });
    server = createApiApp({ client, token: TOKEN, log: silentLog }).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await client?.close();
    await worker?.close();
    await env?.close();
  });

  it('streams every result once in completion order across three dropped connections, with group events', async () => {
    const task = (id: string) => ({ yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\n`, files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' } });
    const file = await writeBatch('name: api-stream\ntasks: [tasks]\nsamples: 8\nagent: { kind: command, command: "echo fixed > state.txt" }\n', { one: task('one'), two: task('two') });
    const { plan } = { plan: await client.enqueue(file) };
    const auth = { authorization: `Bearer ${TOKEN}` };
    const url = `${base}/v1/batches/${plan.batchId}/results`;

    const all: Event[] = [];
    let lastId: string | undefined;
    for (let drop = 0; drop < 3; drop++) {
      const part = await sse(url, { ...auth, ...(lastId ? { 'last-event-id': lastId } : {}) }, 1 + Math.floor(Math.random() * 4));
      expect(part.status).toBe(200);
      all.push(...part.events);
      lastId = part.events.at(-1)?.id ?? lastId;
    }
    const rest = await sse(url, { ...auth, ...(lastId ? { 'last-event-id': lastId } : {}) });
    all.push(...rest.events);
    expect(all.at(-1)?.event).toBe('end');

    const results = all.filter((e) => e.event === 'result').map((e) => JSON.parse(e.data) as { cursor: string; result: { episodeId: string; reward: number } });
    expect(results.map((r) => r.result.episodeId).sort()).toEqual(plan.jobs.map((j) => j.episodeId).sort());
    const ms = results.map((r) => r.cursor.split('-').map(Number) as [number, number]);
    for (let i = 1; i < ms.length; i++) expect(ms[i]![0] > ms[i - 1]![0] || (ms[i]![0] === ms[i - 1]![0] && ms[i]![1] > ms[i - 1]![1])).toBe(true);
    const groups = all.filter((e) => e.event === 'group').map((e) => JSON.parse(e.data) as { taskId: string; episodeIds: string[]; rewards: number[] });
    expect(groups.map((g) => g.taskId).sort()).toEqual(['one', 'two']);
    for (const g of groups) {
      expect(g.rewards).toEqual(Array(8).fill(1));
      // The group names its episodes in sample order, the rewards in the same order.
      expect(g.episodeIds).toEqual(plan.jobs.filter((j) => j.task.id === g.taskId).map((j) => j.episodeId));
    }

    // NDJSON from a cursor: exactly what came after it.
    const third = results[2]!.cursor;
    const ndjson = await (await fetch(`${url}?after=${third}`, { headers: auth })).text();
    const after = ndjson.trim().split('\n').map((l) => JSON.parse(l) as { kind: string; cursor: string });
    expect(after.filter((e) => e.kind === 'result').map((e) => e.cursor)).toEqual(results.slice(3).map((r) => r.cursor));
  });

  it('keeps a quiet SSE stream alive with comment lines', async () => {
    const quiet = createApiApp({ client, token: TOKEN, log: silentLog, keepAliveMs: 50 }).listen(0, '127.0.0.1');
    await new Promise((resolve) => quiet.once('listening', resolve));
    const task = { yaml: 'id: slow\ninstruction: wait\nverify:\n  command: "true"\n  timeoutSec: 10\ndeadlineSec: 120\n', files: { 'tests/.keep': '' } };
    const plan = await client.enqueue(await writeBatch('name: api-quiet\ntasks: [tasks]\nagent: { kind: command, command: "sleep 60" }\n', { slow: task }));
    try {
      const text = await new Promise<string>((resolve, reject) => {
        const req = http.get(`http://127.0.0.1:${(quiet.address() as AddressInfo).port}/v1/batches/${plan.batchId}/results`, { headers: { accept: 'text/event-stream', authorization: `Bearer ${TOKEN}` } }, (res) => {
          let got = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => {
            got += chunk;
            if (got.split(': keep-alive\n\n').length > 2) {
              req.destroy();
              resolve(got);
            }
          });
        });
        req.on('error', (err) => (req.destroyed ? undefined : reject(err)));
      });
      // Two keep-alives and nothing else: no episode has ended.
      expect(text.replaceAll(': keep-alive\n\n', '')).toBe('');
      const badId = await fetch(`http://127.0.0.1:${(quiet.address() as AddressInfo).port}/v1/batches/${plan.batchId}/results`, { headers: { accept: 'text/event-stream', authorization: `Bearer ${TOKEN}`, 'last-event-id': 'nonsense' } });
      expect(badId.status).toBe(400);
      expect(await badId.json()).toMatchObject({ error: { field: 'Last-Event-ID', message: expect.stringMatching(/^Last-Event-ID: /) } });
    } finally {
      await client.cancel(plan.batchId);
      quiet.closeAllConnections();
      await new Promise((resolve) => quiet.close(resolve));
    }
  });

  it('refuses without the token, and names the field of a bad cursor or an unknown batch', async () => {
    const noToken = await fetch(`${base}/v1/batches/x/results`);
    expect(noToken.status).toBe(401);
    expect(await noToken.json()).toMatchObject({ error: { field: 'authorization' } });
    const wrong = await fetch(`${base}/v1/batches/x`, { headers: { authorization: 'Bearer nope' } });
    expect(wrong.status).toBe(401);
    const auth = { authorization: `Bearer ${TOKEN}` };
    const unknown = await fetch(`${base}/v1/batches/no-such-batch/results`, { headers: auth });
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toMatchObject({ error: { field: 'batchId', message: expect.stringContaining('no-such-batch') } });
    const bad = await fetch(`${base}/v1/batches/no-such-batch/results?after=DROP%20TABLE`, { headers: auth });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ error: { field: 'after' } });
    const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { openapi: string; paths: Record<string, unknown>; components: { schemas: Record<string, unknown> } };
    expect(doc.openapi).toBe('3.1.0');
    expect(Object.keys(doc.paths)).toContain('/v1/batches/{batchId}/results');
    expect(doc.components.schemas.ResultEvent).toBeDefined();
  });

  it('the api command refuses to listen beyond loopback without a token, naming the variable', async () => {
    const run = await runCli(['api', '--port', '0'], { ...env.env, FLEET_API_HOST: '0.0.0.0', FLEET_API_TOKEN: '' });
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('FLEET_API_TOKEN');
    const short = await runCli(['api', '--port', '0'], { ...env.env, FLEET_API_TOKEN: 'short' });
    expect(short.code).toBe(2);
    expect(short.stderr).toContain('FLEET_API_TOKEN');
    expect(short.stderr).not.toContain('short');
  });
});

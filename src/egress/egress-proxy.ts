// The egress proxy: a phase's one way to the network beyond the model, run by the worker OUTSIDE the
// sandbox (the engine has no bridge: every sandbox has network none). An HTTP proxy on a Unix socket
// bind-mounted into the sandbox, reached through the forwarder on a loopback port as the model is.
// It serves plain HTTP in absolute form (`GET http://host/path`) and CONNECT host:port (HTTPS and
// any other TCP through a tunnel). Each request is decided by the phase's policy (the task's hosts,
// or any host for public) and then by the private-address guard (address-guard.ts) on the address
// the name resolves to, which is the address then connected to (no second lookup to rebind). Every
// decision is one JSON line of the episode's evidence (egress.jsonl): phase, method, host, port,
// allowed or refused and why, the address, the bytes each way, the time.
import { once } from 'node:events';
import dns from 'node:dns';
import { chmod, mkdir, open, rm, type FileHandle } from 'node:fs/promises';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import net from 'node:net';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { forbiddenAddress } from './address-guard.ts';
import { hostAllowed, isHostName, normalizeHost, type HostRule } from './host-rules.ts';
import type { EgressPhase } from './network-grant.ts';

/** File name of the egress decisions in an episode attempt's evidence folder. */
export const EGRESS_EVIDENCE_FILE = 'egress.jsonl';
/** The proxy's socket, beside the model's in the run folder bind-mounted into the sandbox. */
export const EGRESS_SOCKET_NAME = 'egress.sock';

export type EgressPolicy = { mode: 'allowlist'; rules: readonly HostRule[] } | { mode: 'public' };

export interface EgressProxyOptions {
  socketPath: string;
  phase: EgressPhase;
  policy: EgressPolicy;
  /** FLEET_EGRESS_HOSTS: names connected to these addresses, past the guard. */
  hostsMap: ReadonlyMap<string, string>;
  evidenceFile: string;
  episodeId: string;
  log: Logger;
  /** @default 10000 */
  connectTimeoutMs?: number;
  /** Connections open at once; more are refused (503). @default 64 */
  maxConnections?: number;
  /** Decisions written to the evidence; past it they are counted only. @default 10000 */
  maxEvidenceLines?: number;
  /** Name resolution (tests may give their own). @default dns.promises.lookup, every address */
  lookup?: (host: string) => Promise<string[]>;
}

export type RefusalReason = 'not_allowed' | 'private_address' | 'resolve_failed' | 'bad_request' | 'too_many_connections' | 'proxy_closing';

export interface EgressDecision {
  time: string;
  episodeId: string;
  phase: EgressPhase;
  method: string;
  host: string;
  port: number;
  decision: 'allowed' | 'refused';
  reason?: RefusalReason;
  /** The address connected to (or the one refused by the guard). */
  address?: string;
  /** The name was mapped by FLEET_EGRESS_HOSTS. */
  mapped?: boolean;
  /** Allowed, then the connection to the destination failed (refused, timed out, reset). */
  error?: string;
  /** Bytes from the sandbox to the destination, and back (a tunnel's raw bytes; plain HTTP's bodies). */
  bytesUp: number;
  bytesDown: number;
  durationMs: number;
}

export interface EgressStats {
  allowed: number;
  refused: number;
  open: number;
  /** Decisions past maxEvidenceLines, not written. */
  unlogged: number;
}

export interface EgressProxy {
  socketPath: string;
  stats(): EgressStats;
  /** Stop listening, end every connection, write their decisions, remove the socket. Idempotent. */
  close(): Promise<void>;
}

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** The status a refusal answers: the client's mistake, the policy's no, or a name that does not resolve. */
function statusOf(reason: RefusalReason): number {
  return reason === 'bad_request' ? 400 : reason === 'resolve_failed' ? 502 : reason === 'too_many_connections' || reason === 'proxy_closing' ? 503 : 403;
}

async function defaultLookup(host: string): Promise<string[]> {
  const found = await dns.promises.lookup(host, { all: true, verbatim: true });
  return found.map((a) => a.address);
}

/** `host:port` of a CONNECT (`[v6]:port` for IPv6). */
function connectTarget(authority: string | undefined): { host: string; port: number } | undefined {
  if (authority === undefined) return undefined;
  const m = /^\[([0-9a-fA-F:.]+)\]:(\d{1,5})$/.exec(authority) ?? /^([^:[\]/\s]+):(\d{1,5})$/.exec(authority);
  if (!m) return undefined;
  const port = Number(m[2]);
  return port >= 1 && port <= 65_535 ? { host: m[1]!, port } : undefined;
}

export async function startEgressProxy(opts: EgressProxyOptions): Promise<EgressProxy> {
  const { socketPath, phase, policy, hostsMap, episodeId } = opts;
  const connectTimeoutMs = opts.connectTimeoutMs ?? 10_000;
  const maxConnections = opts.maxConnections ?? 64;
  const maxLines = opts.maxEvidenceLines ?? 10_000;
  const lookup = opts.lookup ?? defaultLookup;
  const log = opts.log.child({ episodeId, phase, component: 'egress-proxy' });

  await mkdir(path.dirname(socketPath), { recursive: true, mode: 0o755 });
  await rm(socketPath, { force: true });
  await mkdir(path.dirname(opts.evidenceFile), { recursive: true });
  const evidence: FileHandle = await open(opts.evidenceFile, 'a', 0o644);
  let writing: Promise<unknown> = Promise.resolve();
  const stats: EgressStats = { allowed: 0, refused: 0, open: 0, unlogged: 0 };
  let lines = 0;
  const record = (d: EgressDecision) => {
    if (d.decision === 'allowed') stats.allowed++;
    else stats.refused++;
    if (lines >= maxLines) {
      stats.unlogged++;
      return;
    }
    lines++;
    const line = `${JSON.stringify(d)}\n`;
    writing = writing.then(() => evidence.write(line)).catch((err: unknown) => log.warn({ err: String(err) }, 'egress evidence not written'));
  };

  let closing = false;
  /** Every socket of the sandbox's side and of the destinations', ended at close. */
  const sockets = new Set<Duplex>();
  const track = (s: Duplex) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  };

  /** The decision for host:port: where to connect, or why not. */
  async function decide(rawHost: string, port: number): Promise<{ address: string; mapped: boolean } | { reason: RefusalReason; address?: string; detail: string }> {
    const host = normalizeHost(rawHost);
    if (!isHostName(host)) return { reason: 'bad_request', detail: `${JSON.stringify(rawHost.slice(0, 100))} is not a host name` };
    if (policy.mode === 'allowlist' && !hostAllowed(policy.rules, host, port)) return { reason: 'not_allowed', detail: `${host}:${port} is not in this phase's allowed_hosts` };
    const mapped = hostsMap.get(host);
    if (mapped !== undefined) return { address: mapped, mapped: true };
    let addresses: string[];
    try {
      addresses = net.isIP(host) !== 0 ? [host] : await lookup(host);
    } catch (err) {
      return { reason: 'resolve_failed', detail: `${host} did not resolve (${(err as NodeJS.ErrnoException).code ?? 'error'})` };
    }
    if (addresses.length === 0) return { reason: 'resolve_failed', detail: `${host} did not resolve` };
    // One forbidden address refuses the name: a name that mixes public and private addresses is not trusted.
    for (const address of addresses) {
      const why = forbiddenAddress(address);
      if (why !== undefined) return { reason: 'private_address', address, detail: `${host} resolves to ${why}` };
    }
    return { address: addresses[0]!, mapped: false };
  }

  const base = (method: string, host: string, port: number) => ({ time: new Date().toISOString(), episodeId, phase, method, host: normalizeHost(host).slice(0, 253), port });

  function refuseSocket(socket: Duplex, status: number, text: string) {
    const body = `egress refused: ${text}\n`;
    socket.end(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  }

  function refuseResponse(res: ServerResponse, status: number, text: string) {
    const body = `egress refused: ${text}\n`;
    res.writeHead(status, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body), connection: 'close' }).end(body);
  }

  /** Connect to address:port within the connect timeout. */
  function dial(address: string, port: number): Promise<net.Socket> {
    return new Promise((resolve, reject) => {
      const s = net.connect({ host: address, port });
      track(s);
      const timer = setTimeout(() => s.destroy(new Error(`connecting timed out after ${connectTimeoutMs} ms`)), connectTimeoutMs);
      s.once('connect', () => {
        clearTimeout(timer);
        s.off('error', reject);
        resolve(s);
      });
      s.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
    });
  }

  async function onConnect(req: IncomingMessage, client: Duplex, head: Buffer) {
    const started = performance.now();
    track(client);
    client.on('error', () => undefined);
    const target = connectTarget(req.url);
    if (target === undefined) {
      record({ ...base('CONNECT', String(req.url ?? '').slice(0, 100), 0), decision: 'refused', reason: 'bad_request', bytesUp: 0, bytesDown: 0, durationMs: 0 });
      return refuseSocket(client, 400, 'CONNECT takes host:port');
    }
    const at = base('CONNECT', target.host, target.port);
    if (closing || stats.open >= maxConnections) {
      const reason = closing ? 'proxy_closing' : 'too_many_connections';
      record({ ...at, decision: 'refused', reason, bytesUp: 0, bytesDown: 0, durationMs: 0 });
      return refuseSocket(client, 503, reason === 'proxy_closing' ? 'the phase is ending' : `more than ${maxConnections} connections at once`);
    }
    stats.open++;
    let up = head.length;
    let down = 0;
    let error: string | undefined;
    let decided: { address: string; mapped: boolean } | undefined;
    try {
      const d = await decide(target.host, target.port);
      if ('reason' in d) {
        record({ ...at, decision: 'refused', reason: d.reason, ...(d.address && { address: d.address }), bytesUp: 0, bytesDown: 0, durationMs: Math.round(performance.now() - started) });
        return refuseSocket(client, statusOf(d.reason), d.detail);
      }
      decided = d;
      const upstream = await dial(decided.address, target.port).catch((err: unknown) => {
        error = (err as Error).message;
        return undefined;
      });
      if (upstream === undefined || client.destroyed) {
        upstream?.destroy();
        if (!client.destroyed) refuseSocket(client, 502, `${at.host}:${at.port}: ${error ?? 'the client went away'}`);
        return;
      }
      upstream.on('error', (err) => (error ??= err.message));
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length > 0) upstream.write(head);
      client.on('data', (c: Buffer) => (up += c.length));
      upstream.on('data', (c: Buffer) => (down += c.length));
      client.pipe(upstream);
      upstream.pipe(client);
      await new Promise<void>((resolve) => {
        let left = 2;
        const one = () => (--left === 0 ? resolve() : undefined);
        client.once('close', () => { upstream.destroy(); one(); });
        upstream.once('close', () => { client.destroy(); one(); });
      });
    } finally {
      stats.open--;
      if (decided !== undefined) {
        record({
          ...at, decision: 'allowed', address: decided.address, ...(decided.mapped && { mapped: true }), ...(error !== undefined && { error }),
          bytesUp: up, bytesDown: down, durationMs: Math.round(performance.now() - started),
        });
      }
    }
  }

  async function onRequest(req: IncomingMessage, res: ServerResponse) {
    const started = performance.now();
    const method = (req.method ?? 'GET').slice(0, 16);
    let url: URL | undefined;
    try {
      url = /^http:\/\//i.test(req.url ?? '') ? new URL(req.url!) : undefined;
    } catch {
      url = undefined;
    }
    if (url === undefined || url.username !== '' || url.password !== '') {
      record({ ...base(method, '', 0), decision: 'refused', reason: 'bad_request', bytesUp: 0, bytesDown: 0, durationMs: 0 });
      return refuseResponse(res, 400, 'the proxy takes http://host/path (absolute form) or CONNECT host:port');
    }
    const port = url.port === '' ? 80 : Number(url.port);
    const at = base(method, url.hostname, port);
    if (closing || stats.open >= maxConnections) {
      const reason = closing ? 'proxy_closing' : 'too_many_connections';
      record({ ...at, decision: 'refused', reason, bytesUp: 0, bytesDown: 0, durationMs: 0 });
      return refuseResponse(res, 503, reason === 'proxy_closing' ? 'the phase is ending' : `more than ${maxConnections} connections at once`);
    }
    stats.open++;
    let up = 0;
    let down = 0;
    let error: string | undefined;
    let allowed: { address: string; mapped: boolean } | undefined;
    try {
      const d = await decide(url.hostname, port);
      if ('reason' in d) {
        record({ ...at, decision: 'refused', reason: d.reason, ...(d.address && { address: d.address }), bytesUp: 0, bytesDown: 0, durationMs: Math.round(performance.now() - started) });
        return refuseResponse(res, statusOf(d.reason), d.detail);
      }
      allowed = d;
      const headers: Record<string, string | string[]> = {};
      for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !HOP_BY_HOP.has(k)) headers[k] = v;
      headers.host = url.host;
      await new Promise<void>((resolve) => {
        const upstream = http.request({
          host: d.address, port, method, path: `${url.pathname}${url.search}`, headers, agent: false, setHost: false,
          timeout: connectTimeoutMs,
        });
        upstream.on('socket', (s) => track(s));
        upstream.on('timeout', () => upstream.destroy(new Error(`no answer within ${connectTimeoutMs} ms`)));
        upstream.on('error', (err) => {
          error ??= err.message;
          if (!res.headersSent) refuseResponse(res, 502, `${at.host}:${port}: ${err.message}`);
          else res.destroy();
          resolve();
        });
        upstream.on('response', (answer) => {
          // Relayed as it comes: a large download is never held whole in the worker.
          upstream.setTimeout(0);
          const out: Record<string, string | string[]> = {};
          for (const [k, v] of Object.entries(answer.headers)) if (v !== undefined && !HOP_BY_HOP.has(k)) out[k] = v;
          res.writeHead(answer.statusCode ?? 502, out);
          answer.on('data', (c: Buffer) => (down += c.length));
          answer.pipe(res);
          answer.once('end', () => resolve());
          answer.once('error', (err) => { error ??= err.message; res.destroy(); resolve(); });
          answer.once('close', () => resolve());
        });
        req.on('data', (c: Buffer) => (up += c.length));
        req.pipe(upstream);
        res.once('close', () => { upstream.destroy(); resolve(); });
      });
    } finally {
      stats.open--;
      if (allowed !== undefined) {
        record({
          ...at, decision: 'allowed', address: allowed.address, ...(allowed.mapped && { mapped: true }), ...(error !== undefined && { error }),
          bytesUp: up, bytesDown: down, durationMs: Math.round(performance.now() - started),
        });
      }
    }
  }

  const inFlight = new Set<Promise<void>>();
  const hold = (p: Promise<void>) => {
    inFlight.add(p);
    void p.finally(() => inFlight.delete(p));
    return p;
  };
  const server = http.createServer((req, res) => {
    track(req.socket);
    hold(onRequest(req, res)).catch((err: unknown) => {
      log.error({ err }, 'egress proxy request failed');
      if (!res.headersSent) refuseResponse(res, 500, 'internal error of the egress proxy');
    });
  });
  server.on('connection', (s: net.Socket) => track(s));
  server.on('connect', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    hold(onConnect(req, socket, head)).catch((err: unknown) => {
      log.error({ err }, 'egress proxy tunnel failed');
      socket.destroy();
    });
  });
  server.on('clientError', (_err, socket) => socket.destroy());
  server.listen(socketPath);
  await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]).catch(async (err: unknown) => {
    await evidence.close();
    throw err;
  });
  server.on('error', (err) => log.error({ err }, 'egress proxy server error'));
  // The forwarder inside runs as root; a worker that is not root cannot hand the socket to anyone, so
  // it is left open as the model's is (the folder is the episode's alone).
  await chmod(socketPath, process.getuid?.() === 0 ? 0o600 : 0o666);
  log.info({ socketPath, mode: policy.mode, hosts: policy.mode === 'allowlist' ? policy.rules.length : undefined }, 'egress proxy started');

  let closed: Promise<void> | undefined;
  return {
    socketPath,
    stats: () => ({ ...stats }),
    close() {
      closed ??= (async () => {
        closing = true;
        const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
        for (const s of sockets) s.destroy();
        server.closeAllConnections();
        await stopped;
        // Every handler's finally queues its line; one still resolving a name is not waited for past 5 s.
        const bound = new Promise((resolve) => setTimeout(resolve, 5_000).unref());
        await Promise.race([Promise.allSettled([...inFlight]), bound]);
        await writing;
        await evidence.close();
        await rm(socketPath, { force: true });
        log.info(stats, 'egress proxy closed');
      })();
      return closed;
    },
  };
}

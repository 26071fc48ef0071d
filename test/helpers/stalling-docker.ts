// A Docker engine that hangs on demand: a Unix-socket proxy in front of the real engine's socket that
// holds the requests a predicate picks (never forwarding them until released), and passes the rest.
import net from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createDocker, type Docker } from '../../src/sandbox/docker-client.ts';

export interface SeenRequest {
  method: string;
  /** The request path without the API version prefix (/v1.41), query included. */
  path: string;
  /** Date.now() when its head arrived. */
  at: number;
  held: boolean;
}

export type HoldPredicate = (method: string, path: string) => boolean;

export interface HeldRequest extends SeenRequest {
  /** The client hung up while the request was held (it was never forwarded). */
  abandonedAt?: number;
}

export interface StallingDocker {
  /** DOCKER_HOST of the proxy (unix://...). */
  host: string;
  /** A client of the proxy, for a worker. */
  docker: Docker;
  /** Every request seen, in order of arrival. */
  seen: SeenRequest[];
  /** Requests held so far (released, abandoned or still waiting). */
  held: HeldRequest[];
  /** Hold every later request matching the predicate; undefined holds nothing. */
  hold(predicate: HoldPredicate | undefined): void;
  /** Forward every request held now and hold nothing more. */
  releaseAll(): void;
  close(): Promise<void>;
}

const VERSION_PREFIX = /^\/v\d+(\.\d+)?(?=\/)/;
const MAX_HEAD = 64 * 1024;

/**
 * Start the proxy on a fresh socket. Each connection carries one request: its head is rewritten to
 * `Connection: close` (unless it is an upgrade, as exec and attach are), so keep-alive clients open a
 * new connection per request and a held request holds nothing else.
 */
export async function startStallingDocker(upstreamSocket = '/var/run/docker.sock'): Promise<StallingDocker> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-stall-'));
  const socketPath = path.join(dir, 'docker.sock');
  const sockets = new Set<net.Socket>();
  const waiting = new Set<() => void>();
  let predicate: HoldPredicate | undefined;

  const track = (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
  };

  const forward = (client: net.Socket, head: Buffer, rest: Buffer) => {
    if (client.destroyed) return;
    const upstream = net.connect({ path: upstreamSocket, allowHalfOpen: true });
    track(upstream);
    upstream.write(head);
    if (rest.length > 0) upstream.write(rest);
    client.pipe(upstream);
    upstream.pipe(client);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.resume();
  };

  const server = net.createServer({ allowHalfOpen: true }, (client) => {
    track(client);
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      const end = buffered.indexOf('\r\n\r\n');
      if (end < 0) {
        if (buffered.length > MAX_HEAD) client.destroy();
        return;
      }
      client.off('data', onData);
      client.pause();
      const lines = buffered.subarray(0, end).toString('latin1').split('\r\n');
      const rest = buffered.subarray(end + 4);
      const [method = '', target = ''] = lines[0]!.split(' ');
      const reqPath = target.replace(VERSION_PREFIX, '');
      const headers = lines.slice(1);
      const upgrade = headers.some((h) => /^connection:.*upgrade/i.test(h));
      const kept = upgrade ? headers : headers.filter((h) => !/^(connection|keep-alive):/i.test(h));
      if (!upgrade) kept.push('Connection: close');
      const head = Buffer.from([lines[0]!, ...kept, '', ''].join('\r\n'), 'latin1');
      const hold = predicate?.(method, reqPath) ?? false;
      const seen: SeenRequest = { method, path: reqPath, at: Date.now(), held: hold };
      proxy.seen.push(seen);
      if (!hold) {
        forward(client, head, rest);
        return;
      }
      const held: HeldRequest = { ...seen };
      proxy.held.push(held);
      const release = () => {
        waiting.delete(release);
        forward(client, head, rest);
      };
      waiting.add(release);
      client.on('close', () => {
        if (waiting.delete(release)) held.abandonedAt = Date.now();
      });
    };
    client.on('data', onData);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => resolve());
  });

  const proxy: StallingDocker = {
    host: `unix://${socketPath}`,
    docker: createDocker(`unix://${socketPath}`),
    seen: [],
    held: [],
    hold(p) {
      predicate = p;
    },
    releaseAll() {
      predicate = undefined;
      for (const release of [...waiting]) release();
    },
    async close() {
      predicate = undefined;
      waiting.clear();
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
      await rm(dir, { recursive: true, force: true });
    },
  };
  return proxy;
}

// A private redis-server for the demo and the tests when REDIS_URL is not set: loopback only, a free
// port, its own folder; stopped by whoever started it.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';

export interface PrivateRedis {
  url: string;
  port: number;
  dir: string;
  process: ChildProcess;
  stop(): Promise<void>;
}

/** A port that was free on 127.0.0.1 a moment ago. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

export interface PrivateRedisOptions {
  /** AOF with fsync on every write, as a production deployment would run. @default false */
  durable?: boolean;
  /** Reuse a folder (and its AOF) across restarts. */
  dir?: string;
  port?: number;
}

export async function startPrivateRedis(opts: PrivateRedisOptions = {}): Promise<PrivateRedis> {
  const dir = opts.dir ?? (await mkdtemp(path.join(os.tmpdir(), 'rf-redis-')));
  const port = opts.port ?? (await freePort());
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--maxmemory-policy', 'noeviction'];
  args.push(...(opts.durable ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no']));
  const child = spawn('redis-server', args, { stdio: 'ignore' });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const spawnError = new Promise<never>((_, reject) => child.once('error', (err) =>
    reject(new Error(`cannot start redis-server (${err.message}); run the README's set-up or set REDIS_URL`))));
  const url = `redis://127.0.0.1:${port}`;
  const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  probe.on('error', () => undefined);
  const ready = (async () => {
    for (let i = 0; i < 200; i++) {
      if (await probe.connect().then(() => probe.ping(), () => undefined)) return;
      probe.disconnect();
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error(`redis-server on port ${port} did not answer`);
  })();
  try {
    await Promise.race([ready, spawnError]);
  } finally {
    probe.disconnect();
  }
  return {
    url,
    port,
    dir,
    process: child,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      if (opts.dir === undefined) await rm(dir, { recursive: true, force: true });
    },
  };
}

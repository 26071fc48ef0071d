// An S3-compatible server for the tests: s3rver (s3-server-child.ts) in a process of its own, on a
// free loopback port, keeping its objects in a temp folder, with one bucket and a key pair made for
// it. Clients reach it through a TCP proxy in this process (`url`), which a test can make slow (it
// holds every connection, open ones included, passing no byte either way) or down (it stops
// listening: connections are refused, and open ones are cut), and bring back.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { execArgvFor } from '../../src/package-paths.ts';

export interface S3TestServer {
  /** The endpoint clients use (through the proxy): http://127.0.0.1:<port> */
  url: string;
  /** The server itself, past the proxy. */
  directUrl: string;
  bucket: string;
  accessKeyId: string;
  secretAccessKey: string;
  /** The AWS_* variables to give a worker (with FLEET_ARTIFACTS=s3://<bucket>/<prefix>). */
  env: Record<string, string>;
  /** Hold every connection, new and open: requests neither fail nor get an answer. */
  pause(): void;
  /** Connections the proxy has accepted while holding: a held request has arrived once this grows. */
  heldConnections(): number;
  /** Refuse new connections and cut the open ones. */
  down(): Promise<void>;
  /** Back to passing bytes (after pause or down). */
  resume(): Promise<void>;
  stop(): Promise<void>;
}

const CHILD = fileURLToPath(new URL('./s3-server-child.ts', import.meta.url));

export async function startS3Server(opts: { bucket?: string } = {}): Promise<S3TestServer> {
  const bucket = opts.bucket ?? 'fleet-test';
  const accessKeyId = `fleet-test-${randomBytes(4).toString('hex')}`;
  const secretAccessKey = `secret-${randomBytes(16).toString('hex')}`;
  const dir = await mkdtemp(path.join(os.tmpdir(), 'fleet-s3-'));
  const child = spawn(process.execPath, ['--openssl-legacy-provider', ...execArgvFor(CHILD), CHILD], {
    env: { ...process.env, S3_TEST_DIR: dir, S3_TEST_BUCKET: bucket, S3_TEST_KEY_ID: accessKeyId, S3_TEST_SECRET: secretAccessKey, NODE_NO_WARNINGS: '1' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  let upstreamPort: number;
  try {
    upstreamPort = await readPort(child, () => stderr);
  } catch (err) {
    child.kill('SIGKILL');
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  const proxy = new HoldingProxy(upstreamPort);
  const port = await proxy.listen(0);
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    directUrl: `http://127.0.0.1:${upstreamPort}`,
    bucket,
    accessKeyId,
    secretAccessKey,
    env: { AWS_ENDPOINT_URL_S3: url, AWS_REGION: 'us-east-1', AWS_ACCESS_KEY_ID: accessKeyId, AWS_SECRET_ACCESS_KEY: secretAccessKey },
    pause: () => proxy.hold(),
    heldConnections: () => proxy.heldAccepted,
    down: () => proxy.down(),
    resume: () => proxy.resume(),
    async stop() {
      await proxy.close();
      child.stdin!.end();
      if (child.exitCode === null && child.signalCode === null) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(() => child.kill('SIGKILL'), 3000);
          child.once('exit', () => {
            clearTimeout(t);
            resolve();
          });
        });
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function readPort(child: ChildProcess, stderr: () => string): Promise<number> {
  const lines = createInterface({ input: child.stdout! });
  return new Promise<number>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`the S3 test server did not start within 20s: ${stderr()}`)), 20_000);
    child.once('exit', (code, signal) => {
      clearTimeout(t);
      reject(new Error(`the S3 test server exited (${code ?? signal}) before it was ready: ${stderr()}`));
    });
    lines.once('line', (line) => {
      clearTimeout(t);
      try {
        resolve((JSON.parse(line) as { port: number }).port);
      } catch {
        reject(new Error(`the S3 test server said ${JSON.stringify(line)}: ${stderr()}`));
      }
    });
  });
}

type Mode = 'pass' | 'hold' | 'down';

/** A TCP proxy to 127.0.0.1:<upstream> that can hold its connections or refuse them. */
export class HoldingProxy {
  private server: net.Server | undefined;
  private port = 0;
  private mode: Mode = 'pass';
  private readonly pairs = new Set<{ client: net.Socket; upstream: net.Socket | undefined }>();

  constructor(private readonly upstreamPort: number) {}

  async listen(port: number): Promise<number> {
    const server = net.createServer((client) => this.accept(client));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => resolve());
    });
    this.server = server;
    this.port = (server.address() as net.AddressInfo).port;
    return this.port;
  }

  /** Connections accepted in hold mode, ever. */
  heldAccepted = 0;

  hold(): void {
    this.mode = 'hold';
    for (const pair of this.pairs) {
      if (pair.upstream === undefined) continue;
      pair.client.unpipe(pair.upstream);
      pair.upstream.unpipe(pair.client);
      pair.client.pause();
      pair.upstream.pause();
    }
  }

  async down(): Promise<void> {
    this.mode = 'down';
    for (const pair of this.pairs) this.cut(pair);
    await this.closeServer();
  }

  async resume(): Promise<void> {
    const was = this.mode;
    this.mode = 'pass';
    if (was === 'down') await this.listen(this.port);
    for (const pair of this.pairs) this.connect(pair);
  }

  async close(): Promise<void> {
    this.mode = 'down';
    for (const pair of this.pairs) this.cut(pair);
    await this.closeServer();
  }

  private accept(client: net.Socket): void {
    if (this.mode === 'down') {
      client.destroy();
      return;
    }
    const pair = { client, upstream: undefined as net.Socket | undefined };
    this.pairs.add(pair);
    if (this.mode === 'hold') this.heldAccepted += 1;
    client.pause();
    client.on('error', () => this.cut(pair));
    client.on('close', () => this.cut(pair));
    if (this.mode === 'pass') this.connect(pair);
  }

  /** Start (or restart, after a hold) passing bytes both ways. */
  private connect(pair: { client: net.Socket; upstream: net.Socket | undefined }): void {
    if (pair.upstream === undefined) {
      const upstream = net.connect(this.upstreamPort, '127.0.0.1');
      pair.upstream = upstream;
      upstream.on('error', () => this.cut(pair));
      upstream.on('close', () => this.cut(pair));
    }
    pair.client.pipe(pair.upstream);
    pair.upstream.pipe(pair.client);
    pair.client.resume();
    pair.upstream.resume();
  }

  private cut(pair: { client: net.Socket; upstream: net.Socket | undefined }): void {
    if (!this.pairs.delete(pair)) return;
    pair.client.destroy();
    pair.upstream?.destroy();
  }

  private async closeServer(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

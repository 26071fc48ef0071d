// A real image registry for tests: Debian's docker-registry (the distribution registry, 2.8) as its own
// process on a free loopback port with a temporary storage folder, never the package's service on
// :5000. Engines treat 127.0.0.0/8 registries as insecure-allowed, so plain HTTP works.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { openSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { waitFor } from './fleet.ts';

export interface TestRegistry {
  /** host:port, as FLEET_REGISTRY takes it. */
  address: string;
  /** Start again on the same port and storage (after stop). */
  start(): Promise<void>;
  /** SIGTERM the registry and wait for it to exit. */
  stop(): Promise<void>;
  /** Whether the registry holds the manifest `reference` (a tag or sha256 digest) of `repository`. */
  hasManifest(repository: string, reference: string): Promise<boolean>;
  /** The registry's log so far. */
  log(): Promise<string>;
  /** Stop it and remove its storage. */
  destroy(): Promise<void>;
}

async function freeLoopbackPort(): Promise<number> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as net.AddressInfo;
  server.close();
  await once(server, 'close');
  return port;
}

export async function startRegistry(): Promise<TestRegistry> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-registry-'));
  const port = await freeLoopbackPort();
  const address = `127.0.0.1:${port}`;
  const config = path.join(dir, 'config.yml');
  const logFile = path.join(dir, 'registry.log');
  await writeFile(config, [
    'version: 0.1',
    'log:',
    '  level: info',
    '  accesslog:',
    '    disabled: true',
    'storage:',
    '  filesystem:',
    `    rootdirectory: ${path.join(dir, 'storage')}`,
    '  delete:',
    '    enabled: true',
    'http:',
    `  addr: ${address}`,
    '',
  ].join('\n'));
  let proc: ChildProcess | undefined;
  const registry: TestRegistry = {
    address,
    async start() {
      const fd = openSync(logFile, 'a');
      proc = spawn('docker-registry', ['serve', config], { stdio: ['ignore', fd, fd] });
      const child = proc;
      let spawnError: Error | undefined;
      child.on('error', (err) => (spawnError = err));
      await waitFor('the registry to answer /v2/', async () => {
        if (spawnError) throw new Error(`docker-registry did not start (${spawnError.message}): Debian's docker-registry package provides it (.ci/setup-host.sh installs it)`);
        if (child.exitCode !== null) throw new Error(`docker-registry exited (${child.exitCode}): ${await readFile(logFile, 'utf8')}`);
        return fetch(`http://${address}/v2/`).then((r) => r.status === 200, () => false);
      }, 30_000, 100);
    },
    async stop() {
      if (proc === undefined || proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = once(proc, 'exit');
      proc.kill('SIGTERM');
      await exited;
    },
    async hasManifest(repository, reference) {
      const res = await fetch(`http://${address}/v2/${repository}/manifests/${reference}`, {
        method: 'HEAD',
        headers: { accept: 'application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json' },
      });
      return res.status === 200;
    },
    log: () => readFile(logFile, 'utf8').catch(() => ''),
    async destroy() {
      await registry.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
  await registry.start();
  return registry;
}

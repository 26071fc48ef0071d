// A second, private Docker engine (its own socket, data and exec roots, no bridge) for tests that stop
// and restart dockerd: the shared engine other test files use is never touched. Optionally on a data
// root that can enforce StorageOpt size (a sparse loop file formatted btrfs, for the disk quota test).
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { openSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { createDocker, type Docker } from '../../src/sandbox/docker-client.ts';
import { waitFor } from './fleet.ts';

const BUILD_IMAGE = fileURLToPath(new URL('../../.ci/build-sandbox-image.sh', import.meta.url));

export interface SecondEngine {
  host: string;
  docker: Docker;
  start(): Promise<void>;
  /** SIGTERM dockerd and wait for it to exit (its containers die with it). */
  stop(): Promise<void>;
  destroy(): Promise<void>;
}

export interface SecondEngineOptions {
  /**
   * Put the data root on a loop-mounted btrfs file system of this many MB (a sparse file) and run the
   * btrfs storage driver, which enforces `StorageOpt size` (qgroups). The xfs + pquota route of
   * overlay2 needs a kernel built with CONFIG_XFS_QUOTA, which this project's machines lack.
   */
  quotaDataRootMb?: number;
}

const run = promisify(execFile);

export async function createSecondEngine(opts: SecondEngineOptions = {}): Promise<SecondEngine> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-engine-'));
  const dataRoot = path.join(dir, 'data');
  const image = path.join(dir, 'data.img');
  if (opts.quotaDataRootMb !== undefined) {
    await run('truncate', ['-s', `${opts.quotaDataRootMb}M`, image]);
    await run('mkfs.btrfs', ['-q', image]);
    await mkdir(dataRoot);
    // -o loop attaches a free loop device, released again when the file system is unmounted.
    await run('mount', ['-o', 'loop', image, dataRoot]);
  }
  const socket = path.join(dir, 'docker.sock');
  const host = `unix://${socket}`;
  const docker = createDocker(host);
  let proc: ChildProcess | undefined;

  const engine: SecondEngine = {
    host,
    docker,
    async start() {
      const logFd = openSync(path.join(dir, 'dockerd.log'), 'a');
      proc = spawn('dockerd', [
        '--host', host, '--data-root', dataRoot, '--exec-root', path.join(dir, 'exec'),
        '--pidfile', path.join(dir, 'docker.pid'), '--bridge=none', '--iptables=false', '--ip-forward=false',
        ...(opts.quotaDataRootMb === undefined ? [] : ['--storage-driver', 'btrfs']),
      ], { stdio: ['ignore', logFd, logFd] });
      await waitFor('the second dockerd to answer', async () => docker.ping().then(() => true, () => false), 60_000, 200);
    },
    async stop() {
      if (proc === undefined || proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = once(proc, 'exit');
      proc.kill('SIGTERM');
      await exited;
    },
    async destroy() {
      await engine.stop();
      // A dockerd stopped with containers running can leave their mounts (overlay, shm) behind, and a
      // mounted folder cannot be removed: unmount what is left under the engine's folders first.
      const mounts = (await readFile('/proc/mounts', 'utf8')).split('\n').map((line) => line.split(' ')[1] ?? '')
        .filter((target) => target.startsWith(`${dir}/`)).sort((a, b) => b.length - a.length);
      for (const target of mounts) await run('umount', ['-l', target]).catch(() => undefined);
      // A lazy unmount releases the loop device only once the file system is no longer busy: detach
      // whatever is still attached to the image file so no loop device is left behind.
      if (opts.quotaDataRootMb !== undefined) {
        const { stdout } = await run('losetup', ['-j', image]).catch(() => ({ stdout: '' }));
        for (const device of stdout.split('\n').map((line) => line.split(':')[0] ?? '').filter(Boolean)) {
          await run('losetup', ['-d', device]).catch(() => undefined);
        }
      }
      await rm(dir, { recursive: true, force: true, maxRetries: 3 });
    },
  };
  await engine.start();
  await run('bash', [BUILD_IMAGE], { env: { ...process.env, DOCKER_HOST: host } });
  return engine;
}

// Runtime generations on the real engine and a private Redis: installed once per engine however many
// processes race for it, reused warm without a byte copied, a half-installed volume replaced and never
// used, stale generations removed, and node running from the read-only volume in a libc-less sandbox.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import { hashRuntimeInputs } from '../../src/runtime/build-archive.ts';
import { stopRuntimeBuilder } from '../../src/runtime/build-off-thread.ts';
import { runtimeLastUsedKey, runtimeLockKey } from '../../src/redis/redis-keys.ts';
import { forgetRuntimeCaches, prepareRuntime, type RuntimeDeps, type RuntimeGeneration } from '../../src/runtime/prepare-runtime.ts';
import { removeStaleGenerations } from '../../src/runtime/remove-stale-generations.ts';
import { defaultRuntimeInputs, READY_MARKER, RUNTIME_MOUNT_PATH, type RuntimeInput } from '../../src/runtime/runtime-inputs.ts';
import { runtimeVolumeLabels, runtimeVolumeName } from '../../src/runtime/runtime-volume.ts';
import { engineId } from '../../src/sandbox/docker-client.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { SandboxSession } from '../../src/sandbox/sandbox-session.ts';
import Docker from 'dockerode';
import { engineAddress, withVolumeContainer } from '../../src/sandbox/volumes.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import { docker, ROOT, silentLog, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';

let env: FleetEnv;
const prefixes: string[] = [];
/** A prefix of its own per test: its own volume names, lock keys and last-used hash. */
const newPrefix = (name: string) => {
  const prefix = `${env.prefix}-${name}`;
  prefixes.push(prefix);
  return prefix;
};
const depsFor = (prefix: string, log = silentLog): RuntimeDeps => ({ docker, redis: env.client, prefix, log });
const call = { timeoutMs: 30_000 };

/** Small inputs unique to this run, so tests never share a generation with anything else on the engine. */
async function fakeInputs(name: string): Promise<RuntimeInput[]> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-runtime-it-'));
  await writeFile(path.join(dir, 'data'), `${name} ${env.prefix}\n`.repeat(1000));
  return [
    { path: 'share/data', mode: 0o644, source: path.join(dir, 'data') },
    { path: 'bin/hello', mode: 0o755, content: `#!/bin/sh\necho hello ${name}\n` },
  ];
}

/** What the volume holds at its root (names only), read through a never-started container. */
async function volumeHas(volumeName: string, names: string[]): Promise<Record<string, boolean>> {
  const out: Record<string, boolean> = {};
  await withVolumeContainer(
    { docker, log: silentLog, callTimeoutMs: 30_000 },
    { volumeName, mountPath: '/v', image: DEFAULT_IMAGE, labels: { [LABEL.managed]: '1', [LABEL.runtimeRole]: 'probe', [LABEL.prefix]: env.prefix }, readOnly: true },
    async (c) => {
      for (const name of names) out[name] = await c.exists(name);
    },
  );
  return out;
}

async function tarOf(files: Record<string, string>): Promise<Buffer> {
  return tarBuffer((pack) => {
    for (const [name, content] of Object.entries(files)) pack.entry({ name, mode: 0o644 }, content);
  });
}

/** A volume as a worker killed mid-install leaves it: labelled, partly filled, no ready marker. */
async function halfInstall(prefix: string, generationId: string): Promise<string> {
  const volumeName = runtimeVolumeName(prefix, generationId);
  await docker.createVolume({ Name: volumeName, Labels: runtimeVolumeLabels(prefix, generationId) });
  await withVolumeContainer(
    { docker, log: silentLog, callTimeoutMs: 30_000 },
    { volumeName, mountPath: '/v', image: DEFAULT_IMAGE, labels: { [LABEL.managed]: '1', [LABEL.prefix]: prefix }, readOnly: false },
    async (c) => c.putArchive(await tarOf({ 'junk.txt': 'from a killed installer\n', 'bin/hello': 'truncat' })),
  );
  return volumeName;
}

/**
 * Counts installer containers created for a prefix from the engine's live event stream (the engine
 * keeps too few past events to ask afterwards on a busy shared machine).
 */
async function countInstalls(prefix: string): Promise<{ count: () => number; stop: () => void }> {
  const stream = (await docker.getEvents({
    filters: { type: ['container'], event: ['create'], label: [`${LABEL.runtimeRole}=install`, `${LABEL.prefix}=${prefix}`] },
  })) as Readable;
  let count = 0;
  stream.on('data', (chunk: Buffer) => (count += chunk.toString().split('\n').filter(Boolean).length));
  return { count: () => count, stop: () => stream.destroy() };
}

/** A pino logger whose lines the test can wait on. */
function capturingLog(): { log: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      lines.push(...chunk.toString().split('\n').filter(Boolean));
      cb();
    },
  });
  return { log: pino({ level: 'info' }, sink), lines };
}

interface Child {
  ready: Promise<void>;
  go(): void;
  result: Promise<RuntimeGeneration>;
}

function spawnPreparer(prefix: string, lockTtlMs?: number): Child & { kill(): void } {
  const args = [path.join(ROOT, 'test/helpers/prepare-runtime-child.ts'), env.redis.url, prefix, ...(lockTtlMs ? [String(lockTtlMs)] : [])];
  const child = spawn(process.execPath, ['--import', 'tsx', ...args], {
    cwd: ROOT,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  let onReady: () => void;
  const ready = new Promise<void>((resolve) => (onReady = resolve));
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
    if (out.startsWith('ready\n')) onReady();
  });
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const result = once(child, 'exit').then(([code]) => {
    if (code !== 0) throw new Error(`preparer exited ${String(code)}: ${err}`);
    return JSON.parse(out.split('\n')[1]!) as RuntimeGeneration;
  });
  return { ready, go: () => child.stdin.end('go\n'), result, kill: () => child.kill('SIGKILL') };
}

beforeAll(async () => {
  env = await startFleetEnv();
});

afterAll(async () => {
  await stopRuntimeBuilder();
  for (const prefix of [...prefixes, env.prefix]) {
    for (const c of await docker.listContainers({ all: true, filters: { label: [`${LABEL.prefix}=${prefix}`] } })) {
      await docker.getContainer(c.Id).remove({ force: true });
    }
    for (const v of (await docker.listVolumes({ filters: { label: [`${LABEL.prefix}=${prefix}`] } })).Volumes ?? []) {
      await docker.getVolume(v.Name).remove();
    }
  }
  await env?.close();
});

describe('runtime generations', () => {
  it('is installed exactly once when two worker processes cold-start it on the same engine', async () => {
    const prefix = newPrefix('race');
    const installs = await countInstalls(prefix);
    const children = [spawnPreparer(prefix), spawnPreparer(prefix)];
    await Promise.all(children.map((c) => c.ready));
    for (const c of children) c.go();
    const [a, b] = await Promise.all(children.map((c) => c.result));

    expect(a!.generationId).toBe(b!.generationId);
    expect(a!.volumeName).toBe(b!.volumeName);
    expect([a!.warm, b!.warm].sort()).toEqual([false, true]);
    const cold = a!.warm ? b! : a!;
    const warm = a!.warm ? a! : b!;
    expect(cold.bytesCopied).toBeGreaterThan(50_000_000);
    expect(warm.bytesCopied).toBe(0);
    // The engine's events are delivered asynchronously: wait until the (single) creation arrived.
    await waitFor('the installer creation event', async () => installs.count() >= 1);
    installs.stop();
    expect(installs.count()).toBe(1);
    expect(await volumeHas(cold.volumeName, [READY_MARKER, 'bin/node', 'bin/node.real'])).toEqual({
      [READY_MARKER]: true,
      'bin/node': true,
      'bin/node.real': true,
    });
    expect(await env.client.hget(runtimeLastUsedKey(prefix), cold.generationId)).toMatch(/^\d+$/);
    // No installer or probe container is left behind.
    expect(await docker.listContainers({ all: true, filters: { label: [`${LABEL.prefix}=${prefix}`] } })).toEqual([]);
  });

  it('runs node from the read-only volume in a busybox sandbox with no network', async () => {
    const prefix = newPrefix('sandbox');
    const generation = await prepareRuntime(depsFor(prefix), await defaultRuntimeInputs());
    expect(generation.mount).toEqual({ volumeName: generation.volumeName, target: RUNTIME_MOUNT_PATH });
    const owner = { fleet: env.prefix, episodeId: `runtime-${env.prefix}`, batchId: `runtime-${env.prefix}`, workerId: 'runtime-test', attempt: 1 };
    const session = await SandboxSession.open(
      { docker, log: silentLog, callTimeoutMs: 30_000 },
      { image: DEFAULT_IMAGE, workdir: '/workspace', limits: { memoryMb: 256, cpus: 1, pids: 64 }, owner, mounts: [generation.mount] },
      () => undefined,
    );
    try {
      const res = await session.exec(`${RUNTIME_MOUNT_PATH}/bin/node -e "console.log(6*7)"`, { timeoutMs: 30_000, capBytes: 4096 });
      expect(res.stderr.text).toBe('');
      expect(res.stdout.text).toBe('42\n');
      expect(res.exitCode).toBe(0);
      const write = await session.exec(`touch ${RUNTIME_MOUNT_PATH}/x; ls /lib* 2>&1; cat /proc/net/dev | tail -n +3 | cut -d: -f1`, { timeoutMs: 10_000, capBytes: 4096 });
      expect(write.stderr.text).toContain('Read-only file system');
      expect(write.stdout.text).toContain('No such file'); // the image has no libc of its own
      expect(write.stdout.text.trim().split('\n').at(-1)!.trim()).toBe('lo');
      const info = await docker.getContainer(session.containerId).inspect();
      expect(info.Mounts).toMatchObject([{ Type: 'volume', Name: generation.volumeName, Destination: RUNTIME_MOUNT_PATH, RW: false }]);
    } finally {
      await session.remove();
    }
  });

  it('reuses a ready generation warm: no byte copied, and fast once seen ready', async () => {
    const prefix = newPrefix('warm');
    const inputs = await fakeInputs('warm');
    const cold = await prepareRuntime(depsFor(prefix), inputs);
    expect(cold).toMatchObject({ warm: false });
    expect(cold.bytesCopied).toBeGreaterThan(0);
    // A fresh process finds it ready on the engine; later calls trust what they saw.
    forgetRuntimeCaches();
    const first = await prepareRuntime(depsFor(prefix), inputs);
    const again = await Promise.all([1, 2, 3].map(() => prepareRuntime(depsFor(prefix), inputs)));
    for (const g of [first, ...again]) expect(g).toMatchObject({ warm: true, bytesCopied: 0, volumeName: cold.volumeName });
    expect(Math.max(...again.map((g) => g.prepareMs))).toBeLessThan(100); // a few ms; loose for a loaded CI machine
    // Past the trust window one volume inspect re-checks it; a volume removed behind our back is installed again.
    expect(await prepareRuntime(depsFor(prefix), inputs, { trustReadyMs: 0 })).toMatchObject({ warm: true, bytesCopied: 0 });
    await docker.getVolume(cold.volumeName).remove();
    expect(await prepareRuntime(depsFor(prefix), inputs, { trustReadyMs: 0 })).toMatchObject({ warm: false, volumeName: cold.volumeName });
    // A changed input is a new generation, installed on its own.
    const changed = await prepareRuntime(depsFor(prefix), inputs.map((i) => (i.path === 'bin/hello' ? { ...i, mode: 0o644 as const } : i)));
    expect(changed.generationId).not.toBe(cold.generationId);
    expect(changed.warm).toBe(false);
  });

  it('shares one install between concurrent callers of one process', async () => {
    const prefix = newPrefix('flight');
    const inputs = await fakeInputs('flight');
    const installs = await countInstalls(prefix);
    const results = await Promise.all([1, 2, 3, 4].map(() => prepareRuntime(depsFor(prefix), inputs)));
    expect(results.filter((g) => !g.warm)).toHaveLength(1);
    expect(new Set(results.map((g) => g.volumeName)).size).toBe(1);
    await waitFor('the installer creation event', async () => installs.count() >= 1);
    installs.stop();
    expect(installs.count()).toBe(1);
  });

  it('installs through the main thread when the builder thread cannot reach the engine itself', async () => {
    const prefix = newPrefix('relay');
    const inputs = await fakeInputs('relay');
    // Custom headers (say, auth added by a proxy) are something the builder's own upload does not carry.
    const viaMain = new Docker({ ...(docker.modem as unknown as Docker.DockerOptions), headers: { 'X-Rollout-Fleet-Test': '1' } });
    expect(engineAddress(viaMain)).toBeUndefined();
    expect(engineAddress(docker)).toBeDefined();
    const generation = await prepareRuntime({ ...depsFor(prefix), docker: viaMain }, inputs);
    expect(generation.warm).toBe(false);
    expect(await volumeHas(generation.volumeName, [READY_MARKER, 'bin/hello', 'share/data'])).toEqual({ [READY_MARKER]: true, 'bin/hello': true, 'share/data': true });
    // Same generation, same bytes, whichever way they travelled.
    const direct = await prepareRuntime(depsFor(newPrefix('direct')), inputs);
    expect(direct.generationId).toBe(generation.generationId);
    expect(direct.bytesCopied).toBe(generation.bytesCopied);
  });

  it('replaces a half-installed volume instead of using it', async () => {
    const prefix = newPrefix('half');
    const inputs = await fakeInputs('half');
    const { generationId } = await hashRuntimeInputs(inputs);
    const volumeName = await halfInstall(prefix, generationId);
    expect(await volumeHas(volumeName, ['junk.txt', READY_MARKER])).toEqual({ 'junk.txt': true, [READY_MARKER]: false });

    const generation = await prepareRuntime(depsFor(prefix), inputs);
    expect(generation).toMatchObject({ generationId, volumeName, warm: false });
    expect(await volumeHas(volumeName, ['junk.txt', READY_MARKER, 'bin/hello', 'share/data'])).toEqual({
      'junk.txt': false,
      [READY_MARKER]: true,
      'bin/hello': true,
      'share/data': true,
    });
  });

  it('recovers from a worker killed mid-install: waits out its lock, then discards and reinstalls', async () => {
    const prefix = newPrefix('killed');
    const installs = await countInstalls(prefix);
    const victim = spawnPreparer(prefix, 2_000);
    await victim.ready;
    victim.go();
    await waitFor('the victim to start installing', async () => installs.count() >= 1);
    victim.kill();
    await expect(victim.result).rejects.toThrow(/preparer exited/);

    const { log, lines } = capturingLog();
    const generation = await prepareRuntime(depsFor(prefix, log), await defaultRuntimeInputs(), { pollMs: 20 });
    expect(generation.warm).toBe(false);
    expect(lines.some((l) => l.includes('discarding a half-installed runtime volume'))).toBe(true);
    expect(await volumeHas(generation.volumeName, [READY_MARKER, 'bin/node.real'])).toEqual({ [READY_MARKER]: true, 'bin/node.real': true });
    await waitFor('both installer creation events', async () => installs.count() >= 2);
    installs.stop();
    // The killed worker's installer container was removed with its half-filled volume.
    expect(await docker.listContainers({ all: true, filters: { label: [`${LABEL.prefix}=${prefix}`] } })).toEqual([]);
  });

  it('waits while another process holds the install lock, and repairs only once it is gone', async () => {
    const prefix = newPrefix('held');
    const inputs = await fakeInputs('held');
    const { generationId } = await hashRuntimeInputs(inputs);
    const volumeName = await halfInstall(prefix, generationId);
    const key = runtimeLockKey(prefix, await engineId(docker, call), generationId);
    await env.client.set(key, 'another-process', 'PX', 60_000);

    const { log, lines } = capturingLog();
    const preparing = prepareRuntime(depsFor(prefix, log), inputs, { pollMs: 20 });
    await waitFor('the preparation to wait for the lock', async () => lines.some((l) => l.includes('waiting for another process')));
    // Someone is (as far as Redis knows) installing: the volume is left alone.
    expect(await volumeHas(volumeName, ['junk.txt'])).toEqual({ 'junk.txt': true });
    await env.client.del(key);

    const generation = await preparing;
    expect(generation).toMatchObject({ warm: false, volumeName });
    expect(await volumeHas(volumeName, ['junk.txt', READY_MARKER])).toEqual({ 'junk.txt': false, [READY_MARKER]: true });
    expect(lines.some((l) => l.includes('discarding a half-installed runtime volume'))).toBe(true);
    expect(await env.client.exists(key)).toBe(0);
  });

  it('removes generations idle past the limit unless a container mounts them', async () => {
    const prefix = newPrefix('stale');
    const deps = depsFor(prefix);
    const [recent, stale, mounted] = await Promise.all(['recent', 'stale', 'mounted'].map(fakeInputs));
    const gens = { recent: await prepareRuntime(deps, recent!), stale: await prepareRuntime(deps, stale!), mounted: await prepareRuntime(deps, mounted!) };
    const hourMs = 3_600_000;
    const now = Date.now() + 2 * hourMs; // two hours from now, everything prepared so far is idle
    await env.client.hset(runtimeLastUsedKey(prefix), gens.recent.generationId, String(now - 60_000));
    const holder = await docker.createContainer({
      Image: DEFAULT_IMAGE,
      Cmd: ['true'],
      Labels: { [LABEL.managed]: '1', [LABEL.prefix]: prefix },
      HostConfig: { NetworkMode: 'none', Mounts: [{ Type: 'volume', Source: gens.mounted.volumeName, Target: RUNTIME_MOUNT_PATH, ReadOnly: true }] },
    });

    const first = await removeStaleGenerations(deps, { maxIdleMs: hourMs, nowMs: now });
    expect(first).toEqual({ removed: [gens.stale.volumeName], kept: 2 });
    expect(await env.client.hexists(runtimeLastUsedKey(prefix), gens.stale.generationId)).toBe(0);

    await holder.remove({ force: true });
    const second = await removeStaleGenerations(deps, { maxIdleMs: hourMs, nowMs: now });
    expect(second).toEqual({ removed: [gens.mounted.volumeName], kept: 1 });
    const left = (await docker.listVolumes({ filters: { label: [`${LABEL.prefix}=${prefix}`] } })).Volumes ?? [];
    expect(left.map((v) => v.Name)).toEqual([gens.recent.volumeName]);

    // A removed generation is installed again on its next preparation, not trusted from memory.
    expect(await prepareRuntime(deps, stale!)).toMatchObject({ warm: false, volumeName: gens.stale.volumeName });
  });
});

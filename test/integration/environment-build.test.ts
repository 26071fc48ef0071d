// Task environments built on the real engine with BuildKit and a private Redis: BuildKit-only syntax
// (COPY --chmod), one build per engine and digest however many callers race for it (counted from the
// engine's image tag events), a changed file built again, a failing Dockerfile a final error with its
// log and then remembered without a build, a hanging build stopped at its timeout with nothing
// tagged, an engine that drops the build retried as infrastructure, and the least recently used
// images pruned past a disk budget. Dockerfiles start FROM the stand-in base images
// (.ci/build-base-images.sh) and are tiny, so each build takes about a second.
import { createHash } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import {
  ensureEnvironmentImage,
  EnvironmentBuildError,
  environmentImageTag,
  type EnvironmentBuildDeps,
} from '../../src/environments/image-build.ts';
import { pruneEnvironmentImages } from '../../src/environments/prune-images.ts';
import { FleetError } from '../../src/errors/fleet-error.ts';
import { envBuildFailureKey, envLastUsedKey } from '../../src/redis/redis-keys.ts';
import { createDocker, engineId, type Docker } from '../../src/sandbox/docker-client.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { docker, silentLog, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';

const BASE = 'python:3.12-slim';
let env: FleetEnv;
const prefixes: string[] = [];
const newPrefix = (name: string) => {
  const prefix = `${env.prefix}-${name}`;
  prefixes.push(prefix);
  return prefix;
};
const depsFor = (prefix: string, engine: Docker = docker): EnvironmentBuildDeps => ({ docker: engine, redis: env.client, prefix, log: silentLog });

/** A build context of these files; the run's prefix is in the Dockerfile, so no other run shares its digest (BuildKit's step cache ignores LABEL, though). */
async function context(files: Record<string, string>): Promise<{ tar: Buffer; digest: string }> {
  const tar = await tarBuffer((pack) => {
    for (const [name, content] of Object.entries(files)) pack.entry({ name, mode: 0o644 }, content);
  });
  return { tar, digest: createHash('sha256').update(tar).digest('hex') };
}

const dockerfile = (lines: string[]) => [`FROM ${BASE}`, `LABEL test.run=${env.prefix}`, ...lines, ''].join('\n');

async function imageExists(image: string): Promise<boolean> {
  try {
    await docker.getImage(image).inspect();
    return true;
  } catch {
    return false;
  }
}

/**
 * The engine's image tag events, by name: BuildKit tags an image once, at the end of a successful
 * build, so one event per build. `settled()` tags a sentinel and waits for its event, so every event
 * before it has been seen.
 */
async function tagEvents() {
  const names: string[] = [];
  const stream = (await docker.getEvents({ filters: { type: ['image'], event: ['tag'] } } as object)) as NodeJS.ReadableStream & { destroy(): void };
  let pending = '';
  stream.on('data', (chunk: Buffer) => {
    pending += chunk.toString('utf8');
    let nl: number;
    while ((nl = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, nl);
      pending = pending.slice(nl + 1);
      if (line.trim()) names.push((JSON.parse(line) as { Actor: { Attributes: { name?: string } } }).Actor.Attributes.name ?? '');
    }
  });
  let sentinels = 0;
  return {
    count: (image: string) => names.filter((n) => n === image).length,
    async settled() {
      const sentinel = `rollout-fleet-test/sentinel:${env.prefix}-${++sentinels}`;
      const [repo, tag] = sentinel.split(':') as [string, string];
      await docker.getImage(BASE).tag({ repo, tag });
      await waitFor(`the tag event of ${sentinel}`, async () => names.includes(sentinel), 30_000, 20);
      await docker.getImage(sentinel).remove();
    },
    stop: () => stream.destroy(),
  };
}

beforeAll(async () => {
  if (!(await imageExists(BASE))) throw new Error(`${BASE} is not on the engine: run bash .ci/build-base-images.sh`);
  env = await startFleetEnv();
});

afterAll(async () => {
  const images = await docker.listImages({ filters: { label: [`${LABEL.envPrefix}`] } } as object);
  for (const img of images) {
    if (!prefixes.includes(img.Labels?.[LABEL.envPrefix] ?? '')) continue;
    for (const tag of img.RepoTags ?? []) await docker.getImage(tag).remove().catch(() => undefined);
  }
  await env?.close();
});

describe('environment images', () => {
  it('builds BuildKit-only syntax (COPY --chmod) with no network, labelled, and finds it again with no build', async () => {
    const prefix = newPrefix('chmod');
    const { tar, digest } = await context({
      Dockerfile: dockerfile([
        'COPY --chmod=755 run.sh /usr/local/bin/run.sh',
        // Network none: no interface but loopback; the mode is printed into the log.
        'RUN stat -c "mode=%a" /usr/local/bin/run.sh && ls /sys/class/net | tr "\\n" " " && echo',
      ]),
      // The run's prefix in a copied file: BuildKit's cache keys ignore LABEL, so without it the RUN
      // step of an earlier run on this engine would be CACHED and print nothing.
      'run.sh': `#!/bin/sh\necho hi ${env.prefix}\n`,
    });
    const first = await ensureEnvironmentImage(depsFor(prefix), { context: tar, digest, timeoutSec: 120 });
    expect(first).toMatchObject({ image: environmentImageTag(digest), built: true, digest });
    expect(first.image).toBe(`rollout-fleet/env:${digest.slice(0, 24)}`);
    expect(first.log).toContain('mode=755');
    expect(first.log).toMatch(/#\d+ lo \n/);
    expect(first.log).toContain('COPY --chmod=755 run.sh');
    const info = await docker.getImage(first.image).inspect();
    expect(info.Id).toBe(first.imageId);
    expect(info.Config.Labels).toMatchObject({ [LABEL.envDigest]: digest, [LABEL.envPrefix]: prefix, 'test.run': env.prefix });
    expect(Date.parse(info.Config.Labels![LABEL.envBuiltAt]!)).toBeGreaterThan(Date.now() - 300_000);
    // Never the labels the reaper takes containers by: containers inherit their image's labels.
    expect(info.Config.Labels![LABEL.managed]).toBeUndefined();
    expect(info.Config.Labels![LABEL.fleet]).toBeUndefined();

    const again = await ensureEnvironmentImage(depsFor(prefix), { context: () => { throw new Error('the context must not be read'); }, digest, timeoutSec: 120 });
    expect(again).toMatchObject({ image: first.image, imageId: first.imageId, built: false });
    const engine = await engineId(docker, { timeoutMs: 30_000 });
    expect(Number(await env.client.hget(envLastUsedKey(prefix, engine), first.image))).toBeGreaterThan(Date.now() - 60_000);
  });

  it('builds once for concurrent callers in one process and across processes; a changed file builds again', async () => {
    const prefix = newPrefix('once');
    const events = await tagEvents();
    try {
      const files = { Dockerfile: dockerfile(['COPY data.txt /data.txt', 'RUN cat /data.txt']), 'data.txt': 'one\n' };
      const { tar, digest } = await context(files);
      // Two engine clients stand for two processes (the in-process single flight is per client):
      // they meet at the Redis lock. Three callers on the first client share its one flight.
      const other = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
      const waits: string[] = [];
      const spec = { context: tar, digest, timeoutSec: 120 };
      // The caller that starts the flight gives up early: the build the others wait for goes on.
      const quitter = ensureEnvironmentImage(depsFor(prefix), spec, { signal: AbortSignal.timeout(50) }).catch((e: unknown) => e);
      const results = await Promise.all([
        ...[1, 2, 3].map(() => ensureEnvironmentImage(depsFor(prefix), spec, { pollMs: 20, onWait: (w) => waits.push(w.builder) })),
        ...[1, 2].map(() => ensureEnvironmentImage(depsFor(prefix, other), spec, { pollMs: 20, onWait: (w) => waits.push(w.builder) })),
      ]);
      expect((await quitter) as Error).toMatchObject({ name: 'TimeoutError' });
      // Whichever flight took the lock built it (most likely the quitter's): at most one of these did.
      expect(results.filter((r) => r.built).length).toBeLessThanOrEqual(1);
      expect(new Set(results.map((r) => r.imageId)).size).toBe(1);
      expect(waits.length).toBeGreaterThanOrEqual(4);
      await events.settled();
      expect(events.count(environmentImageTag(digest))).toBe(1);

      const changed = await context({ ...files, 'data.txt': 'two\n' });
      expect(changed.digest).not.toBe(digest);
      const rebuilt = await ensureEnvironmentImage(depsFor(prefix), { context: changed.tar, digest: changed.digest, timeoutSec: 120 });
      expect(rebuilt.built).toBe(true);
      expect(rebuilt.log).toContain('#');
      expect(rebuilt.image).not.toBe(results[0]!.image);
      await events.settled();
      expect(events.count(rebuilt.image)).toBe(1);
      expect(events.count(environmentImageTag(digest))).toBe(1);
    } finally {
      events.stop();
    }
  });

  it('fails a broken Dockerfile as the task\'s error with its log, then from memory without building', async () => {
    const prefix = newPrefix('broken');
    const { tar, digest } = await context({ Dockerfile: dockerfile(['RUN echo "the step before fails" && exit 3']) });
    const err = await ensureEnvironmentImage(depsFor(prefix), { context: tar, digest, timeoutSec: 120 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(EnvironmentBuildError);
    const failure = err as EnvironmentBuildError;
    expect(failure.code).toBe('environment_build_failed');
    expect(failure.outcome).toEqual({ kind: 'invalid', retry: false });
    expect(failure.remembered).toBe(false);
    expect(failure.message).toContain('exit code: 3');
    expect(failure.buildLog).toContain('the step before fails');
    expect(failure.buildLog).toMatch(/ERROR: .*exit code: 3/);
    expect(await imageExists(environmentImageTag(digest))).toBe(false);

    // Another "process" (its own engine client): no build, the remembered failure and its log.
    let contextRead = false;
    const other = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
    const again = await ensureEnvironmentImage(depsFor(prefix, other), {
      context: () => {
        contextRead = true;
        return tar;
      },
      digest,
      timeoutSec: 120,
    }).catch((e: unknown) => e);
    expect(again).toBeInstanceOf(EnvironmentBuildError);
    expect((again as EnvironmentBuildError).code).toBe('environment_build_failed');
    expect((again as EnvironmentBuildError).remembered).toBe(true);
    expect((again as EnvironmentBuildError).buildLog).toContain('the step before fails');
    expect(contextRead).toBe(false);
  });

  it('aborts a hanging build at its timeout and leaves no image under the tag', async () => {
    const prefix = newPrefix('hang');
    // A duration of its own, so the step's process can be told from any other sleep on the host.
    const seconds = 600 + Math.floor(Math.random() * 300);
    const { tar, digest } = await context({ Dockerfile: dockerfile(['RUN echo started', `RUN sleep ${seconds}`]) });
    const started = Date.now();
    const err = await ensureEnvironmentImage(depsFor(prefix), { context: tar, digest, timeoutSec: 5 }).catch((e: unknown) => e);
    const elapsed = Date.now() - started;
    expect(err).toBeInstanceOf(EnvironmentBuildError);
    expect((err as FleetError).code).toBe('environment_build_timeout');
    expect((err as FleetError).outcome.retry).toBe(false);
    expect((err as EnvironmentBuildError).buildLog).toContain(`sleep ${seconds}`);
    expect(elapsed).toBeGreaterThanOrEqual(5000);
    expect(elapsed).toBeLessThan(20_000);
    expect(await imageExists(environmentImageTag(digest))).toBe(false);
    // The engine cancelled the step: its process goes away.
    await waitFor('the build step to be killed', async () => !(await processRunning(`sleep ${seconds}`)), 30_000);
    expect(await imageExists(environmentImageTag(digest))).toBe(false);
  });

  it('retries an engine that drops the build mid-way as infrastructure, remembering nothing', async () => {
    const prefix = newPrefix('dropped');
    const proxy = await droppingProxy();
    try {
      const { tar, digest } = await context({ Dockerfile: dockerfile(['RUN echo started && sleep 30']) });
      const err = await ensureEnvironmentImage(depsFor(prefix, proxy.docker), { context: tar, digest, timeoutSec: 120 }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(FleetError);
      expect(err).not.toBeInstanceOf(EnvironmentBuildError);
      expect((err as FleetError).code).toBe('environment_build_interrupted');
      expect((err as FleetError).outcome).toEqual({ kind: 'infra', retry: true });
      expect(proxy.dropped()).toBe(1);
      expect(await imageExists(environmentImageTag(digest))).toBe(false);
      const engine = await engineId(docker, { timeoutMs: 30_000 });
      expect(await env.client.get(envBuildFailureKey(prefix, engine, digest))).toBeNull();
      // Nothing remembered: the next try builds (here on the real engine, with a step that passes quickly).
      const fixed = await context({ Dockerfile: dockerfile(['RUN echo started']) });
      const ok = await ensureEnvironmentImage(depsFor(prefix), { context: fixed.tar, digest, timeoutSec: 120 });
      expect(ok.built).toBe(true);
    } finally {
      await proxy.close();
    }
  });

  it('removes the least recently used images past the disk budget', async () => {
    const prefix = newPrefix('prune');
    const engine = await engineId(docker, { timeoutMs: 30_000 });
    const built = [];
    for (const name of ['a', 'b', 'c']) {
      // 200 kB of its own (random) bytes each, so every image holds layers of its own.
      const { tar, digest } = await context({ Dockerfile: dockerfile([`RUN head -c 200000 /dev/urandom > /blob-${name}`]) });
      built.push(await ensureEnvironmentImage(depsFor(prefix), { context: tar, digest, timeoutSec: 120 }));
    }
    const [a, b, c] = built as [(typeof built)[0], (typeof built)[0], (typeof built)[0]];
    // Used in the order b (longest ago), a, c.
    const now = Date.now();
    await env.client.hset(envLastUsedKey(prefix, engine), b.image, String(now - 30_000), a.image, String(now - 20_000), c.image, String(now - 10_000));
    const deps = { docker, redis: env.client, prefix, log: silentLog };

    // Three workers pruning at once on one engine: it answers one disk usage at a time and refuses the
    // others meanwhile ("a disk usage operation is already running"); each asks again, none fails.
    const prune = () => pruneEnvironmentImages(deps, { budgetBytes: 10 * 2 ** 30, minIdleMs: 0 });
    const [none, ...others] = await Promise.all([prune(), prune(), prune()]);
    expect(none.removed).toEqual([]);
    expect(others.map((o) => o.removed)).toEqual([[], []]);
    expect(none.keptBytes).toBeGreaterThanOrEqual(3 * 200_000);
    // Recently used images stay whatever the budget.
    expect((await pruneEnvironmentImages(deps, { budgetBytes: 0, minIdleMs: 60_000 })).removed).toEqual([]);

    const one = await pruneEnvironmentImages(deps, { budgetBytes: none.keptBytes - 1, minIdleMs: 0 });
    expect(one.removed).toEqual([b.image]);
    expect(await imageExists(b.image)).toBe(false);
    expect(await imageExists(a.image)).toBe(true);
    expect(await imageExists(c.image)).toBe(true);
    expect(await env.client.hexists(envLastUsedKey(prefix, engine), b.image)).toBe(0);

    // A container still using the least recently used image keeps it: the next one goes instead.
    const holder = await docker.createContainer({ Image: a.image, Cmd: ['true'], Labels: { 'test.run': env.prefix } });
    try {
      const two = await pruneEnvironmentImages(deps, { budgetBytes: one.keptBytes - 1, minIdleMs: 0 });
      expect(two.removed).toEqual([c.image]);
      expect(await imageExists(a.image)).toBe(true);
    } finally {
      await holder.remove({ force: true });
    }
  });
});

/** Whether a process with exactly this command line runs on the host (BuildKit's steps are host processes). */
async function processRunning(cmdline: string): Promise<boolean> {
  for (const pid of await readdir('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const cmd = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    if (cmd.split('\0').filter(Boolean).join(' ') === cmdline) return true;
  }
  return false;
}

/**
 * A Unix-socket proxy to the real engine that cuts both sides of a build request once the engine has
 * started answering it (a daemon restart or a network cut mid-build, as the client sees it).
 */
async function droppingProxy(): Promise<{ docker: Docker; dropped: () => number; close: () => Promise<void> }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-drop-'));
  const socketPath = path.join(dir, 'docker.sock');
  const upstreamPath = new URL(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock').pathname;
  let dropped = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(upstreamPath);
    sockets.add(client).add(upstream);
    let isBuild = false;
    client.on('data', (chunk) => {
      if (/^POST \S*\/build\?/.test(chunk.toString('latin1', 0, 200))) isBuild = true;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      client.write(chunk);
      // The first bytes of a build's answer: cut it there.
      if (isBuild) {
        dropped++;
        isBuild = false;
        client.destroy();
        upstream.destroy();
      }
    });
    for (const s of [client, upstream]) s.on('error', () => undefined);
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  return {
    docker: createDocker(`unix://${socketPath}`),
    dropped: () => dropped,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

// Prepared images on the real engine: what every sandbox of a kind starts with, committed once over
// the task's image, so that no sandbox needs a put of it. The image must be its base as the task
// wrote it (ENTRYPOINT, USER, env, labels), with the files as their tar says and nothing else changed;
// made once per engine; made again when pruned under a process; and pruned once no container uses it.
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type Docker from 'dockerode';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import { pruneEnvironmentImages } from '../../src/environments/prune-images.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { PREPARED_IMAGE_REPOSITORY, forgetPreparedImage, prepareContainerPrefix, preparedImage, preparedImageTag } from '../../src/sandbox/prepared-images.ts';
import { SandboxSession } from '../../src/sandbox/sandbox-session.ts';
import { SANDBOX_USER } from '../../src/sandbox/sandbox-user.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import { docker, silentLog, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';

const run = randomBytes(4).toString('hex');
const prefix = `prepared-${run}`;
const BASE = `rollout-fleet/test-prepared-base:${run}`;
const opts = { prefix, timeoutMs: 30_000, log: silentLog };
const deps = { docker, log: silentLog, callTimeoutMs: 30_000 };
const owner = (n: number) => ({ fleet: prefix, episodeId: `prepared-${run}-${n}`, batchId: `prepared-${run}`, workerId: 'prepared-test', attempt: 1 });
const user = { uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid };

/** The sandbox user's /tests and /workspace, and a file of its own, 0640. */
const files = (marker: string) => tarBuffer((pack) => {
  pack.entry({ ...user, name: 'tests/', type: 'directory', mode: 0o755 });
  pack.entry({ ...user, name: 'workspace/', type: 'directory', mode: 0o755 });
  pack.entry({ ...user, name: 'workspace/a.txt', type: 'file', mode: 0o640 }, `${marker}\n`);
});

async function imageIdOrUndefined(ref: string): Promise<string | undefined> {
  return docker.getImage(ref).inspect().then((i) => i.Id, () => undefined);
}

describe('prepared images', () => {
  let env: FleetEnv;
  let baseId: string;
  const sessions: SandboxSession[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    // A base with a config of its own to keep: ENTRYPOINT, USER, env and a label (the legacy builder, offline).
    const context = await tarBuffer((pack) => pack.entry({ name: 'Dockerfile', mode: 0o644 }, [
      `FROM ${DEFAULT_IMAGE}`,
      'ENTRYPOINT ["/bin/sh", "-c", "exec \\"$@\\"", "--"]',
      'USER 1000:1000',
      'ENV PREPARED_TEST=kept',
      `LABEL test.run=${run}`,
      '',
    ].join('\n')));
    const stream = await docker.buildImage(Readable.from([context]), { t: BASE, networkmode: 'none' } as Docker.ImageBuildOptions);
    await new Promise<void>((resolve, reject) => docker.modem.followProgress(stream, (err: Error | null) => (err ? reject(err) : resolve())));
    baseId = (await docker.getImage(BASE).inspect()).Id;
  }, 120_000);

  afterAll(async () => {
    await Promise.allSettled(sessions.map((s) => s.remove()));
    const mine = await docker.listImages({ filters: { label: [`${LABEL.preparedPrefix}=${prefix}`] } });
    await Promise.allSettled(mine.map((i) => docker.getImage(i.Id).remove({ force: true })));
    await docker.getImage(BASE).remove({ force: true }).catch(() => undefined);
    await env?.close();
  });

  it('is its base with the files as their tar says: the config kept, / untouched, made once per engine', async () => {
    const tar = await files('one');
    const id = await preparedImage(docker, baseId, tar, opts);
    const image = await docker.getImage(id).inspect();
    const base = await docker.getImage(baseId).inspect();
    expect(image.Parent).toBe(baseId);
    expect(image.RepoTags).toEqual([preparedImageTag(baseId, tar)]);
    expect(preparedImageTag(baseId, tar).startsWith(`${PREPARED_IMAGE_REPOSITORY}:`)).toBe(true);
    // The base's config as the task wrote it; the one label added is the fleet's prefix.
    expect(image.Config.Entrypoint).toEqual(base.Config.Entrypoint);
    expect(image.Config.User).toBe('1000:1000');
    expect(image.Config.Env).toEqual(base.Config.Env);
    expect(image.Config.WorkingDir).toBe(base.Config.WorkingDir);
    expect(image.Config.Labels).toEqual({ ...base.Config.Labels, [LABEL.preparedPrefix]: prefix });

    // A sandbox of it: the files there as the tar says, / and /bin still root's.
    const session = await SandboxSession.open(deps, { image: BASE, workdir: '/workspace', limits: { memoryMb: 64, cpus: 0.5, pids: 32 }, owner: owner(1), filesInImage: tar }, () => undefined);
    sessions.push(session);
    expect(session.imageId).toBe(baseId);
    const container = await docker.getContainer(session.containerId).inspect();
    expect(container.Image).toBe(id);
    // Created from it, the sandbox carries its own labels, not the commit container's (which had none).
    expect(container.Config.Labels[LABEL.episode]).toBe(owner(1).episodeId);
    const stat = await session.exec('stat -c "%n %u:%g %a" / /bin /tests /workspace /workspace/a.txt && cat /workspace/a.txt', { timeoutMs: 10_000, capBytes: 4096 });
    expect(stat.exitCode, stat.stderr.text).toBe(0);
    expect(stat.stdout.text.split('\n')).toEqual([
      '/ 0:0 755', '/bin 0:0 755', `/tests ${user.uid}:${user.gid} 755`, `/workspace ${user.uid}:${user.gid} 755`, `/workspace/a.txt ${user.uid}:${user.gid} 640`, 'one', '',
    ]);

    // Another process (nothing remembered) finds it on the engine: the same image, no second one.
    forgetPreparedImage(docker, baseId, tar);
    expect(await preparedImage(docker, baseId, tar, opts)).toBe(id);
    const tagged = await docker.listImages({ filters: { reference: [`${PREPARED_IMAGE_REPOSITORY}:*`], label: [`${LABEL.preparedPrefix}=${prefix}`] } });
    expect(tagged.map((i) => i.Id)).toEqual([id]);
    // Other files over the same base are another image.
    expect(await preparedImage(docker, baseId, await files('two'), opts)).not.toBe(id);
  });

  it('is made again when it was removed under a process that remembers it', async () => {
    const tar = await files('again');
    const spec = { image: BASE, workdir: '/workspace', limits: { memoryMb: 64, cpus: 0.5, pids: 32 }, filesInImage: tar };
    const first = await SandboxSession.open(deps, { ...spec, owner: owner(2) }, () => undefined);
    const firstImage = (await docker.getContainer(first.containerId).inspect()).Image;
    await first.remove();
    // Pruned meanwhile (this process still remembers the id).
    await docker.getImage(firstImage).remove();
    const second = await SandboxSession.open(deps, { ...spec, owner: owner(3) }, () => undefined);
    sessions.push(second);
    const secondImage = (await docker.getContainer(second.containerId).inspect()).Image;
    expect(secondImage).not.toBe(firstImage);
    expect(await imageIdOrUndefined(preparedImageTag(baseId, tar))).toBe(secondImage);
    const read = await second.exec('cat /workspace/a.txt', { timeoutMs: 10_000, capBytes: 4096 });
    expect(read.stdout.text).toBe('again\n');
  });

  it('is pruned once no container uses it, with a commit container a killed process left; one in use, another fleet\'s and a task image that carries the label stay', async () => {
    const used = await preparedImage(docker, baseId, await files('used'), opts);
    const unused = await preparedImage(docker, baseId, await files('unused'), opts);
    const otherFleet = await preparedImage(docker, baseId, await files('other'), { ...opts, prefix: `${prefix}-other` });
    // A task's own image that carries the label (a Dockerfile may say anything) under a name of its own: not a prepared image.
    const impostorFiles = await files('impostor');
    const impostorId = await preparedImage(docker, baseId, impostorFiles, opts);
    const impostor = `rollout-fleet/test-prepared-impostor:${run}`;
    await docker.getImage(impostorId).tag({ repo: impostor.split(':')[0]!, tag: run });
    await docker.getImage(preparedImageTag(baseId, impostorFiles)).remove(); // only untags: the other name stays
    forgetPreparedImage(docker, baseId, impostorFiles);
    const holder = await docker.createContainer({ Image: used, Cmd: ['true'], Labels: { 'test.run': run } });
    // What a process killed between its commit container's create and removal leaves: never started, named, no label.
    const left = await docker.createContainer({ name: `${prepareContainerPrefix(prefix)}left-${run}`, Image: baseId, Cmd: ['true'] });
    // Another fleet's, as old: not this fleet's to remove.
    const othersLeft = await docker.createContainer({ name: `${prepareContainerPrefix(`${prefix}-other`)}left-${run}`, Image: baseId, Cmd: ['true'] });
    try {
      const pruneDeps = { docker, redis: env.client, prefix, log: silentLog };
      // Made a moment ago: a process may be about to create from it.
      await pruneEnvironmentImages(pruneDeps, { budgetBytes: 10 * 2 ** 30, minIdleMs: 60_000, leftPrepareMs: 60_000 });
      expect(await imageIdOrUndefined(unused)).toBe(unused);
      expect((await docker.getContainer(left.id).inspect()).Id).toBe(left.id);
      await pruneEnvironmentImages(pruneDeps, { budgetBytes: 10 * 2 ** 30, minIdleMs: 0, leftPrepareMs: 0 });
      expect(await imageIdOrUndefined(unused)).toBeUndefined();
      expect(await imageIdOrUndefined(used)).toBe(used);
      expect(await imageIdOrUndefined(otherFleet)).toBe(otherFleet);
      expect(await imageIdOrUndefined(impostor)).toBe(impostorId);
      // The left commit container went; the holder (another name, a container in use of an image) stays.
      expect(await docker.getContainer(left.id).inspect().then(() => 'there', () => 'gone')).toBe('gone');
      expect((await docker.getContainer(holder.id).inspect()).Id).toBe(holder.id);
      expect((await docker.getContainer(othersLeft.id).inspect()).Id).toBe(othersLeft.id);
    } finally {
      await docker.getImage(impostorId).remove({ force: true }).catch(() => undefined);
      await holder.remove({ force: true });
      await left.remove({ force: true }).catch(() => undefined);
      await othersLeft.remove({ force: true });
      await docker.getImage(otherFleet).remove({ force: true }).catch(() => undefined);
    }
  });
});

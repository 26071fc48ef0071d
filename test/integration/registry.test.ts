// Harbor environments across hosts through a registry (FLEET_REGISTRY): a real registry (Debian's
// docker-registry, the distribution registry, as its own process on a loopback port with a temporary
// storage folder) and two engines on this machine (the shared one and a private second dockerd, each
// with its own worker process). Host A builds an environment and pushes it; host B pulls it by its
// manifest digest and runs an episode of the same task without building (the same image id, A's
// build time in its labels, B's worker log has no build); asked at once on both engines, one builds
// and the other waits and pulls (and pruning frees an image a killed push left a registry name on);
// a failed Dockerfile is remembered for the fleet; `prepare` builds once and the other host pulls
// (a separate verifier's image too); with the registry away host B builds its own, says so in its
// log, and the episode still passes. Dockerfiles start FROM the busybox sandbox image both engines
// have and are tiny.
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import { ENV_IMAGE_REPOSITORY, EnvironmentBuildError, ensureEnvironmentImage, environmentImageTag } from '../../src/environments/image-build.ts';
import { shortEngineName } from '../../src/environments/prepare-job.ts';
import { pruneEnvironmentImages } from '../../src/environments/prune-images.ts';
import { envRegistryDigestKey } from '../../src/redis/redis-keys.ts';
import { engineId, type Docker } from '../../src/sandbox/docker-client.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import { readHostFacts } from '../../src/worker/host-facts.ts';
import { docker, dropRuntimeCache, enqueueFile, runCli, silentLog, spawnWorker, startFleetEnv, waitFor, waitForResults, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { startRegistry, type TestRegistry } from '../helpers/registry.ts';
import { createSecondEngine, type SecondEngine } from '../helpers/second-engine.ts';

let env: FleetEnv;
let engineB: SecondEngine;
let registry: TestRegistry;
let root: string;
const dataDirs: string[] = [];
const workers: WorkerProcess[] = [];

beforeAll(async () => {
  env = await startFleetEnv();
  registry = await startRegistry();
  engineB = await createSecondEngine();
  root = await mkdtemp(path.join(os.tmpdir(), 'rf-registry-tasks-'));
}, 180_000);

afterAll(async () => {
  await Promise.all(workers.map((w) => w.stop()));
  // Only what this file built or pulled: the images labelled with its prefix, on both engines.
  for (const engine of [docker, engineB?.docker].filter((e): e is Docker => e !== undefined)) {
    for (const img of await engine.listImages({ filters: { label: [`${LABEL.envPrefix}=${env.prefix}`] } }).catch(() => [])) {
      await engine.getImage(img.Id).remove({ force: true }).catch(() => undefined);
    }
  }
  await engineB?.destroy();
  await registry?.destroy();
  await env?.close();
  await Promise.all(dataDirs.map((d) => dropRuntimeCache(d)));
  if (root !== undefined) await rm(root, { recursive: true, force: true });
}, 120_000);

/** A Harbor task whose environment holds a token only its Dockerfile writes; the oracle copies it where the grader looks. */
async function harborTask(name: string, opts: { separateVerifier?: boolean } = {}): Promise<string> {
  const dir = path.join(root, name);
  const token = `${name}-${randomBytes(6).toString('hex')}`;
  const files: Record<string, string> = {
    'task.toml': `version = "1.0"\n${opts.separateVerifier ? 'artifacts = ["/tmp/answer"]\n' : ''}[environment]\nbuild_timeout_sec = 120.0\n[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 60.0\n${opts.separateVerifier ? '[verifier.environment]\nbuild_timeout_sec = 120.0\n' : ''}`,
    'instruction.md': 'Copy /etc/fleet-token to /tmp/answer.\n',
    // Harbor runs a task's commands with `bash -c`; the busybox image has only sh, so a two-line bash stands in.
    'environment/Dockerfile': `FROM ${DEFAULT_IMAGE}\nRUN printf '#!/bin/sh\\nexec /bin/sh "$@"\\n' > /bin/bash && chmod +x /bin/bash\nRUN echo ${token} > /etc/fleet-token\n`,
    'solution/solve.sh': '#!/bin/sh\ncp /etc/fleet-token /tmp/answer\n',
    'tests/test.sh': `#!/bin/sh\nif [ "$(cat /tmp/answer 2>/dev/null)" = "${token}" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n`,
  };
  // A separate verifier's own image, built from tests/ (the same builder, so the same registry path).
  if (opts.separateVerifier) files['tests/Dockerfile'] = `FROM ${DEFAULT_IMAGE}\nRUN printf '#!/bin/sh\\nexec /bin/sh "$@"\\n' > /bin/bash && chmod +x /bin/bash\nCOPY test.sh /tests/test.sh\n`;
  for (const [rel, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
    await writeFile(path.join(dir, rel), content);
  }
  return dir;
}

async function batchOf(name: string, tasks: string[]): Promise<string> {
  const file = path.join(root, `${name}.yaml`);
  await writeFile(file, `name: ${name}\ntasks: [${tasks.map((t) => JSON.stringify(t)).join(', ')}]\nagent: { kind: oracle }\n`);
  return file;
}

async function newDataDir(name: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `rf-${name}-`));
  dataDirs.push(dir);
  return dir;
}

async function imageOn(engine: Docker, image: string) {
  return engine.getImage(image).inspect().catch(() => undefined);
}

/** The built environment images of this file's prefix and of a task (not the first test's) on an engine, by tag. */
async function envImages(engine: Docker): Promise<Map<string, { id: string; builtAt: string | undefined }>> {
  const out = new Map<string, { id: string; builtAt: string | undefined }>();
  for (const img of await engine.listImages({ filters: { label: [`${LABEL.envPrefix}=${env.prefix}`, 'rollout-fleet.task'] } })) {
    // Environment images by their tags: a prepared image made over one (its sandboxes' /logs) carries its labels too.
    for (const tag of img.RepoTags ?? []) if (tag.startsWith(`${ENV_IMAGE_REPOSITORY}:`)) out.set(tag, { id: img.Id, builtAt: img.Labels?.[LABEL.envBuiltAt] });
  }
  return out;
}

const builds = (log: string) => log.split('\n').filter((l) => l.includes('"msg":"building environment image"')).length;
const pulls = (log: string) => log.split('\n').filter((l) => l.includes('"msg":"environment image pulled from the registry"')).length;

const hostEnv = async (name: string, dockerHost?: string) => ({
  ...env.env, FLEET_DATA_DIR: await newDataDir(name), FLEET_REGISTRY: registry.address, LOG_LEVEL: 'info', FLEET_LEASE_TTL_MS: '3000',
  ...(dockerHost !== undefined && { DOCKER_HOST: dockerHost }),
});

describe('environments across hosts through a registry', () => {
  it('asked at once on two engines: one builds and pushes, the other waits and pulls it by digest', async () => {
    const context = await tarBuffer((pack) => pack.entry({ name: 'Dockerfile', mode: 0o644 }, `FROM ${DEFAULT_IMAGE}\nRUN echo ${env.prefix}-at-once > /marker\n`));
    const digest = createHash('sha256').update(context).digest('hex');
    const ask = (engine: Docker) => ensureEnvironmentImage(
      { docker: engine, redis: env.client, prefix: env.prefix, log: silentLog, registry: registry.address },
      { context, digest, timeoutSec: 120 },
    );
    const [a, b] = await Promise.all([ask(docker), ask(engineB.docker)]);
    const got = [a, b];
    expect(got.filter((r) => r.built)).toHaveLength(1);
    expect(got.filter((r) => r.pulled)).toHaveLength(1);
    const builder = got.find((r) => r.built)!;
    expect(builder.pushed).toMatch(/^sha256:[0-9a-f]{64}$/);
    // The same image on both engines (its id is its config's digest), under the same local tag only.
    expect(a.imageId).toBe(b.imageId);
    expect(a.image).toBe(environmentImageTag(digest));
    for (const engine of [docker, engineB.docker]) {
      const info = (await imageOn(engine, a.image))!;
      expect(info.RepoTags).toEqual([a.image]);
      expect(info.RepoDigests ?? []).toEqual([]);
      expect(info.Config.Labels?.[LABEL.envDigest]).toBe(digest);
    }
    // Redis holds what was pushed, and the registry holds it.
    expect(await env.client.get(envRegistryDigestKey(env.prefix, registry.address, digest))).toBe(builder.pushed);
    expect(await registry.hasManifest(ENV_IMAGE_REPOSITORY, builder.pushed!)).toBe(true);
    expect(await registry.hasManifest(ENV_IMAGE_REPOSITORY, `sha256:${'0'.repeat(64)}`)).toBe(false);
    // Asked again on either engine: found there, nothing built or pulled.
    for (const engine of [docker, engineB.docker]) {
      const again = await ask(engine);
      expect([again.built, again.pulled ?? false]).toEqual([false, false]);
    }
    // A registry's name left on the engine (a push or pull killed before it was removed) does not keep
    // a pruned image's layers: pruning removes it with the local tag.
    const [repo, tag] = [`${registry.address}/${ENV_IMAGE_REPOSITORY}`, 'left-by-a-killed-push'];
    await engineB.docker.getImage(b.image).tag({ repo, tag });
    const pruned = await pruneEnvironmentImages({ docker: engineB.docker, redis: env.client, prefix: env.prefix, log: silentLog }, { budgetBytes: 0, minIdleMs: 0 });
    expect(pruned.removed).toEqual([b.image]);
    expect(await imageOn(engineB.docker, b.imageId)).toBeUndefined();
    expect(await imageOn(engineB.docker, `${repo}:${tag}`)).toBeUndefined();
  });

  it('a Dockerfile that fails on one host fails on the other from memory, with no build there', async () => {
    const context = await tarBuffer((pack) => pack.entry({ name: 'Dockerfile', mode: 0o644 }, `FROM ${DEFAULT_IMAGE}\nRUN echo ${env.prefix} failing on purpose && exit 7\n`));
    const digest = createHash('sha256').update(context).digest('hex');
    const ask = (engine: Docker) => ensureEnvironmentImage(
      { docker: engine, redis: env.client, prefix: env.prefix, log: silentLog, registry: registry.address },
      { context, digest, timeoutSec: 120 },
    );
    const onA = await ask(docker).catch((err: unknown) => err);
    expect(onA).toBeInstanceOf(EnvironmentBuildError);
    expect(onA).toMatchObject({ code: 'environment_build_failed', remembered: false });
    const onB = await ask(engineB.docker).catch((err: unknown) => err);
    expect(onB).toBeInstanceOf(EnvironmentBuildError);
    expect(onB).toMatchObject({ code: 'environment_build_failed', remembered: true });
    expect((onB as EnvironmentBuildError).buildLog).toContain('failing on purpose');
    // Nothing was pushed.
    expect(await env.client.get(envRegistryDigestKey(env.prefix, registry.address, digest))).toBeNull();
  });

  it('host A builds and pushes, host B pulls and runs the same task; prepare builds once; with the registry away host B builds its own', async () => {
    const shared = await harborTask('shared-env');
    const fallback = await harborTask('fallback-env');
    const prepared = await harborTask('prepared-env', { separateVerifier: true });

    // Host A alone: it builds both environments and pushes them.
    const hostA = spawnWorker(await hostEnv('host-a'), 'host-a');
    workers.push(hostA);
    const first = await enqueueFile(env, await batchOf('on-a', [shared, fallback]));
    const onA = await waitForResults(env, first.batchId, 2, 180_000);
    expect(onA.map((r) => [r.status, r.reward, r.workerId]), hostA.output()).toEqual([['passed', 1, 'host-a'], ['passed', 1, 'host-a']]);
    expect(builds(hostA.output())).toBe(2);
    expect(hostA.output().match(/"msg":"environment image pushed to the registry"/g)).toHaveLength(2);
    const builtOnA = await envImages(docker);
    expect(builtOnA.size).toBe(2);
    await hostA.stop();

    // Host B alone: it pulls the shared environment by digest and runs the episode; it never builds it.
    const bEnv = await hostEnv('host-b', engineB.host);
    let hostB = spawnWorker(bEnv, 'host-b');
    workers.push(hostB);
    const second = await enqueueFile(env, await batchOf('on-b', [shared]));
    const [onB] = await waitForResults(env, second.batchId, 1, 180_000);
    expect(onB, hostB.output()).toMatchObject({ status: 'passed', reward: 1, workerId: 'host-b' });
    expect(builds(hostB.output()), hostB.output()).toBe(0);
    expect(pulls(hostB.output())).toBe(1);
    const onEngineB = await envImages(engineB.docker);
    expect(onEngineB.size).toBe(1);
    const [tag, imageB] = [...onEngineB][0]!;
    // A's image, built at A's build time: B made none of its own.
    expect(builtOnA.get(tag)).toEqual(imageB);
    expect(onB!.provenance.imageId).toBe(imageB.id);
    const sharedDigest = (await imageOn(engineB.docker, tag))!.Config.Labels![LABEL.envDigest]!;
    const manifest = await env.client.get(envRegistryDigestKey(env.prefix, registry.address, sharedDigest));
    expect(manifest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(await registry.hasManifest(ENV_IMAGE_REPOSITORY, manifest!)).toBe(true);

    // prepare with both hosts live: one builds and pushes, the other pulls (the environment, and the
    // separate verifier's image built from tests/).
    const hostA2 = spawnWorker(await hostEnv('host-a2'), 'host-a2');
    workers.push(hostA2);
    const [bBuildsBefore, bPullsBefore] = [builds(hostB.output()), pulls(hostB.output())];
    const [idA, idB] = [await engineId(docker, { timeoutMs: 10_000 }), await engineId(engineB.docker, { timeoutMs: 10_000 })];
    await waitFor('both hosts to take prepare jobs', async () => {
      const engines = new Set((await readHostFacts(env.client, env.prefix)).filter((f) => f.prepareQueue !== undefined).map((f) => f.engineId));
      return engines.has(idA) && engines.has(idB);
    }, 60_000, 100);
    const run = await runCli(['prepare', await batchOf('prepare', [prepared])], { ...env.env, FLEET_REGISTRY: registry.address }, 300_000);
    const detail = `${run.stdout}\n${run.stderr}`;
    expect(run.code, detail).toBe(0);
    expect(run.stderr.match(/prepared-env: rollout-fleet\/env:[0-9a-f]{24} \(built by (host-a2|host-b), pushed as sha256:[0-9a-f]{64}/g) ?? [], detail).toHaveLength(1);
    expect(run.stderr.match(/prepared-env: rollout-fleet\/env:[0-9a-f]{24} \(pulled by (host-a2|host-b) from the registry/g) ?? [], detail).toHaveLength(1);
    const summary = (id: string) => new RegExp(`engine ${shortEngineName(id)}, worker[s]? [^)]*\\): 1 of 1 environments ready \\((1 built, 0 already there|0 built, 1 pulled, 0 already there)\\), 0 failed`);
    expect(run.stdout, detail).toMatch(summary(idA));
    expect(run.stdout, detail).toMatch(summary(idB));
    expect(run.stdout.match(/\(0 built, 1 pulled, 0 already there\)/g), detail).toHaveLength(1);
    const preparedTag = /prepared-env: (rollout-fleet\/env:[0-9a-f]{24})/.exec(run.stderr)![1]!;
    expect((await imageOn(docker, preparedTag))!.Id).toBe((await imageOn(engineB.docker, preparedTag))!.Id);
    const preparedImages = async (engine: Docker) => (await engine.listImages({ filters: { label: [`${LABEL.envPrefix}=${env.prefix}`, 'rollout-fleet.task=prepared-env'] } })).map((i) => i.Id).sort();
    expect(await preparedImages(docker)).toHaveLength(2);
    expect(await preparedImages(engineB.docker)).toEqual(await preparedImages(docker));
    // Two images, each built on one host and pulled on the other.
    const workerLogs = () => [hostA2.output(), hostB.output()];
    expect(builds(hostA2.output()) + builds(hostB.output()) - bBuildsBefore, workerLogs().join('\n')).toBe(2);
    expect(pulls(hostA2.output()) + pulls(hostB.output()) - bPullsBefore, workerLogs().join('\n')).toBe(2);
    for (const w of workers.splice(1)) await w.stop();

    // The registry away: host B's pull of the other environment fails, it builds its own, and says so.
    await registry.stop();
    hostB = spawnWorker(bEnv, 'host-b');
    workers.push(hostB);
    const third = await enqueueFile(env, await batchOf('registry-away', [fallback]));
    const [away] = await waitForResults(env, third.batchId, 1, 180_000);
    expect(away, hostB.output()).toMatchObject({ status: 'passed', reward: 1, workerId: 'host-b' });
    expect(hostB.output()).toContain('pulling the environment image from the registry failed: building it on this engine instead');
    expect(builds(hostB.output())).toBe(1);
    expect(pulls(hostB.output())).toBe(0);
    // Its own build: same tag as A's, its own build time.
    const fallbackTag = [...builtOnA.keys()].find((t) => t !== tag)!;
    const ownOnB = (await envImages(engineB.docker)).get(fallbackTag);
    expect(ownOnB).toBeDefined();
    expect(ownOnB!.builtAt).not.toBe(builtOnA.get(fallbackTag)!.builtAt);
    expect(ownOnB!.id).not.toBe(builtOnA.get(fallbackTag)!.id);
    // Sharing it again failed too (the registry is away), which is logged and does not fail the episode.
    expect(hostB.output()).toContain('pushing the environment image to the registry failed');
  });
});

// Built environments across hosts: `rollout-fleet prepare` reaches every host with a live worker (two
// engines on this machine: the shared one and a private second dockerd, each with its own worker
// process), printing a line per host and environment and failing on a broken Dockerfile; with no live
// worker it says so and builds on its own engine. And each worker holds its engine's built images to
// the disk budget on its own timer: past it the least recently used goes, one a container uses stays.
// Dockerfiles start FROM the busybox sandbox image both engines have and are tiny.
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureEnvironmentImage, environmentImageTag } from '../../src/environments/image-build.ts';
import { shortEngineName } from '../../src/environments/prepare-job.ts';
import { envLastUsedKey, workerFactsKey } from '../../src/redis/redis-keys.ts';
import { engineId, type Docker } from '../../src/sandbox/docker-client.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import { readHostFacts } from '../../src/worker/host-facts.ts';
import { createHash } from 'node:crypto';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import { docker, dropRuntimeCache, runCli, silentLog, spawnWorker, startFleetEnv, waitFor, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { createSecondEngine, type SecondEngine } from '../helpers/second-engine.ts';

let env: FleetEnv;
const workers: WorkerProcess[] = [];
const dataDirs: string[] = [];

beforeAll(async () => {
  env = await startFleetEnv();
});
afterAll(async () => {
  await Promise.all(workers.map((w) => w.stop()));
  // Only what this file built: the images labelled with its prefixes.
  for (const prefix of [env.prefix, `${env.prefix}-prune`]) {
    for (const img of await docker.listImages({ filters: { label: [`${LABEL.envPrefix}=${prefix}`] } })) {
      await docker.getImage(img.Id).remove({ force: true }).catch(() => undefined);
    }
  }
  await env?.close();
  await Promise.all(dataDirs.map((d) => dropRuntimeCache(d)));
});

/** A Harbor task folder whose Dockerfile runs `run` on the sandbox image; returns its folder. */
async function harborTask(root: string, name: string, run: string): Promise<string> {
  const dir = path.join(root, name);
  const files: Record<string, string> = {
    'task.toml': 'version = "1.0"\n[environment]\nbuild_timeout_sec = 120.0\n',
    'instruction.md': 'Do nothing.\n',
    'environment/Dockerfile': `FROM ${DEFAULT_IMAGE}\nRUN ${run}\n`,
    'tests/test.sh': '#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n',
    'solution/solve.sh': '#!/bin/sh\ntrue\n',
  };
  for (const [rel, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
    await writeFile(path.join(dir, rel), content);
  }
  return dir;
}

async function hasImage(engine: Docker, image: string): Promise<boolean> {
  return engine.getImage(image).inspect().then(() => true, () => false);
}

async function newDataDir(name: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `rf-${name}-`));
  dataDirs.push(dir);
  return dir;
}

describe('rollout-fleet prepare', () => {
  let engineB: SecondEngine;
  let batch: string;
  beforeAll(async () => {
    engineB = await createSecondEngine();
    const root = await mkdtemp(path.join(os.tmpdir(), 'rf-prepare-'));
    await harborTask(root, 'good-env', `echo ${env.prefix} > /marker`);
    await harborTask(root, 'broken-env', 'echo failing on purpose && exit 3');
    batch = path.join(root, 'batch.yaml');
    await writeFile(batch, `name: prepare-test\ntasks: [${JSON.stringify(path.join(root, 'good-env'))}, ${JSON.stringify(path.join(root, 'broken-env'))}]\nagent: { kind: oracle }\n`);
  }, 180_000);
  afterAll(async () => {
    await engineB?.destroy();
  });

  it('--help answers 0 and names the options', async () => {
    const help = await runCli(['prepare', '--help'], env.env);
    expect(help.code).toBe(0);
    expect(help.stdout + help.stderr).toContain('--timeout-ms');
    const bad = await runCli(['prepare', batch, '--timeout-ms', 'soon'], env.env);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain('--timeout-ms');
    expect(bad.stderr).toContain('"soon"');
  });

  it('with no live worker says so and builds on its own engine', async () => {
    const prefix = `${env.prefix}-alone`;
    const run = await runCli(['prepare', batch], { ...env.env, FLEET_PREFIX: prefix });
    expect(run.stderr).toContain(`no live worker in fleet ${prefix}`);
    expect(run.stderr).toMatch(/good-env: rollout-fleet\/env:[0-9a-f]{24} \(built/);
    expect(run.stderr).toMatch(/broken-env: failed \(invalid: environment_build_failed\)/);
    expect(run.code).toBe(1);
    expect(run.stdout).toContain("1 of 2 environments ready on this host's engine");
    for (const img of await docker.listImages({ filters: { label: [`${LABEL.envPrefix}=${prefix}`] } })) {
      await docker.getImage(img.Id).remove({ force: true }).catch(() => undefined);
    }
  });

  it('builds every environment on each live host\'s engine, a line per host and environment', async () => {
    const hostEnv = async (name: string) => ({ ...env.env, FLEET_DATA_DIR: await newDataDir(name), FLEET_LEASE_TTL_MS: '3000' });
    workers.push(spawnWorker(await hostEnv('host-a'), 'host-a'));
    workers.push(spawnWorker({ ...(await hostEnv('host-b')), DOCKER_HOST: engineB.host }, 'host-b'));
    const [idA, idB] = [await engineId(docker, { timeoutMs: 10_000 }), await engineId(engineB.docker, { timeoutMs: 10_000 })];
    expect(idA).not.toBe(idB);
    await waitFor('both workers to report their hosts and prepare queues', async () => {
      const engines = new Set((await readHostFacts(env.client, env.prefix)).filter((f) => f.prepareQueue !== undefined).map((f) => f.engineId));
      return engines.has(idA) && engines.has(idB);
    }, 60_000, 100);

    const first = await runCli(['prepare', batch], env.env, 300_000);
    const detail = `${first.stdout}\n${first.stderr}\n${workers.map((w) => w.output()).join('\n')}`;
    expect(first.code, detail).toBe(1);
    expect(first.stderr, detail).toContain('preparing 2 environments on 2 hosts');
    for (const [id, worker] of [[idA, 'host-a'], [idB, 'host-b']] as const) {
      const label = `(engine ${shortEngineName(id)}, worker ${worker})`;
      expect(first.stderr, detail).toMatch(new RegExp(`${escape(label)} \\[\\d/2\\] good-env: rollout-fleet/env:[0-9a-f]{24} \\(built by ${worker},`));
      expect(first.stderr, detail).toMatch(new RegExp(`${escape(label)} \\[\\d/2\\] broken-env: failed \\(invalid: environment_build_failed\\)`));
      expect(first.stdout, detail).toContain(`${label}: 1 of 2 environments ready (1 built, 0 already there), 1 failed`);
    }
    const image = /good-env: (rollout-fleet\/env:[0-9a-f]{24})/.exec(first.stderr)![1]!;
    expect(await hasImage(docker, image)).toBe(true);
    expect(await hasImage(engineB.docker, image)).toBe(true);
    // Asked for on each engine: pruning counts from then.
    expect(await env.client.hexists(envLastUsedKey(env.prefix, idA), image)).toBe(1);
    expect(await env.client.hexists(envLastUsedKey(env.prefix, idB), image)).toBe(1);

    // Again: nothing is built, the broken one fails from memory on both hosts.
    const second = await runCli(['prepare', batch], env.env, 120_000);
    expect(second.code, second.stderr).toBe(1);
    for (const [id, worker] of [[idA, 'host-a'], [idB, 'host-b']] as const) {
      expect(second.stderr).toMatch(new RegExp(`${escape(`(engine ${shortEngineName(id)}, worker ${worker})`)} \\[\\d/2\\] good-env: rollout-fleet/env:[0-9a-f]{24} \\(already there`));
    }
    expect(second.stderr.match(/good-env: rollout-fleet\/env:[0-9a-f]{24} \(already there/g)).toHaveLength(2);
    expect(second.stderr.match(/broken-env: failed \(invalid: environment_build_failed\): .*remembered/g)).toHaveLength(2);

    // A live worker of a version before prepare queues (its facts name none): its host is not
    // waited for; it is named as not prepared, and the run fails.
    await env.client.set(workerFactsKey(env.prefix, 'old-worker'), JSON.stringify({
      workerId: 'old-worker', host: 'old-host', engineId: 'OLD:ENGINE@000000000000', pid: 1, concurrency: 1, images: [], freeDiskBytes: 0, reportedAt: new Date().toISOString(),
    }), 'PX', 60_000);
    const third = await runCli(['prepare', batch], env.env, 120_000);
    await env.client.del(workerFactsKey(env.prefix, 'old-worker'));
    expect(third.code, third.stderr).toBe(1);
    const old = `old-host (engine ${shortEngineName('OLD:ENGINE@000000000000')}, worker old-worker)`;
    expect(third.stderr).toContain(`${old}: not prepared: its workers take no prepare jobs`);
    expect(third.stdout).toContain(`${old}: 0 of 2 environments ready`);
    expect(third.stderr).toContain('preparing 2 environments on 2 hosts');
    expect(third.stderr.match(/good-env: rollout-fleet\/env:[0-9a-f]{24} \(already there/g)).toHaveLength(2);
  }, 400_000);
});

describe('each worker prunes its own engine\'s built images', () => {
  it('removes the least recently used past the budget, keeps one a container uses', async () => {
    const prefix = `${env.prefix}-prune`;
    const engine = await engineId(docker, { timeoutMs: 10_000 });
    const built = [];
    for (const name of ['a', 'b', 'c']) {
      // 3 MB of random bytes each: layers of its own, not shared with any other image.
      const tar = await tarBuffer((pack) => pack.entry({ name: 'Dockerfile', mode: 0o644 }, `FROM ${DEFAULT_IMAGE}\nLABEL test.run=${prefix}\nRUN head -c 3000000 /dev/urandom > /blob-${name}\n`));
      const digest = createHash('sha256').update(tar).digest('hex');
      built.push(await ensureEnvironmentImage({ docker, redis: env.client, prefix, log: silentLog }, { context: tar, digest, timeoutSec: 120 }));
    }
    const [a, b, c] = built.map((x) => x.image) as [string, string, string];
    expect(c).toBe(environmentImageTag(built[2]!.digest));
    // Used in the order a (longest ago), b, c; a is the one a container still uses.
    const now = Date.now();
    await env.client.hset(envLastUsedKey(prefix, engine), a, String(now - 30_000), b, String(now - 20_000), c, String(now - 10_000));
    const holder = await docker.createContainer({ Image: a, Cmd: ['true'], Labels: { 'test.run': prefix } });
    try {
      // 3 images of about 2.9 MiB over a 7 MiB budget: one has to go, and it cannot be a.
      const worker = spawnWorker({
        ...env.env, FLEET_PREFIX: prefix, FLEET_DATA_DIR: await newDataDir('prune'),
        FLEET_ENV_IMAGE_BUDGET_MB: '7', FLEET_ENV_PRUNE_INTERVAL_MS: '500', FLEET_ENV_IMAGE_MIN_IDLE_MS: '0', LOG_LEVEL: 'info',
      }, 'pruner');
      workers.push(worker);
      await waitFor('the least recently used image a container does not use to go', async () => !(await hasImage(docker, b)), 60_000, 100);
      // A later run (the interval is half a second) finds the engine within its budget.
      const runs = () => worker.output().split('\n').filter((l) => l.includes('environment images pruned')).length;
      const seen = runs();
      await waitFor('another prune run', async () => runs() > seen, 30_000, 100);
      expect(await hasImage(docker, a)).toBe(true);
      expect(await hasImage(docker, c)).toBe(true);
      expect(await env.client.hexists(envLastUsedKey(prefix, engine), b)).toBe(0);
      expect(await env.client.hexists(envLastUsedKey(prefix, engine), a)).toBe(1);
    } finally {
      await holder.remove({ force: true });
    }
  }, 120_000);
});

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

// Several hosts, one fleet, on this machine: two Docker engines (the shared one and a private second
// one), two worker processes with separate data folders, one artifact store: the S3-compatible test
// server, or a folder both mount. An llm episode that has checkpointed is killed -9 on host A and
// resumes on host B from its latest checkpoint without repeating checkpointed model calls; a
// dashboard with host B's settings shows the evidence of an episode host A ran; once the episode has
// its result no checkpoint of it is left; each worker reports its host's facts.
import { mkdtemp, readFile, readdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Queue, Worker, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLEANUP_QUEUE, REMOVE_SANDBOX_JOB, cleanupJobId, cleanupJobOptions } from '../../queues/cleanup/contract.ts';
import { cleanupProcessor, type CleanupProcessorDeps } from '../../queues/cleanup/processor.ts';
import { openArtifactStore } from '../../src/artifacts/open-store.ts';
import { imageChecker } from '../../src/cli/queue-clients.ts';
import type { ArtifactStore } from '../../src/artifacts/artifact-store.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { checkpointLatestKey, sandboxClaimKey } from '../../src/redis/redis-keys.ts';
import { engineId } from '../../src/sandbox/docker-client.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import { readHostFacts } from '../../src/worker/host-facts.ts';
import { EXAMPLES, docker, dropRuntimeCache, enqueueFile, silentLog, spawnDashboard, spawnWorker, startFleetEnv, waitFor, waitForResults, type Dashboard, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { startS3Server, type S3TestServer } from '../helpers/s3-server.ts';
import { createSecondEngine, type SecondEngine } from '../helpers/second-engine.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

describe.each(['s3', 'shared folder'] as const)('two hosts, one fleet (%s store)', (kind) => {
  let env: FleetEnv;
  let engineB: SecondEngine;
  let s3: S3TestServer | undefined;
  let stub: ModelStub;
  let storeEnv: Record<string, string>;
  let store: ArtifactStore;
  let dataA: string;
  let dataB: string;
  const workers: WorkerProcess[] = [];
  let dashboard: Dashboard | undefined;

  beforeAll(async () => {
    env = await startFleetEnv({ durable: true });
    engineB = await createSecondEngine();
    dataA = await mkdtemp(path.join(os.tmpdir(), 'rf-host-a-'));
    dataB = await mkdtemp(path.join(os.tmpdir(), 'rf-host-b-'));
    if (kind === 's3') {
      s3 = await startS3Server();
      storeEnv = { ...s3.env, FLEET_ARTIFACTS: `s3://${s3.bucket}/fleet` };
    } else {
      storeEnv = { FLEET_ARTIFACTS: await mkdtemp(path.join(os.tmpdir(), 'rf-shared-')) };
    }
    store = openArtifactStore(storeEnv.FLEET_ARTIFACTS, dataB, { ...process.env, ...storeEnv });
    // A slow model, so the kill lands mid-episode.
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0 }, delayMs: 1_500, log: silentLog });
  });
  afterAll(async () => {
    await dashboard?.stop();
    await Promise.all(workers.map((w) => w.stop()));
    // Host A's sandbox of the killed attempt: its worker died, and no reaper of its engine is left.
    for (const c of await docker.listContainers({ all: true, filters: { label: [`${LABEL.fleet}=${env.prefix}`] } })) {
      await docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined);
    }
    await stub?.close();
    await s3?.stop();
    await engineB?.destroy();
    await env?.close();
    await Promise.all([dataA, dataB].filter(Boolean).map((d) => dropRuntimeCache(d)));
  });

  const hostEnv = (dataDir: string, dockerHost: string | undefined) => ({
    ...env.env, ...storeEnv, FLEET_DATA_DIR: dataDir, MODEL_BASE_URL: stub.baseUrl!,
    FLEET_LOCK_DURATION_MS: '4000', FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000',
    ...(dockerHost !== undefined ? { DOCKER_HOST: dockerHost } : {}),
  });

  it('resumes on host B what host A checkpointed, shows host A\'s evidence on host B, and leaves no checkpoint behind', async () => {
    const hostA = spawnWorker(hostEnv(dataA, undefined), 'host-a');
    workers.push(hostA);

    // An episode host A runs to its end: its evidence goes to the store.
    const first = await enqueueFile(env, await writeBatch(`name: on-a\ntasks: [${JSON.stringify(path.join(EXAMPLES, 'tasks', 'fix-greeting'))}]\nagent: { kind: llm }\n`, {}));
    const [ranOnA] = await waitForResults(env, first.batchId, 1, 120_000);
    expect(ranOnA).toMatchObject({ status: 'passed', workerId: 'host-a' });

    // set-port takes four turns; host A is killed once two checkpoints are durable in the store.
    const plan = await enqueueFile(env, await writeBatch(`name: moves\ntasks: [${JSON.stringify(path.join(EXAMPLES, 'tasks', 'set-port'))}]\nagent: { kind: llm }\n`, {}));
    const episodeId = plan.jobs[0]!.episodeId;
    const durable = async () => {
      if (kind === 's3') return Number((await env.client.get(checkpointLatestKey(env.prefix, episodeId))) ?? -1);
      return readFile(path.join(storeEnv.FLEET_ARTIFACTS!, 'checkpoints', episodeId, 'latest.json'), 'utf8').then((t) => (JSON.parse(t) as { seq: number }).seq, () => -1);
    };
    await waitFor('two durable checkpoints', async () => (await durable()) >= 2, 90_000, 50);
    hostA.child.kill('SIGKILL');
    const durableAtKill = await durable();
    // Nothing of them is on host B's disk: whatever B resumes from, it read from the store.
    expect(await readdir(path.join(dataB, 'checkpoints')).catch(() => [])).toEqual([]);

    const hostB = spawnWorker(hostEnv(dataB, engineB.host), 'host-b');
    workers.push(hostB);
    const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(result, hostB.output()).toMatchObject({ status: 'passed', reward: 1, workerId: 'host-b', attempts: 2 });
    expect(result!.resumedFrom).toBeGreaterThanOrEqual(durableAtKill);
    const calls = stub.calls().filter((c) => c.episodeId === episodeId);
    for (const c of calls) {
      if (c.turn < result!.resumedFrom!) expect(c.count, `turn ${c.turn} asked again`).toBe(1);
    }
    expect(calls.map((c) => c.turn)).toEqual([0, 1, 2, 3]);
    // Its sandbox on host B ran on B's engine.
    expect(result!.provenance.imageId).toBeDefined();

    // Once the episode has its result no checkpoint of it is left in the store (nor its pointer).
    // (Objects first, then the pointer: the removal's two steps, so both are waited for.)
    await waitFor('the checkpoints to be removed', async () =>
      (await store.list(`checkpoints/${episodeId}/`, { signal: AbortSignal.timeout(10_000) })).length === 0
      && (await env.client.exists(checkpointLatestKey(env.prefix, episodeId))) === 0, 30_000);

    // Host B's facts: its engine, its images, its runtime generation.
    const facts = await waitFor('host B to report its facts', async () => (await readHostFacts(env.client, env.prefix)).find((f) => f.workerId === 'host-b' && f.runtimeGeneration !== undefined));
    expect(facts.engineId).toBe(await engineId(engineB.docker, { timeoutMs: 10_000 }));
    expect(facts.engineId).not.toBe(await engineId(docker, { timeoutMs: 10_000 }));
    expect(facts.images).toContain(DEFAULT_IMAGE);
    expect(facts.freeDiskBytes).toBeGreaterThan(0);

    // A dashboard with host B's settings shows the evidence of the episode host A ran.
    expect(await readdir(path.join(dataB, 'evidence')).catch(() => [] as string[])).not.toContain(ranOnA!.episodeId);
    dashboard = await spawnDashboard(hostEnv(dataB, engineB.host), ['--local-only', '--port', '0']);
    const page = await (await fetch(`${dashboard.url}/batches/${first.batchId}/episodes/${ranOnA!.episodeId}`)).text();
    expect(page).toContain('trajectory.json');
    expect(page).toContain('model-calls.jsonl');
    expect(page).toContain('Hello'); // the verifier's output: "ok: Hello, world!"
    const hosts = (await (await fetch(`${dashboard.url}/hosts.json`)).json()) as { workers: { workerId: string }[] };
    expect(hosts.workers.map((w) => w.workerId)).toContain('host-b');

    // enqueue checks a task's image against the live hosts: an image only host B's engine has is
    // accepted although the local engine lacks it; one no live host has is refused.
    const onlyOnB = `rollout-fleet/only-on-b:${kind === 's3' ? 's3' : 'folder'}`;
    const [repo, tag] = onlyOnB.split(':') as [string, string];
    await engineB.docker.getImage(DEFAULT_IMAGE).tag({ repo, tag });
    await waitFor('host B to report the new image', async () => (await readHostFacts(env.client, env.prefix)).some((f) => f.images.includes(onlyOnB)), 30_000);
    const check = imageChecker(docker, { redis: env.client, prefix: env.prefix });
    expect(await imageChecker(docker)(onlyOnB)).toBe(false);
    expect(await check(onlyOnB)).toBe(true);
    expect(await imageChecker(docker, { redis: env.client, prefix: env.prefix })('rollout-fleet/on-no-host:1')).toBe(false);
  });

  it('leaves a sandbox\'s removal to a worker of its own engine: another host\'s worker does not count it removed', async () => {
    const container = await engineB.docker.createContainer({ Image: DEFAULT_IMAGE, Cmd: ['sleep', '600'], Labels: { [LABEL.fleet]: env.prefix } });
    const job = (data: object) => ({ name: REMOVE_SANDBOX_JOB, data }) as unknown as Job;
    const data = { episodeId: 'elsewhere.t.0', containerId: container.id, engineId: await engineId(engineB.docker, { timeoutMs: 10_000 }) };
    const deps = (engine: typeof docker) => ({ docker: engine, redis: env.client, prefix: env.prefix, reapMinAgeMs: 60_000, runtimeMaxIdleMs: 3_600_000, callTimeoutMs: 10_000 }) as unknown as CleanupProcessorDeps;
    // Were it a claimed warm sandbox, its claim would go with it.
    await env.client.set(sandboxClaimKey(env.prefix, container.id), '{"episodeId":"elsewhere.t.0","batchId":"elsewhere","attempt":1}');
    // On host A's engine the container is "not found": the job fails (to be retried), nothing is reported removed.
    await expect(cleanupProcessor(deps(docker))(job(data))).rejects.toThrow(/runs on engine .* not this worker's/);
    expect((await engineB.docker.getContainer(container.id).inspect()).Id).toBe(container.id);
    // On its own engine it is removed.
    await expect(cleanupProcessor(deps(engineB.docker))(job(data))).resolves.toEqual({ removed: container.id });
    await expect(engineB.docker.getContainer(container.id).inspect()).rejects.toMatchObject({ statusCode: 404 });
    expect(await env.client.exists(sandboxClaimKey(env.prefix, container.id))).toBe(0);
  });

  it('puts back a removal another engine\'s worker takes, its attempts unspent, until a worker of its own engine removes it', async () => {
    const container = await engineB.docker.createContainer({ Image: DEFAULT_IMAGE, Cmd: ['sleep', '600'], Labels: { [LABEL.fleet]: env.prefix } });
    // A queue of its own: the file's worker processes do not take this job.
    const prefix = `${env.prefix}-bounce`;
    const connection = new Redis(env.redis.url, { maxRetriesPerRequest: null });
    const queue = new Queue(CLEANUP_QUEUE, { connection, prefix });
    const deps = (engine: typeof docker) => ({ docker: engine, redis: env.client, prefix, reapMinAgeMs: 60_000, runtimeMaxIdleMs: 3_600_000, callTimeoutMs: 10_000 }) as unknown as CleanupProcessorDeps;
    const cleanupWorkers: Worker[] = [new Worker(CLEANUP_QUEUE, cleanupProcessor(deps(docker)), { connection, prefix })];
    try {
      const data = { episodeId: 'elsewhere.t.1', containerId: container.id, engineId: await engineId(engineB.docker, { timeoutMs: 10_000 }) };
      const { id } = await queue.add(REMOVE_SANDBOX_JOB, data, { ...cleanupJobOptions, jobId: cleanupJobId(data.episodeId, container.id) });
      const job = async () => (await queue.getJob(id!))!;
      // Only host A's worker: it takes the job again and again, and each time puts it back.
      await waitFor('host A\'s worker to take the removal three times', async () => (await job()).attemptsStarted >= 3, 30_000);
      expect((await job()).attemptsMade).toBe(0);
      expect(await (await job()).getState()).toMatch(/^(delayed|waiting|active)$/);
      expect((await engineB.docker.getContainer(container.id).inspect()).Id).toBe(container.id);
      // Host B's worker joins: the removal lands there, and is done once.
      cleanupWorkers.push(new Worker(CLEANUP_QUEUE, cleanupProcessor(deps(engineB.docker)), { connection, prefix }));
      await waitFor('the removal on its own engine', async () => (await (await job()).getState()) === 'completed', 60_000);
      expect((await job()).returnvalue).toEqual({ removed: container.id });
      await expect(engineB.docker.getContainer(container.id).inspect()).rejects.toMatchObject({ statusCode: 404 });
    } finally {
      await Promise.all(cleanupWorkers.map((w) => w.close()));
      await queue.close();
      await connection.quit();
      await engineB.docker.getContainer(container.id).remove({ force: true }).catch(() => undefined);
    }
  });
});

// docker-compose.yml started for real, with the images built offline from this host
// (.ci/build-fleet-images.sh, docker-compose.offline.yml): Redis, three worker replicas, the dashboard,
// the API and the model stub. The demo batch is enqueued from the host's CLI and runs through the worker
// containers (sandboxes created through the mounted socket, the runtime generation prepared from
// inside a container, the proxy's socket folder bound at the same path on both sides). One worker
// container is stopped mid-batch: it drains (exit 0) and its episodes finish on the others, each
// episode once. `docker-compose stop` drains them all with exit 0; `down -v` leaves nothing of the
// stack or the fleet behind.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EPISODES_QUEUE } from '../../queues/episodes/contract.ts';
import { ResultsStore } from '../../src/results/results-store.ts';
import { sandboxClaimKey } from '../../src/redis/redis-keys.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { ROOT, docker, dropRuntimeCache, runCli, waitFor } from '../helpers/fleet.ts';
import { closedPort } from '../helpers/model.ts';

const run = promisify(execFile);
const USER = 'ops';
const PASSWORD = `pw-${randomBytes(6).toString('hex')}`;
const API_TOKEN = `token-${randomBytes(12).toString('hex')}`;

describe('docker-compose stack, started for real', () => {
  const project = `rfc${randomBytes(3).toString('hex')}`;
  let env: NodeJS.ProcessEnv;
  let redis: Redis;
  let queue: Queue;
  let results: ResultsStore;
  let dashboardUrl: string;
  let apiUrl: string;
  const started = performance.now();

  const compose = (...args: string[]) =>
    run('docker-compose', ['-p', project, '-f', path.join(ROOT, 'docker-compose.yml'), '-f', path.join(ROOT, 'docker-compose.offline.yml'), '--project-directory', ROOT, ...args], { env, maxBuffer: 16 * 1024 * 1024 });
  const projectContainers = async (service?: string) =>
    docker.listContainers({ all: true, filters: { label: [`com.docker.compose.project=${project}`, ...(service ? [`com.docker.compose.service=${service}`] : [])] } });
  const sandboxes = () => docker.listContainers({ all: true, filters: { label: [`${LABEL.fleet}=${project}`] } });
  /** A request with its own limit: a service that accepts and never answers fails the step it is in, by name. */
  const get = async (url: string, headers: Record<string, string> = {}, timeoutMs = 30_000) => {
    try {
      return await fetch(url, { headers, signal: AbortSignal.timeout(timeoutMs) });
    } catch (err) {
      throw new Error(`GET ${url}: ${(err as Error).message}`, { cause: err });
    }
  };

  beforeAll(async () => {
    await run('bash', [path.join(ROOT, '.ci/build-fleet-images.sh')]);
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-compose-'));
    const [redisPort, dashboardPort, apiPort] = [await closedPort(), await closedPort(), await closedPort()];
    const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('FLEET_') && !k.startsWith('MODEL_') && k !== 'REDIS_URL'));
    env = {
      ...base, FLEET_DASHBOARD_USER: USER, FLEET_DASHBOARD_PASSWORD: PASSWORD, FLEET_DATA_DIR: dataDir, FLEET_PREFIX: project,
      FLEET_REDIS_PORT: String(redisPort), FLEET_DASHBOARD_PORT: String(dashboardPort), FLEET_API_PORT: String(apiPort), FLEET_API_TOKEN: API_TOKEN,
      // Episodes long enough to be stopped in the middle; a short drain, so a stopped worker hands them back.
      MODEL_STUB_DELAY_MS: '700', FLEET_DRAIN_TIMEOUT_MS: '1000', LOG_LEVEL: 'warn',
    };
    dashboardUrl = `http://127.0.0.1:${dashboardPort}`;
    apiUrl = `http://127.0.0.1:${apiPort}`;
    await compose('up', '-d', '--no-build', '--scale', 'worker=3');
    redis = new Redis(`redis://127.0.0.1:${redisPort}`, { maxRetriesPerRequest: null, lazyConnect: true });
    // Refused until the stack's Redis is up: polled below, not reported.
    redis.on('error', () => undefined);
    await waitFor('Redis of the stack', async () => redis.connect().then(() => true, () => false), 60_000, 200);
    queue = new Queue(EPISODES_QUEUE, { connection: redis, prefix: project });
    // Refused while the stack stops at the end: expected, not reported.
    queue.on('error', () => undefined);
    results = new ResultsStore(redis, project, dataDir);
  }, 300_000);
  afterAll(async () => {
    await queue?.close();
    redis?.disconnect();
    await compose('down', '-v', '--remove-orphans').catch(() => undefined);
    // The runtime generation is a cache the workers keep on purpose (the reaper removes idle ones).
    const { Volumes } = await docker.listVolumes({ filters: { label: [`rollout-fleet.prefix=${project}`] } });
    for (const v of Volumes ?? []) await docker.getVolume(v.Name).remove().catch(() => undefined);
    for (const c of await sandboxes()) await docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined);
    if (env?.FLEET_DATA_DIR) await dropRuntimeCache(env.FLEET_DATA_DIR);
    console.log(`compose stack test: ${((performance.now() - started) / 1000).toFixed(1)} s`);
  });

  it('runs the demo batch on three worker replicas, survives a stopped worker, and goes away whole', async () => {
    // Each step's time is printed, so a slow run shows where it spent it.
    let last = performance.now();
    const step = (what: string) => {
      console.log(`compose stack: ${what} after ${((performance.now() - last) / 1000).toFixed(1)} s`);
      last = performance.now();
    };
    await waitFor('three worker containers connected', async () => (await queue.getWorkers()).length >= 3, 120_000, 250);
    step('three workers connected');
    // The dashboard: 401 without credentials, 200 with.
    const auth = `Basic ${Buffer.from(`${USER}:${PASSWORD}`).toString('base64')}`;
    await waitFor('the dashboard', async () => (await get(`${dashboardUrl}/healthz`, {}, 5_000).then((r) => r.ok, () => false)), 60_000, 250);
    expect((await get(`${dashboardUrl}/batches`)).status).toBe(401);
    expect((await get(`${dashboardUrl}/batches`, { authorization: auth })).status).toBe(200);
    step('the dashboard answers');
    // The API: 401 without the token.
    await waitFor('the API', async () => (await get(`${apiUrl}/healthz`, {}, 5_000).then((r) => r.ok, () => false)), 60_000, 250);
    expect((await get(`${apiUrl}/v1/batches/none`)).status).toBe(401);
    step('the API answers');

    // The demo batch, from the host's CLI.
    const cliEnv = { ...env, REDIS_URL: `redis://127.0.0.1:${env.FLEET_REDIS_PORT}` };
    const enqueued = await runCli(['enqueue', path.join(ROOT, 'examples/demo-batch.yaml'), '--json'], cliEnv, 60_000);
    expect(enqueued.code, enqueued.stderr).toBe(0);
    const batchId = (JSON.parse(enqueued.stdout) as { batchId?: string }).batchId;
    expect(batchId, enqueued.stdout).toBeDefined();
    const manifest = await waitFor('the batch manifest', async () => results.getManifest(batchId!));
    step('batch enqueued from the host');

    // Stop the worker container that runs an episode, mid-episode.
    const busy = await waitFor('a sandbox of the batch', async () => (await sandboxes()).find((c) => c.State === 'running' && c.Labels[LABEL.batch] === batchId), 120_000, 100);
    const workerId = busy.Labels[LABEL.worker]!;
    const running = (await sandboxes()).filter((c) => c.Labels[LABEL.worker] === workerId).map((c) => c.Labels[LABEL.episode]!);
    const victim = (await projectContainers('worker')).find((c) => workerId.startsWith(c.Id.slice(0, 12)));
    expect(victim, `worker ${workerId} among ${(await projectContainers('worker')).map((c) => c.Id.slice(0, 12)).join(', ')}`).toBeDefined();
    await docker.getContainer(victim!.Id).stop({ t: 60 });
    const stopped = await docker.getContainer(victim!.Id).inspect();
    expect(stopped.State.ExitCode, 'a drained worker exits 0').toBe(0);
    step('one worker stopped mid-episode');

    // Every episode ends once; those the stopped worker ran end on the others.
    const all = await waitFor('every result', async () => {
      const got = await results.results(batchId!);
      return got.length >= manifest.episodeIds.length ? got : undefined;
    }, 240_000, 500);
    step('every result');
    expect(all).toHaveLength(manifest.episodeIds.length);
    expect(new Set(all.map((r) => r.episodeId)).size).toBe(manifest.episodeIds.length);
    for (const r of all) {
      expect([r.status, r.reward], `${r.episodeId}: ${JSON.stringify(r.error)}`).toEqual(r.taskId === 'reverse-lines' ? ['failed', 0] : ['passed', 1]);
    }
    for (const episodeId of running) {
      expect(all.find((r) => r.episodeId === episodeId)?.workerId, episodeId).not.toBe(workerId);
    }
    // Every episode's sandbox removed; the workers' warm (pooled, unclaimed) ones stay until they stop.
    const unclaimedPooled = async (c: { Id: string; Labels: Record<string, string> }) => c.Labels[LABEL.pool] !== undefined && !(await redis.exists(sandboxClaimKey(project, c.Id)));
    await waitFor('every sandbox removed', async () => {
      for (const c of await sandboxes()) if (!(await unclaimedPooled(c))) return false;
      return true;
    }, 60_000, 250);
    step('every sandbox removed');
    // The API container reads the same batch: its summary and, as NDJSON, every result once.
    const bearer = { authorization: `Bearer ${API_TOKEN}` };
    expect(await (await get(`${apiUrl}/v1/batches/${batchId}`, bearer)).json()).toMatchObject({ total: manifest.episodeIds.length, finished: true });
    const streamed = (await (await get(`${apiUrl}/v1/batches/${batchId}/results`, bearer)).text()).trim().split('\n').map((l) => JSON.parse(l) as { kind: string; result?: { episodeId: string } });
    expect(streamed.filter((e) => e.kind === 'result').map((e) => e.result!.episodeId).sort()).toEqual([...manifest.episodeIds].sort());

    step('the API read the batch');
    // `docker-compose stop` drains every worker: exit 0.
    await compose('stop');
    for (const c of await projectContainers('worker')) {
      expect((await docker.getContainer(c.Id).inspect()).State.ExitCode, c.Names.join()).toBe(0);
    }
    await compose('down', '-v');
    expect(await projectContainers()).toEqual([]);
    expect((await docker.listNetworks()).filter((n) => n.Name.startsWith(`${project}_`))).toEqual([]);
    expect(((await docker.listVolumes()).Volumes ?? []).filter((v) => v.Name.startsWith(`${project}_`))).toEqual([]);
    expect(await sandboxes()).toEqual([]);
    step('stop and down -v');
  }, 420_000);
});

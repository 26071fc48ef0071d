// kill -9 of workers during episodes with three task services (test/fixtures/harbor-services-kill:
// main, a seed that writes a token into a named volume, an api that serves it once the seed is
// healthy), repeated: at least 20 kills, spread over four points of an episode (set-up before any
// service exists, while the services start, mid-agent, mid-verify), each on a worker process found at
// that point, which is then replaced. The last workers are left alive to finish. Then: every episode
// has exactly one result, passed (the command agent fetches the token from the api), none lost, none
// recorded twice; and once the reaper has had its turns no container or volume of the run is left (the
// fleet makes no networks: the episode's namespace is its holder container's, counted with the rest).
// And the removal such a kill cuts short between parts: its retried job still ends every part, by key.
import { mkdtemp, writeFile } from 'node:fs/promises';
import { once } from 'node:events';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REMOVE_SANDBOX_JOB, cleanupJobOptions } from '../../src/cleanup/cleanup-job.ts';
import { workerFactsKey } from '../../src/redis/redis-keys.ts';
import { engineId } from '../../src/sandbox/docker-client.ts';
import { LABEL, sandboxLabels } from '../../src/sandbox/labels.ts';
import {
  ROOT, docker, enqueueFile, fleetContainers, sandboxHasFile, spawnWorker, startEnvWorker, startFleetEnv, waitFor, waitForResults,
  type FleetEnv, type WorkerProcess,
} from '../helpers/fleet.ts';

const TASK = path.join(ROOT, 'test/fixtures/harbor-services-kill/three-services');
const EPISODES = 6;
const KILLS = 20;
const VICTIMS = 2;
const POINTS = ['setup', 'services', 'agent', 'verify'] as const;
type KillPoint = (typeof POINTS)[number];

/** The agent marks that it began, works a moment, then fetches the token from the api. */
const AGENT = '{ kind: command, command: "touch /tmp/agent-working; sleep 2; python3 -c \\"import urllib.request; print(urllib.request.urlopen(\'http://api:8000/token.txt\', timeout=5).read().decode(), end=\'\')\\" > /app/answer.txt" }';

describe('kill -9 during episodes with three task services', () => {
  let env: FleetEnv;
  const alive: { w: WorkerProcess; id: string }[] = [];
  const retired: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(alive.map(({ w }) => w.stop()));
    await env?.close();
  });

  /** Where each episode of a live worker is now, as the engine and the worker's reported facts show it. */
  async function pointsOf(workerId: string): Promise<Map<string, KillPoint>> {
    const facts = JSON.parse((await env.client.get(workerFactsKey(env.prefix, workerId))) ?? '{}') as { running?: { episodeId: string; phase: string }[] };
    const parts = (await fleetContainers('worker', workerId)).filter((c) => c.State === 'running');
    const at = new Map<string, KillPoint>();
    const episodes = new Set([...(facts.running ?? []).map((r) => r.episodeId), ...parts.map((c) => c.Labels[LABEL.episode]!)]);
    for (const ep of episodes) {
      const mine = parts.filter((c) => c.Labels[LABEL.episode] === ep);
      const main = mine.find((c) => c.Labels[LABEL.environmentRole] === 'main');
      const phase = facts.running?.find((r) => r.episodeId === ep)?.phase;
      if (main !== undefined) {
        if (phase === 'verify' || (await sandboxHasFile(main.Id, '/logs/verifier/grading'))) at.set(ep, 'verify');
        else if (await sandboxHasFile(main.Id, '/tmp/agent-working')) at.set(ep, 'agent');
      } else if (mine.some((c) => c.Labels[LABEL.environmentRole] === 'service')) {
        at.set(ep, 'services');
      } else if (phase === 'setup') {
        at.set(ep, 'setup');
      }
    }
    return at;
  }

  it('20 kills at set-up, while services start, mid-agent and mid-verify: one result per episode, none lost, nothing left', async () => {
    const workerEnv = {
      ...env.env,
      // Short leases, locks and reaper interval: a killed worker's episodes and environments are found fast.
      FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000', FLEET_LOCK_DURATION_MS: '4000', FLEET_DRAIN_TIMEOUT_MS: '3000',
      // Every kill costs the episodes it hits one attempt; none may run out of them.
      FLEET_INFRA_RETRIES: '20',
    };
    let serial = 0;
    const spawn = () => {
      const id = `kill-w${++serial}`;
      alive.push({ w: spawnWorker(workerEnv, id, 2), id });
    };
    for (let i = 0; i < VICTIMS; i++) spawn();
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-services-kill-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `tasks: [${JSON.stringify(TASK)}]\nagent: ${AGENT}\nsamples: ${EPISODES}\n`);
    const plan = await enqueueFile(env, file);

    const kills: { point: KillPoint; worker: string; episode: string }[] = [];
    const count = (p: KillPoint) => kills.filter((k) => k.point === p).length;
    while (kills.length < KILLS) {
      // The next kill strikes at a point no more than one kill ahead of the least struck one.
      const found = await waitFor(`a worker with an episode at a point to strike (kills so far: ${JSON.stringify(POINTS.map((p) => [p, count(p)]))})`, async () => {
        if ((await env.results.resultCount(plan.batchId)) >= EPISODES) throw new Error(`every episode ended after only ${kills.length} kills`);
        const least = Math.min(...POINTS.map(count));
        for (const victim of alive) {
          for (const [episode, point] of await pointsOf(victim.id)) {
            if (count(point) <= least) return { victim, episode, point };
          }
        }
        return undefined;
      }, 180_000, 50);
      const { w, id } = found.victim;
      const exited = once(w.child, 'exit');
      w.child.kill('SIGKILL');
      await exited;
      kills.push({ point: found.point, worker: id, episode: found.episode });
      alive.splice(alive.indexOf(found.victim), 1);
      retired.push(w);
      spawn();
    }

    // The last workers finish every episode.
    const results = await waitForResults(env, plan.batchId, EPISODES, 300_000);
    const outputs = [...retired, ...alive.map((a) => a.w)].map((w) => w.output()).join('\n');
    expect(results).toHaveLength(EPISODES);
    expect(new Set(results.map((r) => r.episodeId)).size).toBe(EPISODES);
    expect(outputs.match(/episode already had a result/g) ?? []).toEqual([]);
    for (const r of results) expect(r, JSON.stringify(r.error)).toMatchObject({ status: 'passed', reward: 1 });
    // Kills struck at every point, and some episodes more than once.
    for (const p of POINTS) expect(count(p), `${p}: ${JSON.stringify(kills)}`).toBeGreaterThanOrEqual(KILLS / POINTS.length - 1);
    expect(Math.max(...results.map((r) => r.attempts))).toBeGreaterThan(1);

    // After the reaper: no container (holders included) or volume of the run on the engine, and no network.
    const left = async () => {
      const containers = await fleetContainers('fleet', env.prefix);
      const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.fleet}=${env.prefix}`] } });
      const networks = await docker.listNetworks({ filters: { label: [`${LABEL.fleet}=${env.prefix}`] } });
      return { containers: containers.map((c) => `${c.Labels[LABEL.environmentRole] ?? 'sandbox'} ${c.Names[0]}`), volumes: (Volumes ?? []).map((v) => v.Name), networks: networks.map((n) => n.Name) };
    };
    const nothing = { containers: [], volumes: [], networks: [] };
    await waitFor('nothing of the run left on the engine', async () => JSON.stringify(await left()) === JSON.stringify(nothing), 120_000, 500)
      .catch(() => undefined);
    expect(await left()).toEqual(nothing);
    console.info(`[services kill] ${kills.length} kills ${JSON.stringify(Object.fromEntries(POINTS.map((p) => [p, count(p)])))}, attempts ${JSON.stringify(results.map((r) => r.attempts))}`);
  }, 600_000);

  it('a removal retried after its worker died mid-way (main gone, holder and volume left) still removes the whole environment', async () => {
    // What a worker killed inside removeEnvironment leaves: the agent's container removed, the holder and
    // the named volume not yet. The parts belong to a live worker's running episode, so the reaper leaves
    // them alone: only the retried remove-sandbox job, which names the main container, can end them.
    const worker = await startEnvWorker(env, 'cleanup-w');
    try {
      const owner = { fleet: env.prefix, episodeId: 'ep-half-removed', batchId: 'b-half-removed', workerId: 'cleanup-w', attempt: 1 };
      const key = `rf-ep-half-removed-a1-${Date.now().toString(16)}`;
      const labels = (role: string) => ({ ...sandboxLabels(owner), [LABEL.environment]: key, [LABEL.environmentRole]: role });
      const holder = await docker.createContainer({ name: `${key}-ns`, Image: 'python:3.12-slim', Cmd: ['sleep', 'infinity'], Labels: labels('holder'), HostConfig: { NetworkMode: 'none' } });
      await holder.start();
      await docker.createVolume({ Name: `${key}-v-data`, Labels: labels('service') });
      const main = await docker.createContainer({ Image: 'python:3.12-slim', Cmd: ['sleep', 'infinity'], Labels: labels('main'), HostConfig: { NetworkMode: `container:${holder.id}` } });
      await main.remove({ force: true });
      const job = await env.cleanup.add(REMOVE_SANDBOX_JOB, {
        episodeId: owner.episodeId, containerId: main.id, environment: key, engineId: await engineId(docker, { timeoutMs: 10_000 }),
      }, { ...cleanupJobOptions, attempts: 1 });
      const state = await waitFor('the remove-sandbox job to end', async () => {
        const s = await job.getState();
        return s === 'completed' || s === 'failed' ? s : undefined;
      }, 60_000, 100);
      expect(state, (await env.cleanup.getJob(job.id!))?.failedReason).toBe('completed');
      expect((await fleetContainers('episode', owner.episodeId)).map((c) => c.Names[0])).toEqual([]);
      const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.environment}=${key}`] } });
      expect((Volumes ?? []).map((v) => v.Name)).toEqual([]);
    } finally {
      await worker.close();
      // Whatever a failed run left (env.close removes the containers, not these volumes).
      const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.episode}=ep-half-removed`] } });
      for (const c of await fleetContainers('episode', 'ep-half-removed')) await docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined);
      for (const v of Volumes ?? []) await docker.getVolume(v.Name).remove().catch(() => undefined);
    }
  });
});

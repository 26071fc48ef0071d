// Harbor task services (environment/docker-compose.yaml) on the real engine, with the fixtures of
// test/fixtures/harbor-services (written for this suite): a main that waits for a healthy API sidecar
// and reaches it as http://api:8000, two sidecars sharing a named volume main mounts too, a sidecar
// built from its own folder. The oracle passes them, an agent that does nothing fails them; probes from
// every part of two episodes running at once find only loopback, no Redis of the host, nothing of the
// other episode; after the batch no container, holder or volume is left; a batch with one bad compose
// file enqueues nothing; and after a kill -9 of a worker mid-episode the reaper leaves nothing.
import { cp, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import { Writable } from 'node:stream';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import {
  ROOT, docker, enqueueFile, fleetContainers, runCli, spawnWorker, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults,
  type FleetEnv, type WorkerProcess,
} from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor-services');
const TASKS = ['api-sidecar', 'shared-volume', 'built-sidecar'];

/** What the engine still holds of a batch or a worker: containers and task volumes. */
async function leftOf(label: 'batch' | 'worker', value: string): Promise<{ containers: string[]; volumes: string[] }> {
  const containers = await fleetContainers(label, value);
  const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL[label]}=${value}`] } });
  return { containers: containers.map((c) => c.Names[0] ?? c.Id), volumes: (Volumes ?? []).map((v) => v.Name) };
}

/** Nothing of the batch is left on the engine (its volumes go right after its containers, in the same clean-up). */
async function nothingLeftOf(batchId: string): Promise<void> {
  await waitFor(`nothing of ${batchId} left`, async () => {
    const left = await leftOf('batch', batchId);
    return left.containers.length === 0 && left.volumes.length === 0;
  }, 30_000, 100).catch(async (err: unknown) => {
    expect(await leftOf('batch', batchId), String(err)).toEqual({ containers: [], volumes: [] });
  });
}

async function execIn(containerId: string, cmd: string[]): Promise<{ code: number | null; out: string }> {
  const exec = await docker.getContainer(containerId).exec({ Cmd: cmd, AttachStdout: true, AttachStderr: true });
  const stream = await exec.start({});
  const chunks: Buffer[] = [];
  await new Promise<void>((resolve, reject) => {
    const sink = new Writable({ write(c: Buffer, _e, cb) { chunks.push(c); cb(); } });
    docker.modem.demuxStream(stream, sink, sink);
    stream.on('end', () => resolve());
    stream.on('error', reject);
  });
  const info = await exec.inspect();
  return { code: info.ExitCode, out: Buffer.concat(chunks).toString() };
}

/** A probe run in a part of an episode: its interfaces, whether the host's addresses or Redis answer, what the api says. */
const PROBE = `
import json, socket, sys, urllib.request
targets = json.loads(sys.argv[1])
ifaces = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
reached = []
for host, port in targets:
    s = socket.socket(); s.settimeout(1)
    try:
        s.connect((host, port)); reached.append([host, port])
    except OSError:
        pass
    finally:
        s.close()
try:
    word = urllib.request.urlopen('http://api:8000/word', timeout=3).read().decode()
except Exception as e:
    word = 'unreachable: ' + type(e).__name__
listening = sorted({int(l.split()[1].split(':')[1], 16) for l in open('/proc/net/tcp').read().splitlines()[1:] if l.split()[3] == '0A'})
print(json.dumps({'ifaces': ifaces, 'reached': reached, 'word': word, 'listening': listening}))
`;

describe('Harbor task services', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  const spawned: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'services-w', { concurrency: 3 });
  });
  afterAll(async () => {
    await worker?.close();
    await Promise.all(spawned.map((w) => w.stop()));
    await env?.close();
  });

  async function enqueue(tasks: string[], agent: string, samples = 1) {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-services-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `tasks: ${JSON.stringify(tasks)}\nagent: ${agent}\nsamples: ${samples}\n`);
    return enqueueFile(env, file);
  }
  async function run(tasks: string[], agent: string, samples = 1): Promise<Map<string, EpisodeResult[]>> {
    const plan = await enqueue(tasks, agent, samples);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 600_000);
    await waitForNoContainers(plan.batchId);
    // Nothing of the batch is left on the engine: no container, holder or volume.
    await nothingLeftOf(plan.batchId);
    const byTask = new Map<string, EpisodeResult[]>();
    for (const r of results) byTask.set(r.taskId, [...(byTask.get(r.taskId) ?? []), r]);
    return byTask;
  }

  it('the oracle passes every task with services; an agent that does nothing fails them; nothing is left', async () => {
    const oracle = await run(TASKS.map((t) => path.join(FIXTURES, t)), '{ kind: oracle }');
    for (const id of TASKS) expect({ id, ...oracle.get(id)![0]! }, `${id}: ${JSON.stringify(oracle.get(id)![0]!.error)}`).toMatchObject({ id, status: 'passed', reward: 1 });
    // Each sidecar's output is kept with the episode's evidence: the reader's request log names what the oracle fetched.
    const shared = oracle.get('shared-volume')![0]!;
    const readerLog = await readFile(path.join(env.dataDir, 'evidence', shared.episodeId, 'attempt-1', 'service-reader.log'), 'utf8');
    expect(readerLog).toMatch(/"GET \/token\.txt HTTP\/1\.[01]" 200/);
    await expect(readFile(path.join(env.dataDir, 'evidence', shared.episodeId, 'attempt-1', 'service-writer.log'), 'utf8')).resolves.toBe('');
    const nothing = await run(TASKS.map((t) => path.join(FIXTURES, t)), '{ kind: command, command: "true" }');
    for (const id of TASKS) expect({ id, ...nothing.get(id)![0]! }, id).toMatchObject({ id, status: 'failed', reward: 0 });
  });

  it('every part of two episodes running at once sees only loopback, no Redis of the host and nothing of the other episode', async () => {
    const redisPort = Number(new URL(env.redis.url).port);
    const hostAddresses = Object.values(os.networkInterfaces()).flat().filter((a) => a && a.family === 'IPv4').map((a) => a!.address);
    const targets = [...new Set(['127.0.0.1', '172.17.0.1', ...hostAddresses])].flatMap((h) => [[h, redisPort], [h, 6379], [h, 2375]]);
    // The agent waits for the test's go, then does the task: both episodes are up together meanwhile.
    const plan = await enqueue([path.join(FIXTURES, 'api-sidecar')],
      '{ kind: command, command: "while [ ! -e /tmp/go ]; do sleep 0.2; done; python3 -c \\"import urllib.request; print(urllib.request.urlopen(\'http://api:8000/word\').read().decode(), end=\'\')\\" > /app/answer.txt" }', 2);
    const parts = await waitFor('both episodes\' mains running', async () => {
      const all = (await fleetContainers('batch', plan.batchId)).filter((c) => c.State === 'running');
      return all.filter((c) => c.Labels[LABEL.environmentRole] === 'main').length === 2 ? all : undefined;
    }, 300_000, 200);
    expect(parts.map((c) => c.Labels[LABEL.environmentRole]).sort()).toEqual(['holder', 'holder', 'main', 'main', 'service', 'service']);
    const words = new Map<string, Set<string>>();
    for (const c of parts) {
      const probe = await execIn(c.Id, ['python3', '-c', PROBE, JSON.stringify(targets)]);
      expect(probe.code, probe.out).toBe(0);
      const seen = JSON.parse(probe.out) as { ifaces: string[]; reached: unknown[]; word: string; listening: number[] };
      const who = `${c.Labels[LABEL.environmentRole]} of ${c.Labels[LABEL.episode]}`;
      expect(seen.ifaces, who).toEqual(['lo']);
      expect(seen.reached, who).toEqual([]);
      // The namespace holds the episode's own api and nothing else listening.
      expect(seen.listening, who).toEqual([8000]);
      expect(seen.word, who).toMatch(/^word-[0-9a-f]{12}$/);
      const ep = c.Labels[LABEL.episode]!;
      words.set(ep, new Set([...(words.get(ep) ?? []), seen.word]));
    }
    // Each episode's parts all reach its own api, and the two apis are not the same one.
    expect([...words.values()].map((w) => w.size)).toEqual([1, 1]);
    expect(new Set([...words.values()].flatMap((w) => [...w])).size).toBe(2);
    for (const c of parts.filter((p) => p.Labels[LABEL.environmentRole] === 'main')) await execIn(c.Id, ['touch', '/tmp/go']);
    const results = await waitForResults(env, plan.batchId, 2, 300_000);
    for (const r of results) expect(r, JSON.stringify(r.error)).toMatchObject({ status: 'passed', reward: 1 });
    await waitForNoContainers(plan.batchId);
    await nothingLeftOf(plan.batchId);
  });

  it('a sidecar that never turns healthy, or stops, ends its episode as healthcheck_failed (never a reward), and nothing is left', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-services-sick-'));
    const variants: Record<string, string> = {
      'never-healthy': 'services:\n  main:\n    depends_on: { api: { condition: service_healthy } }\n  api:\n    image: python:3.12-slim\n    command: ["sleep", "infinity"]\n    healthcheck: { test: ["CMD", "false"], interval: 1s, timeout: 1s, retries: 2 }\n',
      'stops-at-once': 'services:\n  main:\n    depends_on: { api: { condition: service_healthy } }\n  api:\n    image: python:3.12-slim\n    command: ["python3", "-c", "raise SystemExit(3)"]\n    healthcheck: { test: "true", interval: 1s, retries: 30 }\n',
    };
    for (const [name, compose] of Object.entries(variants)) {
      await cp(path.join(FIXTURES, 'api-sidecar'), path.join(dir, name), { recursive: true });
      await writeFile(path.join(dir, name, 'environment', 'docker-compose.yaml'), compose);
    }
    const byTask = await run(Object.keys(variants).map((v) => path.join(dir, v)), '{ kind: oracle }');
    expect(byTask.get('never-healthy')![0]).toMatchObject({ status: 'error', reward: null, error: { kind: 'invalid', code: 'healthcheck_failed' } });
    expect(byTask.get('never-healthy')![0]!.error?.message).toMatch(/task service api: its healthcheck did not pass within 4 s/);
    expect(byTask.get('stops-at-once')![0]).toMatchObject({ status: 'error', reward: null, error: { kind: 'invalid', code: 'healthcheck_failed' } });
    expect(byTask.get('stops-at-once')![0]!.error?.message).toMatch(/task service api stopped \(exit 3\)/);
  });

  it('prepare builds a task\'s service images ahead, as it builds its environment', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-services-prepare-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `tasks: [${JSON.stringify(path.join(FIXTURES, 'built-sidecar'))}]\nagent: { kind: oracle }\n`);
    // --local: on this host's engine (the fleet-wide prepare through live workers builds environments only).
    const out = await runCli(['prepare', '--local', file], env.env, 600_000);
    expect(out.code, out.stderr).toBe(0);
    expect(out.stderr).toMatch(/built-sidecar: rollout-fleet\/env:[0-9a-f]{24} \((built|already there), and 1 task service image\(s\)/);
  });

  it('a batch with one task whose compose file asks for a host path enqueues nothing, naming the service and the key', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-services-bad-'));
    const bad = path.join(dir, 'bad-mount');
    await cp(path.join(FIXTURES, 'api-sidecar'), bad, { recursive: true });
    await writeFile(path.join(bad, 'environment', 'docker-compose.yaml'),
      'services:\n  main: {}\n  api:\n    image: python:3.12-slim\n    volumes: ["/var/run/docker.sock:/var/run/docker.sock"]\n');
    const before = await env.episodes.getJobCounts();
    await expect(enqueue([path.join(FIXTURES, 'api-sidecar'), bad], '{ kind: oracle }')).rejects.toThrow(/services\.api\.volumes\.0: the Docker socket never reaches a service/);
    expect(await env.episodes.getJobCounts()).toEqual(before);
  });

  it('after a kill -9 of a worker mid-episode, the reaper removes every part of its environment', async () => {
    const fast = { FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000', FLEET_LOCK_DURATION_MS: '4000' };
    await worker.close();
    const victim = spawnWorker({ ...env.env, ...fast }, 'victim');
    spawned.push(victim);
    const plan = await enqueue([path.join(FIXTURES, 'shared-volume')],
      '{ kind: command, command: "touch /tmp/started; sleep 5; python3 -c \\"import urllib.request; print(urllib.request.urlopen(\'http://reader:8001/token.txt\').read().decode(), end=\'\')\\" > /app/answer.txt" }');
    await waitFor('the victim\'s episode to be running with its services', async () => {
      const running = (await fleetContainers('worker', 'victim')).filter((c) => c.State === 'running');
      return running.length === 4 && running.some((c) => c.Labels[LABEL.environmentRole] === 'main');
    }, 300_000, 200);
    expect((await leftOf('worker', 'victim')).volumes).toHaveLength(1);
    victim.child.kill('SIGKILL');
    const rescuer = spawnWorker({ ...env.env, ...fast }, 'rescuer');
    spawned.push(rescuer);
    await waitFor('every part of the victim\'s environment reaped', async () => {
      const left = await leftOf('worker', 'victim');
      return left.containers.length === 0 && left.volumes.length === 0;
    }, 60_000, 200);
    const [result] = await waitForResults(env, plan.batchId, 1, 300_000);
    expect(result, JSON.stringify(result?.error)).toMatchObject({ status: 'passed', reward: 1, workerId: 'rescuer' });
    await waitForNoContainers(plan.batchId);
    await nothingLeftOf(plan.batchId);
  });
});

// Task services (environment/docker-compose.yaml) attacked as a hostile task author, a hostile agent,
// a careless user and a failing machine would, against what docs/HARBOR.md promises, with the fixtures
// of test/fixtures/services-hostile (written for this suite): sidecars that fork-bomb, hog memory,
// fill their disk and a named volume, flood their output, ignore SIGTERM, exit at once, hang their
// healthcheck, probe for the host; collect hooks that never end; artifacts that are links to the
// host's files or 2 GiB sparse files; a build context linked out of the task; compose files that ask for
// the host (refused at enqueue, naming the service and the key, enqueueing nothing); and a kill -9 of
// the worker while an episode's sidecars are still starting. Every episode ends graded or with an
// error of a kind, nothing leaves its namespace, the worker goes on, and nothing is left behind.
import { cp, mkdir, mkdtemp, readFile, readdir, rm, stat, symlink, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import {
  ROOT, docker, enqueueFile, fleetContainers, runCli, sandboxHasFile, spawnWorker, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults,
  type FleetEnv, type WorkerProcess,
} from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/services-hostile');
const TB1 = path.join(ROOT, 'test/fixtures/terminal-bench-1/with-server');
const WAIT_FOR_GO = '{ kind: command, command: "while [ ! -e /tmp/go ]; do sleep 0.2; done; printf done > /app/answer.txt" }';

/** What the engine still holds of a batch or a worker: containers and task volumes. */
async function leftOf(label: 'batch' | 'worker', value: string): Promise<{ containers: string[]; volumes: string[] }> {
  const containers = await fleetContainers(label, value);
  const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL[label]}=${value}`] } });
  return { containers: containers.map((c) => c.Names[0] ?? c.Id), volumes: (Volumes ?? []).map((v) => v.Name) };
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
  return { code: (await exec.inspect()).ExitCode, out: Buffer.concat(chunks).toString() };
}

/** Graded (a reward from the verifier, or the agent's timeout), or an error that names its kind and gives no reward. */
function expectEndedWell(id: string, r: EpisodeResult | undefined) {
  expect(r, `${id}: no result`).toBeDefined();
  const ok = ['passed', 'failed', 'timeout'].includes(r!.status) || (r!.status === 'error' && !!r!.error?.kind && r!.reward === null);
  expect(ok, `${id} ended as ${JSON.stringify(r)}`).toBe(true);
}

/** Every file under `dir` (recursively), but the runtime cache; its path and size. */
async function filesUnder(dir: string): Promise<{ file: string; size: number }[]> {
  const out: { file: string; size: number }[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true }).catch(() => [])) {
    if (!entry.isFile()) continue;
    const file = path.join(entry.parentPath, entry.name);
    if (path.relative(dir, file).startsWith('runtime-src')) continue;
    out.push({ file, size: (await stat(file)).size });
  }
  return out;
}

describe('task services against hostile sidecars, hooks and artifacts', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let witness: net.Server;
  let witnessConnections = 0;
  let hostDir: string;
  const marker = `rf-host-marker-${randomBytes(8).toString('hex')}`;

  beforeAll(async () => {
    env = await startFleetEnv();
    // A service on every interface of the host that counts who reaches it: the prober aims at it.
    witness = net.createServer((sock) => {
      witnessConnections += 1;
      sock.end('hello\n');
    });
    await new Promise<void>((resolve) => witness.listen(0, '0.0.0.0', resolve));
    const witnessPort = (witness.address() as net.AddressInfo).port;
    const hostAddresses = Object.values(os.networkInterfaces()).flat().filter((a) => a && a.family === 'IPv4').map((a) => a!.address);
    const hosts = [...new Set(['127.0.0.1', '172.17.0.1', ...hostAddresses])];
    // The compose files name these; ${VAR} is resolved where the batch is enqueued (HARBOR.md).
    process.env.RF_SH_TARGETS = hosts.flatMap((h) => [`${h}:${env.redis.port}`, `${h}:${witnessPort}`, `${h}:2375`, `${h}:6379`]).join(',');
    // A file of the host the artifact links point at: its marker must never reach a verifier or the evidence.
    hostDir = await mkdtemp(path.join(os.tmpdir(), 'rf-sh-host-'));
    await writeFile(path.join(hostDir, 'plant.txt'), `${marker}\n`);
    process.env.RF_SH_HOSTFILE = path.join(hostDir, 'plant.txt');
    worker = await startEnvWorker(env, 'services-hostile-w', { concurrency: 3 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
    await new Promise((resolve) => witness?.close(resolve));
    if (hostDir) await rm(hostDir, { recursive: true, force: true });
    delete process.env.RF_SH_TARGETS;
    delete process.env.RF_SH_HOSTFILE;
  });

  async function enqueue(tasks: string[], agent: string, samples = 1) {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-sh-batch-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `tasks: ${JSON.stringify(tasks.map((t) => path.join(FIXTURES, t)))}\nagent: ${agent}\nsamples: ${samples}\n`);
    return enqueueFile(env, file);
  }
  /** Wait for every result, then for nothing of the batch left on the engine: no container, holder or volume. */
  async function finish(batchId: string, total: number, timeoutMs = 240_000): Promise<Map<string, EpisodeResult[]>> {
    const results = await waitForResults(env, batchId, total, timeoutMs);
    await waitForNoContainers(batchId, 30_000);
    expect(await leftOf('batch', batchId)).toEqual({ containers: [], volumes: [] });
    const byTask = new Map<string, EpisodeResult[]>();
    for (const r of results) byTask.set(r.taskId, [...(byTask.get(r.taskId) ?? []), r]);
    return byTask;
  }
  /** The running parts of a batch's episodes once `mains` mains run. */
  async function partsWhenMainsRun(batchId: string, mains: number) {
    return waitFor(`${mains} mains of ${batchId} running`, async () => {
      const all = await fleetContainers('batch', batchId);
      return all.filter((c) => c.State === 'running' && c.Labels[LABEL.environmentRole] === 'main').length === mains ? all : undefined;
    }, 180_000, 200);
  }

  it('a sidecar fork bomb and a sidecar memory hog are held by the task\'s limits; main is still graded; nothing is left', async () => {
    const plan = await enqueue(['fork-bomb', 'memory-hog'], WAIT_FOR_GO);
    const parts = await partsWhenMainsRun(plan.batchId, 2);
    const services = await Promise.all(parts.filter((c) => c.Labels[LABEL.environmentRole] === 'service').map((c) => docker.getContainer(c.Id).inspect()));
    expect(services).toHaveLength(2);
    const bomb = services.find((s) => JSON.stringify(s.Config.Cmd).includes('b | b'))!;
    const hog = services.find((s) => JSON.stringify(s.Config.Cmd).includes('hog-go'))!;
    expect(bomb && hog, JSON.stringify(services.map((s) => s.Config.Cmd))).toBeTruthy();
    // HARBOR.md: every sidecar gets the main sandbox's hardening and the task's memory (no swap), CPU and pids limits, an init.
    for (const s of [bomb, hog]) {
      const h = s.HostConfig;
      const who = `${s.Name}: ${JSON.stringify({ Memory: h.Memory, MemorySwap: h.MemorySwap, NanoCpus: h.NanoCpus, PidsLimit: h.PidsLimit, Privileged: h.Privileged, SecurityOpt: h.SecurityOpt, CapDrop: h.CapDrop, CapAdd: h.CapAdd, Init: h.Init, NetworkMode: h.NetworkMode, Binds: h.Binds })}`;
      expect(h.Memory, who).toBe(256 * 1024 * 1024);
      expect(h.MemorySwap, who).toBe(h.Memory);
      expect(h.NanoCpus, who).toBe(1e9);
      expect(h.PidsLimit, who).toBeGreaterThan(0);
      expect(h.Privileged, who).toBe(false);
      expect(h.SecurityOpt ?? [], who).toContain('no-new-privileges');
      expect(h.CapDrop ?? [], who).toContain('ALL');
      expect(h.Init, who).toBe(true);
      expect(h.NetworkMode, who).toMatch(/^container:/);
      expect(h.Binds ?? [], who).toEqual([]);
      expect(s.Mounts.filter((m) => m.Type === 'bind'), who).toEqual([]);
    }
    // The bomb presses against its pids limit and never passes it.
    const limit = bomb.HostConfig.PidsLimit!;
    let most = 0;
    await waitFor('the fork bomb to fill half its pids limit', async () => {
      const stats = (await docker.getContainer(bomb.Id).stats({ stream: false })) as unknown as { pids_stats?: { current?: number } };
      const now = stats.pids_stats?.current ?? 0;
      most = Math.max(most, now);
      expect(now, `pids ${now} over the limit ${limit}`).toBeLessThanOrEqual(limit);
      return now >= limit / 2;
    }, 60_000, 300);
    // The hog, told to go, is killed by its memory limit.
    expect((await execIn(hog.Id, ['touch', '/tmp/hog-go'])).code).toBe(0);
    const dead = await waitFor('the memory hog killed', async () => {
      const s = await docker.getContainer(hog.Id).inspect();
      return !s.State.Running ? s.State : undefined;
    }, 60_000, 200);
    expect(dead.OOMKilled || dead.ExitCode === 137, JSON.stringify(dead)).toBe(true);
    for (const c of parts.filter((p) => p.Labels[LABEL.environmentRole] === 'main')) expect((await execIn(c.Id, ['touch', '/tmp/go'])).code).toBe(0);
    const byTask = await finish(plan.batchId, 2);
    // The bomb is its own container's trouble: main, with its own pids, is graded as any task.
    expect(byTask.get('fork-bomb')![0], JSON.stringify(byTask.get('fork-bomb'))).toMatchObject({ status: 'passed', reward: 1 });
    expectEndedWell('memory-hog', byTask.get('memory-hog')![0]);
    console.log(`fork bomb: at most ${most} pids of ${limit}; memory hog: ${JSON.stringify({ oom: dead.OOMKilled, exit: dead.ExitCode })}, episode ${JSON.stringify({ status: byTask.get('memory-hog')![0]!.status, error: byTask.get('memory-hog')![0]!.error })}`);
  }, 300_000);

  it('a sidecar filling its root file system and a named volume, and the agent filling that volume, are held to storage_mb (256), or the episode ends with a kind', async () => {
    // The agent too writes up to 1 GiB into the volume main shares with the filler, then waits for the go.
    const plan = await enqueue(['disk-fill'],
      '{ kind: command, command: "dd if=/dev/zero of=/junk/agent bs=1M count=1024 status=none; stat -c %s /junk/agent > /tmp/agent-wrote; while [ ! -e /tmp/go ]; do sleep 0.2; done; printf done > /app/answer.txt" }');
    // The filler and the agent report how much they wrote (at most 1 GiB each), unless the fleet ends the episode first.
    const seen = await waitFor('the filler\'s and the agent\'s reports, or the result', async () => {
      const [result] = await env.results.results(plan.batchId);
      if (result) return { result };
      const parts = (await fleetContainers('batch', plan.batchId)).filter((c) => c.State === 'running');
      const filler = parts.find((c) => c.Labels[LABEL.environmentRole] === 'service');
      const main = parts.find((c) => c.Labels[LABEL.environmentRole] === 'main');
      if (!filler || !main || !(await sandboxHasFile(filler.Id, '/tmp/fill-done')) || !(await sandboxHasFile(main.Id, '/tmp/agent-wrote'))) return undefined;
      // The fleet may end the episode (and remove its containers) between the listing and these execs:
      // then the next poll finds its result.
      try {
        const report = `${(await execIn(filler.Id, ['cat', '/tmp/fill-report'])).out.trim()} agent=${(await execIn(main.Id, ['cat', '/tmp/agent-wrote'])).out.trim()}`;
        await execIn(main.Id, ['touch', '/tmp/go']);
        return { report };
      } catch (err) {
        if ((err as { statusCode?: number }).statusCode === 404 || (err as { statusCode?: number }).statusCode === 409) return undefined;
        throw err;
      }
    }, 180_000, 300);
    const byTask = await finish(plan.batchId, 1);
    const r = byTask.get('disk-fill')![0]!;
    expectEndedWell('disk-fill', r);
    console.log(`disk fill: ${seen.report?.trim() ?? '(no report)'}; episode ${JSON.stringify({ status: r.status, error: r.error })}`);
    if (seen.report !== undefined) {
      const [, root, volume] = /root=(\d+) volume=(\d+)/.exec(seen.report) ?? [];
      expect(root, seen.report).toBeDefined();
      const cap = (256 + 16) * 1024 * 1024;
      expect(Number(root), `the sidecar wrote past storage_mb into its root: ${seen.report}`).toBeLessThanOrEqual(cap);
      expect(Number(volume), `the sidecar wrote past storage_mb into a named volume: ${seen.report}`).toBeLessThanOrEqual(cap);
      const [, agent] = /agent=(\d+)/.exec(seen.report) ?? [];
      expect(Number(agent), `the agent wrote past storage_mb into the named volume main mounts: ${seen.report}`).toBeLessThanOrEqual(cap);
    } else {
      expect(r.status, JSON.stringify(r)).toBe('error');
    }
  }, 300_000);

  it('a sidecar that ignores SIGTERM, one that exits at once and one that floods its output do not hang the episode; a healthcheck that never returns is cut by its timeout', async () => {
    const started = Date.now();
    const plan = await enqueue(['stubborn', 'hanging-healthcheck', 'log-flood'], '{ kind: oracle }');
    const stuck = await waitFor('the hanging healthcheck\'s result', async () => (await env.results.results(plan.batchId)).find((r) => r.taskId === 'hanging-healthcheck'), 120_000, 200);
    const stuckSec = (Date.now() - started) / 1000;
    // HARBOR.md: at most start_period + retries x (interval + timeout) = 4 s of checks, then healthcheck_failed, never a reward
    // (its command sleeps 600 s: a check that is waited for, not cut, would take ten minutes).
    expect(stuck, JSON.stringify(stuck)).toMatchObject({ status: 'error', reward: null, error: { kind: 'invalid', code: 'healthcheck_failed' } });
    expect(stuck.error?.message).toMatch(/stuck/);
    expect(stuckSec).toBeLessThan(90);
    const results = await waitForResults(env, plan.batchId, 3, 180_000);
    const resultAt = Date.now();
    await waitForNoContainers(plan.batchId, 30_000);
    const closeSec = (Date.now() - resultAt) / 1000;
    expect(await leftOf('batch', plan.batchId)).toEqual({ containers: [], volumes: [] });
    const stubborn = results.find((r) => r.taskId === 'stubborn');
    expect(stubborn, JSON.stringify(stubborn)).toMatchObject({ status: 'passed', reward: 1 });
    // A sidecar flooding stdout and stderr all episode long: graded, and its log kept capped as the agent's (64 KiB a stream here).
    const flood = results.find((r) => r.taskId === 'log-flood')!;
    expect(flood, JSON.stringify(flood)).toMatchObject({ status: 'passed', reward: 1 });
    const floodLog = await readFile(path.join(env.dataDir, 'evidence', flood.episodeId, 'attempt-1', 'service-flood.log'), 'utf8');
    expect(floodLog).toContain('flood-out');
    expect(floodLog.length).toBeLessThanOrEqual(2 * 64 * 1024 + 4096);
    console.log(`hanging healthcheck ended after ${stuckSec.toFixed(1)} s; the stubborn sidecar's episode was gone ${closeSec.toFixed(1)} s after its result`);
  }, 240_000);

  it('a sidecar finds no way to the host (Redis, Docker, the witness, 169.254.169.254) nor the other episode running at once', async () => {
    const plan = await enqueue(['probe-host'], WAIT_FOR_GO, 2);
    // Both episodes are up together (each main waits for its prober's findings): then both agents go.
    const parts = await partsWhenMainsRun(plan.batchId, 2);
    for (const c of parts.filter((p) => p.State === 'running' && p.Labels[LABEL.environmentRole] === 'main')) expect((await execIn(c.Id, ['touch', '/tmp/go'])).code).toBe(0);
    const byTask = await finish(plan.batchId, 2);
    const results = byTask.get('probe-host')!;
    expect(results).toHaveLength(2);
    for (const r of results) {
      const probe = await readFile(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1', 'logs', 'verifier', 'probe.json'), 'utf8').catch((err: Error) => `(none: ${err.message})`);
      expect(r, `${JSON.stringify(r)}\n${probe}`).toMatchObject({ status: 'passed', reward: 1, metrics: { probe_found: 1 } });
      const seen = JSON.parse(probe) as { targets: number; reached: string[]; sockets: Record<string, string>; bind_ok: boolean; ifaces: string[]; routes: number; listening: number[] };
      expect(seen.targets, probe).toBeGreaterThan(8);
      expect(seen.reached, probe).toEqual([]);
      expect(Object.values(seen.sockets), probe).toEqual(['absent', 'absent', 'absent']);
      expect(seen.ifaces, probe).toEqual(['lo']);
      expect(seen.routes, probe).toBe(0);
      // Its own port, bound while the other episode's prober held the same one: two namespaces, and nothing else listening.
      expect(seen.bind_ok, probe).toBe(true);
      expect(seen.listening, probe).toEqual([7001]);
    }
    expect(witnessConnections).toBe(0);
  }, 300_000);

  it('a collect hook that never ends is cut by its timeout; artifact links to host files read nothing of the host; a 2 GiB artifact is artifact_too_large', async () => {
    const started = Date.now();
    const plan = await enqueue(['hook-hangs', 'artifact-links', 'artifact-huge'], '{ kind: oracle }');
    const byTask = await finish(plan.batchId, 3);
    const tookSec = (Date.now() - started) / 1000;
    // HARBOR.md: a collect hook is best effort within its timeout (3 s): grading goes on.
    const hook = byTask.get('hook-hangs')![0]!;
    expect(hook, JSON.stringify(hook)).toMatchObject({ status: 'passed', reward: 1 });
    // HARBOR.md: each artifact at most the evidence snapshot's size (16 MiB), else artifact_too_large, kind agent.
    const huge = byTask.get('artifact-huge')![0]!;
    expect(huge, JSON.stringify(huge)).toMatchObject({ status: 'error', reward: null, error: { kind: 'agent', code: 'artifact_too_large' } });
    const hugeBytes = (await filesUnder(path.join(env.dataDir, 'evidence', huge.episodeId))).reduce((n, f) => n + f.size, 0);
    expect(hugeBytes).toBeLessThan(64 * 1024 * 1024);
    // The links: graded or an error with a kind, and the host file's marker nowhere (not the verifier's view, evidence or results).
    const links = byTask.get('artifact-links')![0]!;
    expectEndedWell('artifact-links', links);
    if (links.status === 'passed') expect(links.metrics, JSON.stringify(links)).toMatchObject({ ok_arrived: 1 });
    const seen = await readFile(path.join(env.dataDir, 'evidence', links.episodeId, 'attempt-1', 'logs', 'verifier', 'seen.txt'), 'utf8').catch((err: Error) => `(none: ${err.message})`);
    const leaked: string[] = [];
    for (const { file, size } of await filesUnder(env.dataDir)) {
      if (size < 64 * 1024 * 1024 && (await readFile(file)).includes(marker)) leaked.push(path.relative(env.dataDir, file));
    }
    expect(leaked, `the host file reached:\n${seen}`).toEqual([]);
    expect(JSON.stringify([...byTask.values()])).not.toContain(marker);
    expect(tookSec).toBeLessThan(200);
    console.log(`hook, links and huge artifact: ${tookSec.toFixed(1)} s; links ${JSON.stringify({ status: links.status, metrics: links.metrics, error: links.error, attempts: links.attempts })}\nverifier saw:\n${seen}`);
    // A task's own links are no fault of the fleet's: never kind infra (USAGE.md: retried, FLEET_INFRA_RETRIES more attempts, for nothing).
    expect(links.status === 'error' ? links.error?.kind : links.status, `artifact links: ${JSON.stringify(links)}`).not.toBe('infra');
  }, 300_000);

  it('a sidecar built from a symlink in environment/ to a folder of the host: refused, or else its build never reads that folder', async () => {
    // HARBOR.md: a build context must be a folder of environment/. This one is a link to a folder of the host
    // holding a Dockerfile that copies itself and the host file's marker into the image, and a sidecar that prints it.
    const outside = path.join(hostDir, 'ctx');
    await mkdir(outside, { recursive: true });
    await writeFile(path.join(outside, 'Dockerfile'), 'FROM python:3.12-slim\nCOPY . /leak/\n');
    await writeFile(path.join(outside, 'marker.txt'), `${marker}\n`);
    const dir = path.join(await mkdtemp(path.join(os.tmpdir(), 'rf-sh-linkctx-')), 'link-context');
    await cp(path.join(FIXTURES, 'stubborn'), dir, { recursive: true });
    await writeFile(path.join(dir, 'environment', 'docker-compose.yaml'),
      'services:\n  main:\n    depends_on: [side]\n  side:\n    build: { context: ./ctx }\n    command: ["bash", "-c", "cat /leak/marker.txt; exec sleep infinity"]\n');
    await symlink(outside, path.join(dir, 'environment', 'ctx'));
    const file = path.join(path.dirname(dir), 'batch.yaml');
    await writeFile(file, `tasks: [${JSON.stringify(dir)}]\nagent: { kind: oracle }\n`);
    const before = await env.episodes.getJobCounts();
    const plan = await enqueueFile(env, file).catch((err: Error) => err);
    if (plan instanceof Error) {
      console.log(`link context refused: ${plan.message}`);
      expect(plan.message).toMatch(/services\.side\.build/);
      expect(await env.episodes.getJobCounts()).toEqual(before);
      return;
    }
    const byTask = await finish(plan.batchId, 1);
    const r = byTask.get('link-context')![0]!;
    expectEndedWell('link-context', r);
    console.log(`link context accepted: ${JSON.stringify({ status: r.status, reward: r.reward, error: r.error })}`);
    const leaked: string[] = [];
    for (const { file: f, size } of await filesUnder(env.dataDir)) {
      if (size < 64 * 1024 * 1024 && (await readFile(f)).includes(marker)) leaked.push(path.relative(env.dataDir, f));
    }
    expect(leaked, `accepted at enqueue (${JSON.stringify({ status: r.status, error: r.error })}), and the host folder's marker reached`).toEqual([]);
  }, 300_000);
});

describe('hostile compose files are refused at enqueue, naming the service and the key; nothing is enqueued', () => {
  let env: FleetEnv;
  let scratch: string;
  const fakeSecret = `rf-fake-secret-${randomBytes(6).toString('hex')}`;

  beforeAll(async () => {
    // No worker here: were a hostile file accepted, its episodes would wait unrun until the Redis is gone.
    env = await startFleetEnv();
    scratch = await mkdtemp(path.join(os.tmpdir(), 'rf-sh-refused-'));
    process.env.RF_SH_SECRET_TOKEN = fakeSecret;
  });
  afterAll(async () => {
    await env?.close();
    if (scratch) await rm(scratch, { recursive: true, force: true });
    delete process.env.RF_SH_SECRET_TOKEN;
  });

  /** A copy of a good task (or of the Terminal-Bench 1 with-server task) with this compose file. */
  async function variant(name: string, compose: string, base = path.join(FIXTURES, 'stubborn'), composeFile = 'environment/docker-compose.yaml'): Promise<string> {
    const dir = path.join(scratch, name);
    await cp(base, dir, { recursive: true });
    await writeFile(path.join(dir, composeFile), compose);
    return dir;
  }
  async function batchOf(dirs: string[]): Promise<string> {
    const file = path.join(await mkdtemp(path.join(scratch, 'batch-')), 'batch.yaml');
    await writeFile(file, `tasks: ${JSON.stringify([path.join(FIXTURES, 'stubborn'), ...dirs])}\nagent: { kind: oracle }\n`);
    return file;
  }
  const side = (keys: string) => `services:\n  main: {}\n  side:\n    image: python:3.12-slim\n    command: ["sleep", "infinity"]\n${keys}`;

  const CASES: { name: string; compose: string; error: RegExp }[] = [
    { name: 'privileged-false', compose: side('    privileged: false\n'), error: /services\.side\.privileged/ },
    { name: 'network-mode-main', compose: side('    network_mode: "service:main"\n'), error: /services\.side\.network_mode/ },
    { name: 'cap-add-sys-admin', compose: side('    cap_add: [SYS_ADMIN]\n'), error: /services\.side\.cap_add/ },
    { name: 'root-bind', compose: side('    volumes: ["/:/host"]\n'), error: /services\.side\.volumes/ },
    { name: 'redis-url', compose: side('    environment:\n      R: "${REDIS_URL}"\n'), error: /services\.side\.environment.*REDIS_URL/ },
    { name: 'secret-var', compose: side('    environment:\n      T: "${RF_SH_SECRET_TOKEN}"\n'), error: /services\.side\.environment.*RF_SH_SECRET_TOKEN/ },
    { name: 'model-key', compose: side('    environment:\n      - K=${MODEL_API_KEY:-x}\n'), error: /services\.side\.environment.*MODEL_API_KEY/ },
    { name: 'context-up', compose: 'services:\n  main: {}\n  side:\n    build: { context: ../.. }\n', error: /services\.side\.build/ },
    { name: 'cap-add-net-admin', compose: side('    cap_add: [NET_ADMIN]\n'), error: /services\.side\.cap_add/ },
    { name: 'cap-add-net-raw', compose: side('    cap_add: ["CAP_NET_RAW"]\n'), error: /services\.side\.cap_add/ },
    { name: 'cap-add-all', compose: side('    cap_add: [ALL]\n'), error: /services\.side\.cap_add/ },
    { name: 'pid-host', compose: side('    pid: host\n'), error: /services\.side\.pid/ },
    { name: 'userns-host', compose: side('    userns_mode: host\n'), error: /services\.side\.userns_mode/ },
    { name: 'seccomp-off', compose: side('    security_opt: ["seccomp:unconfined"]\n'), error: /services\.side\.security_opt/ },
    { name: 'devices', compose: side('    devices: ["/dev/kmsg:/dev/kmsg"]\n'), error: /services\.side\.devices/ },
    { name: 'long-form-bind', compose: side('    volumes:\n      - { type: bind, source: /, target: /host }\n'), error: /services\.side\.volumes/ },
    // The named-volume way to a host path: a local volume whose driver_opts bind the host's root.
    { name: 'volume-driver-opts-bind', compose: `${side('    volumes: ["state:/host"]\n')}volumes:\n  state:\n    driver_opts: { type: none, o: bind, device: / }\n`, error: /volumes\.state.*driver_opts/ },
    { name: 'volume-external', compose: `${side('    volumes: ["state:/x"]\n')}volumes:\n  state:\n    external: true\n    name: rollout-fleet-other-episode\n`, error: /volumes\.state.*external/ },
    // A YAML merge key that brings privileged in from an extension field.
    { name: 'merge-key-privileged', compose: 'x-base: &base\n  privileged: true\nservices:\n  main: {}\n  side:\n    <<: *base\n    image: python:3.12-slim\n', error: /services\.side\.(privileged|<<)/ },
    { name: 'upper-case-key', compose: side('    Privileged: true\n'), error: /services\.side\.Privileged/ },
    { name: 'path-name', compose: 'services:\n  main: {}\n  "../../../tmp/rf-sh-escape":\n    image: python:3.12-slim\n', error: /services/ },
  ];

  it.each(CASES)('$name', async ({ name, compose, error }) => {
    const before = await env.episodes.getJobCounts();
    const err = await enqueueFile(env, await batchOf([await variant(name, compose)])).then(() => undefined, (e: Error) => e);
    expect(err, `${name} was enqueued`).toBeInstanceOf(Error);
    expect(err!.message).toMatch(error);
    // Never the value of a secret or of the fleet's Redis.
    expect(err!.message).not.toContain(fakeSecret);
    expect(err!.message).not.toContain(env.redis.url);
    expect(await env.episodes.getJobCounts()).toEqual(before);
  });

  it('a build context that is a symlink in environment/ to a folder outside the task is refused', async () => {
    const outside = path.join(scratch, 'outside-ctx');
    await mkdir(outside, { recursive: true });
    await writeFile(path.join(outside, 'Dockerfile'), 'FROM python:3.12-slim\n');
    const dir = await variant('symlink-context', 'services:\n  main: {}\n  side:\n    build: { context: ./ctx }\n');
    await symlink(outside, path.join(dir, 'environment', 'ctx'));
    const before = await env.episodes.getJobCounts();
    await expect(enqueueFile(env, await batchOf([dir]))).rejects.toThrow(/services\.side\.build/);
    expect(await env.episodes.getJobCounts()).toEqual(before);
  });

  it('a 10 KB service name is refused with a short message', async () => {
    const longName = 'x'.repeat(10 * 1024);
    const before = await env.episodes.getJobCounts();
    // An explicit key (`? name`): YAML's 1024-character limit is for implicit keys only, so the name reaches the compose reader.
    const err = await enqueueFile(env, await batchOf([await variant('long-name', `services:\n  main: {}\n  ? ${longName}\n  : image: python:3.12-slim\n`)])).then(() => undefined, (e: Error) => e);
    expect(err, 'the long name was enqueued').toBeInstanceOf(Error);
    expect(err!.message).toMatch(/services\."?x+/);
    expect(err!.message).not.toContain(longName);
    expect(err!.message.length).toBeLessThan(2000);
    expect(await env.episodes.getJobCounts()).toEqual(before);
  });

  it('a YAML alias bomb and 500 services: `enqueue` refuses them quickly (exit 2), naming the compose file, enqueueing nothing', async () => {
    // Nine levels of nine: 387,420,489 strings once expanded. Run through the CLI, so a parser that expands it cannot hang this file.
    let bomb = 'x-a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n';
    const levels = 'abcdefghi';
    for (let i = 1; i < levels.length; i++) bomb += `x-${levels[i]}: &${levels[i]} [${Array(9).fill(`*${levels[i - 1]}`).join(', ')}]\n`;
    bomb += 'services:\n  main: {}\n  side:\n    image: python:3.12-slim\n    command: *i\n';
    const many = `services:\n  main: {}\n${Array.from({ length: 500 }, (_, i) => `  s${i}:\n    image: python:3.12-slim\n    command: ["sleep", "infinity"]\n`).join('')}`;
    const before = await env.episodes.getJobCounts();
    for (const [name, compose] of [['alias-bomb', bomb], ['many-services', many]] as const) {
      const started = Date.now();
      const run = await runCli(['enqueue', await batchOf([await variant(name, compose)])], env.env, 60_000);
      const sec = (Date.now() - started) / 1000;
      expect(run.code, `${name}: exit ${run.code} after ${sec} s\n${run.stdout.slice(-1000)}\n${run.stderr.slice(-2000)}`).toBe(2);
      expect(run.stderr.length, name).toBeLessThan(4000);
      expect(sec, name).toBeLessThan(30);
      console.log(`${name}: exit ${run.code} after ${sec.toFixed(1)} s: ${run.stderr.trim().split('\n')[0]!.slice(0, 300)}`);
      expect(await env.episodes.getJobCounts()).toEqual(before);
      // USAGE.md: the message names the file (the compose file, not task.toml) and the field.
      expect(run.stderr, name).toMatch(/docker-compose\.yaml/);
    }
  }, 150_000);

  it('a Terminal-Bench 1 sidecar with host networking or a host bind is refused, naming the service and the key', async () => {
    const tb = await readFile(path.join(TB1, 'docker-compose.yaml'), 'utf8');
    expect(tb).toContain('  server:\n    build:\n');
    const cases = {
      'tb1-host-network': { compose: tb.replace('  server:\n    build:\n', '  server:\n    network_mode: host\n    build:\n'), error: /server.*network_mode|network_mode.*server/ },
      'tb1-host-bind': { compose: tb.replace('  server:\n    build:\n', '  server:\n    volumes: ["/etc:/host-etc:ro"]\n    build:\n'), error: /server.*volumes|volumes.*server/ },
    };
    for (const [name, { compose, error }] of Object.entries(cases)) {
      const before = await env.episodes.getJobCounts();
      const dir = await variant(name, compose, TB1, 'docker-compose.yaml');
      await expect(enqueueFile(env, await batchOf([dir])), name).rejects.toThrow(error);
      expect(await env.episodes.getJobCounts()).toEqual(before);
    }
  });
});

describe('a kill -9 of the worker while an episode\'s sidecars are still starting', () => {
  let env: FleetEnv;
  const spawned: WorkerProcess[] = [];
  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(spawned.map((w) => w.stop()));
    await env?.close();
  });

  it('the reaper removes the holder, the sidecar and the volume; another worker runs the episode afresh', async () => {
    const fast = { FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000', FLEET_LOCK_DURATION_MS: '4000' };
    const victim = spawnWorker({ ...env.env, ...fast }, 'victim');
    spawned.push(victim);
    const file = path.join(await mkdtemp(path.join(os.tmpdir(), 'rf-sh-kill-')), 'batch.yaml');
    await writeFile(file, `tasks: [${JSON.stringify(path.join(FIXTURES, 'slow-start'))}]\nagent: { kind: oracle }\n`);
    const plan = await enqueueFile(env, file);
    // The gate sidecar runs (it wrote to the volume) and waits for /tmp/ready: main is not made yet.
    const gate = await waitFor('the victim\'s sidecar started, main not yet', async () => {
      const parts = await fleetContainers('worker', 'victim');
      const service = parts.find((c) => c.Labels[LABEL.environmentRole] === 'service' && c.State === 'running');
      return service && !parts.some((c) => c.Labels[LABEL.environmentRole] === 'main') ? service : undefined;
    }, 180_000, 200);
    expect((await execIn(gate.Id, ['cat', '/state/gate.txt'])).out).toContain('started');
    const before = await leftOf('worker', 'victim');
    expect(before.volumes).toHaveLength(1);
    expect(before.containers.length).toBeGreaterThanOrEqual(2);
    victim.child.kill('SIGKILL');
    const rescuer = spawnWorker({ ...env.env, ...fast }, 'rescuer');
    spawned.push(rescuer);
    await waitFor('every part of the victim\'s environment reaped', async () => {
      const left = await leftOf('worker', 'victim');
      return left.containers.length === 0 && left.volumes.length === 0;
    }, 90_000, 200);
    // The rescuer's own sidecar: let it turn healthy.
    const theirs = await waitFor('the rescuer\'s sidecar running', async () => (await fleetContainers('worker', 'rescuer')).find((c) => c.Labels[LABEL.environmentRole] === 'service' && c.State === 'running'), 180_000, 200);
    expect((await execIn(theirs.Id, ['touch', '/tmp/ready'])).code).toBe(0);
    const [result] = await waitForResults(env, plan.batchId, 1, 180_000);
    expect(result, JSON.stringify(result)).toMatchObject({ status: 'passed', reward: 1, workerId: 'rescuer' });
    await waitForNoContainers(plan.batchId, 30_000);
    expect(await leftOf('batch', plan.batchId)).toEqual({ containers: [], volumes: [] });
  }, 360_000);
});

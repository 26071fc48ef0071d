// The Python client package (clients/python) against the real API, worker and Docker engine, as a
// trainer in Python would use it:
// - installed into a fresh venv with the README's command, in a network namespace with no network and
//   with pip's own configuration (local indexes, find-links) set aside: nothing is fetched;
// - `python3 -m mypy --strict` on it is clean (Debian's python3-mypy);
// - its dataclasses match the schemas of the running API's /openapi.json;
// - a 100-episode batch (25 cheap command-agent tasks, 4 samples; a third always pass, a third at
//   random, a third never) is streamed at once by the sync client (SSE) and the asyncio client
//   (NDJSON), each through a loopback TCP relay that cuts its first three stream connections, one of
//   them in the middle of an event: each client gets every episode exactly once, in the completion
//   stream's order, and every task's group once, after its last result, with the recorded rewards;
//   the end event's summary is the batch's;
// - the other calls (upload, create again, status, the batch listing, cancel, retry by kind) and
//   errors that name the field and the value sent;
// - examples/trainer/trainer.py, now a short loop on the package, runs against the same batch.
// - setting and reading an endpoint's policy version, sync and asyncio: versions only move forward (a
//   lower one is a 409 naming `version`, a negative one a 400), none set yet is None.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type http from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../src/api/api-server.ts';
import { FleetClient } from '../../src/client/fleet-client.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, silentLog, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';

const TOKEN = 'python-client-token-3c9e41';
const PACKAGE = path.join(ROOT, 'clients/python');
const CHECKS = path.join(PACKAGE, 'tests/fleet_checks.py');
const TASKS = 25;
const SAMPLES = 4;
const TOTAL = TASKS * SAMPLES;
const COMMAND = 'echo fixed > state.txt';

interface Proc { code: number | null; stdout: string; stderr: string; ms: number }

/** Run a program to its end (killed after `timeoutMs`), its output kept. */
async function exec(file: string, args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number } = {}): Promise<Proc> {
  const started = Date.now();
  const child = spawn(file, args, { env: opts.env ?? process.env, cwd: opts.cwd ?? ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const killer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000);
  const [code] = (await once(child, 'close')) as [number | null];
  clearTimeout(killer);
  return { code, stdout, stderr, ms: Date.now() - started };
}

/** The environment without pip's settings from this machine (its local indexes and find-links). */
function pipFree(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('PIP_') && !k.startsWith('PYTHON')) env[k] = v;
  return { ...env, PIP_CONFIG_FILE: '/dev/null', PIP_DISABLE_PIP_VERSION_CHECK: '1' };
}

/** The interpreter with Debian's mypy: `python3` when it has it, else Debian's own /usr/bin/python3. */
async function mypyPython(): Promise<string> {
  for (const py of ['python3', '/usr/bin/python3']) {
    const probe = await exec(py, ['-m', 'mypy', '--version']).catch(() => undefined);
    if (probe?.code === 0) return py;
  }
  throw new Error('no python3 with mypy: .ci/setup-host.sh installs python3-mypy');
}

interface RelayCut { connection: number; events: number; mid: boolean }

/**
 * A loopback TCP relay in front of the API. Stream connections (GET .../results) are cut as planned,
 * in order: `{ after: n }` closes both sides right after the n-th event, `{ after: n, mid: true }`
 * half-way through the n-th event's bytes. An event ends at `}\n\n` (SSE) or `}\n` (NDJSON).
 */
async function startRelay(target: number, plan: { after: number; mid?: boolean }[]) {
  const cuts: RelayCut[] = [];
  let streams = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    sockets.add(client);
    const upstream = net.connect(target, '127.0.0.1');
    sockets.add(upstream);
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', close);
    upstream.on('error', close);
    client.on('close', close);
    upstream.on('close', close);
    client.once('data', (first: Buffer) => {
      const head = first.toString('latin1');
      const isStream = /^GET [^ ]*\/results/.test(head);
      const cut = isStream ? plan[streams] : undefined;
      const connection = isStream ? ++streams : 0;
      upstream.write(first);
      client.pipe(upstream);
      if (cut === undefined) {
        upstream.pipe(client);
        return;
      }
      const marker = /accept: *text\/event-stream/i.test(head) ? '}\n\n' : '}\n';
      let events = 0;
      upstream.on('data', (chunk: Buffer) => {
        const text = chunk.toString('latin1');
        let from = 0;
        let previous = 0;
        for (;;) {
          const at = text.indexOf(marker, from);
          if (at < 0) break;
          const end = at + marker.length;
          events += 1;
          if (events === cut.after) {
            const upTo = cut.mid ? previous + Math.floor((end - previous) / 2) : end;
            client.write(chunk.subarray(0, upTo), () => close());
            cuts.push({ connection, events, mid: cut.mid === true });
            upstream.removeAllListeners('data');
            return;
          }
          previous = end;
          from = end;
        }
        client.write(chunk);
      });
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    cuts,
    streams: () => streams,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** 25 task folders p00..p24: the agent writes `fixed`; verifiers pass always, at random, or never. */
async function writeTasks(): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-pyc-tasks-'));
  const verifiers = [
    'grep -qx fixed state.txt\n',
    'grep -qx fixed state.txt && [ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 ]\n',
    'grep -qx solved state.txt\n',
  ];
  for (let i = 0; i < TASKS; i++) {
    const id = `p${String(i).padStart(2, '0')}`;
    await mkdir(path.join(dir, id, 'workspace'), { recursive: true });
    await mkdir(path.join(dir, id, 'tests'));
    await writeFile(path.join(dir, id, 'task.yaml'), `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: sh /tests/test.sh\n  timeoutSec: 10\ndeadlineSec: 120\n`);
    await writeFile(path.join(dir, id, 'workspace', 'state.txt'), 'broken\n');
    await writeFile(path.join(dir, id, 'tests', 'test.sh'), verifiers[i % 3]!);
  }
  return dir;
}

type ResultEntry = { kind: 'result'; cursor: string; episodeId: string; taskId: string; sample: number; status: string; reward: number | null; type: string };
type GroupEntry = { kind: 'group'; cursor: string; taskId: string; episodeIds: string[]; rewards: (number | null)[]; type: string };
interface StreamReport { events: (ResultEntry | GroupEntry)[]; reconnects: number; ended: boolean; summary: { batchId: string; total: number; done: number; finished: boolean } | null; summaryType: string }

describe('the Python client package', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let client: FleetClient;
  let server: http.Server;
  let base: string;
  let venv: string;
  let python: string;
  let scratch: string;
  let tasks: string;
  let batchId: string;

  beforeAll(async () => {
    env = await startFleetEnv();
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
    server = createApiApp({ client, token: TOKEN, log: silentLog }).listen(0, '127.0.0.1');
    await once(server, 'listening');
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    scratch = await mkdtemp(path.join(os.tmpdir(), 'rf-pyc-'));
    venv = path.join(scratch, 'venv');
    python = path.join(venv, 'bin/python');
  });
  afterAll(async () => {
    await worker?.close();
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await client?.close();
    await env?.close();
    if (scratch) await rm(scratch, { recursive: true, force: true });
    if (tasks) await rm(tasks, { recursive: true, force: true });
  });

  it('installs into a fresh venv with no network, with the README\'s command', async () => {
    // The README's command, in a network namespace of its own (loopback only, down): nothing can be fetched.
    const command = `python3 -m venv ${venv} && ${venv}/bin/pip install --no-index ./clients/python`;
    const readme = await readFile(path.join(ROOT, 'README.md'), 'utf8');
    expect(readme).toContain('python3 -m venv .venv && .venv/bin/pip install --no-index ./clients/python');
    const install = await exec('unshare', ['--net', 'sh', '-c', command], { env: pipFree(), timeoutMs: 180_000 });
    if (install.code !== 0) console.log(install.stdout, install.stderr);
    expect(install.code).toBe(0);
    expect(install.stdout).toContain('Successfully installed rollout-fleet-0.1.0');
    // Imported from the venv (not the source folder: run elsewhere), with its type marker.
    const where = await exec(python, ['-c', 'import rollout_fleet, os; print(rollout_fleet.__file__); print(os.path.exists(os.path.join(os.path.dirname(rollout_fleet.__file__), "py.typed")))'], { cwd: scratch, env: pipFree() });
    expect(where.code).toBe(0);
    const [file, typed] = where.stdout.trim().split('\n');
    expect(file!.startsWith(path.join(venv, 'lib'))).toBe(true);
    expect(typed).toBe('True');
  }, 200_000);

  it('type-checks clean with mypy --strict (for Python 3.9)', async () => {
    const py = await mypyPython();
    const check = await exec(py, ['-m', 'mypy', '--strict', '--python-version', '3.9', '--cache-dir', '/dev/null', 'clients/python/rollout_fleet'], { timeoutMs: 180_000 });
    console.log(`python client: ${py} -m mypy: ${check.stdout.trim()}`);
    expect(check.stdout + check.stderr).toMatch(/^Success: no issues found in \d+ source files$/m);
    expect(check.code).toBe(0);
  }, 200_000);

  it("matches the running API's OpenAPI schemas, class by class and field by field", async () => {
    const check = await exec(python, [path.join(PACKAGE, 'tests/check_schema.py'), `${base}/openapi.json`], { cwd: scratch, env: pipFree() });
    console.log(`python client: ${check.stdout.trim().split('\n').at(-1)}`);
    expect(check.stdout).toMatch(/^checked \d+ classes against \d+ schemas: \d+ types compared, 0 mismatches$/m);
    expect(check.code).toBe(0);
  });

  it('streams 100 episodes exactly once through three cut connections (one mid-event), sync over SSE and asyncio over NDJSON', async () => {
    worker = await startEnvWorker(env, 'pyc-w', { concurrency: 5 });
    tasks = await writeTasks();
    const py = (code: string) => exec(python, ['-c', code], { cwd: scratch, env: { ...pipFree(), FLEET_API_TOKEN: TOKEN } });
    const created = await py(`import rollout_fleet as rf; f = rf.FleetClient(${JSON.stringify(base)}); b = f.create_batch("py-client", f.upload_tasks(${JSON.stringify(tasks)}), samples=${SAMPLES}, agent={"kind": "command", "command": ${JSON.stringify(COMMAND)}}); print(b.batch_id, b.episodes, b.added)`);
    expect(created.stderr).toBe('');
    const [id, episodes, added] = created.stdout.trim().split(' ');
    batchId = id!;
    expect([episodes, added]).toEqual([String(TOTAL), 'True']);

    // Three cuts per client, at different events; then the relay lets the stream through.
    const sseRelay = await startRelay((server.address() as AddressInfo).port, [{ after: 9 }, { after: 6, mid: true }, { after: 13 }]);
    const ndRelay = await startRelay((server.address() as AddressInfo).port, [{ after: 11, mid: true }, { after: 4 }, { after: 17 }]);
    try {
      const started = Date.now();
      const stream = (mode: string, media: string, relay: string) => exec(python, [CHECKS, 'stream', '--api', relay, '--batch', batchId, '--mode', mode, '--media', media, '--report', path.join(scratch, `${mode}.json`)], { cwd: scratch, env: { ...pipFree(), FLEET_API_TOKEN: TOKEN }, timeoutMs: 400_000 });
      const [sync, aio] = await Promise.all([stream('sync', 'sse', sseRelay.url), stream('async', 'ndjson', ndRelay.url)]);
      for (const p of [sync, aio]) if (p.code !== 0) console.log(p.stdout, p.stderr);
      expect(sync.code).toBe(0);
      expect(aio.code).toBe(0);
      console.log(`python client: ${TOTAL} episodes streamed in ${((Date.now() - started) / 1000).toFixed(1)} s; cuts sync ${JSON.stringify(sseRelay.cuts)}, async ${JSON.stringify(ndRelay.cuts)}`);
      // Each relay cut three stream connections, one of them mid-event.
      for (const relay of [sseRelay, ndRelay]) {
        expect(relay.cuts).toHaveLength(3);
        expect(relay.cuts.filter((c) => c.mid)).toHaveLength(1);
        expect(relay.streams()).toBeGreaterThanOrEqual(4);
      }
    } finally {
      await sseRelay.close();
      await ndRelay.close();
    }

    const manifest = (await env.results.getManifest(batchId))!;
    const completion = (await env.results.completions(batchId, '0', { count: 10 * TOTAL })).map((c) => c.cursor);
    const recorded = new Map((await env.results.results(batchId)).map((r) => [r.episodeId, r]));
    const summary = await client.status(batchId);
    for (const mode of ['sync', 'async']) {
      const report = JSON.parse(await readFile(path.join(scratch, `${mode}.json`), 'utf8')) as StreamReport;
      expect(report.ended, mode).toBe(true);
      expect(report.reconnects, mode).toBeGreaterThanOrEqual(3);
      const results = report.events.filter((e): e is ResultEntry => e.kind === 'result');
      // Every episode exactly once, in the order of the batch's completion stream, as recorded.
      expect(results.map((r) => r.episodeId).sort(), mode).toEqual([...manifest.episodeIds].sort());
      expect(new Set(results.map((r) => r.episodeId)).size, mode).toBe(TOTAL);
      expect(results.map((r) => r.cursor), mode).toEqual(completion);
      for (const r of results) {
        expect(r.type).toBe('ResultEvent');
        expect(r.reward, r.episodeId).toBe(recorded.get(r.episodeId)!.reward);
        expect(r.status, r.episodeId).toBe(recorded.get(r.episodeId)!.status);
      }
      expect(results.some((r) => r.reward === 1) && results.some((r) => r.reward === 0), mode).toBe(true);
      // Each task's group once, after its last result, with its samples' recorded rewards in sample order.
      const groups = report.events.filter((e): e is GroupEntry => e.kind === 'group');
      expect(groups.map((g) => g.taskId).sort(), mode).toEqual(Array.from({ length: TASKS }, (_, i) => `p${String(i).padStart(2, '0')}`));
      for (const g of groups) {
        const mine = manifest.episodeIds.filter((e) => recorded.get(e)!.taskId === g.taskId);
        expect(g.type).toBe('GroupEvent');
        expect(g.episodeIds, g.taskId).toEqual(mine);
        expect(g.rewards, g.taskId).toEqual(mine.map((e) => recorded.get(e)!.reward));
        const lastResult = Math.max(...mine.map((e) => report.events.findIndex((x) => x.kind === 'result' && x.episodeId === e)));
        expect(report.events.indexOf(g), g.taskId).toBeGreaterThan(lastResult);
      }
      // The end event carried the batch's summary, decoded into the dataclass.
      expect(report.summaryType, mode).toBe('BatchSummary');
      expect(report.summary, mode).toEqual(JSON.parse(JSON.stringify(summary)));
    }
    await waitForNoContainers(batchId, 60_000);
  }, 500_000);

  it('covers status, the listing, cancel, retry by kind and upload, with errors naming the field and the value', async () => {
    expect(batchId).toBeDefined();
    const surface = await exec(python, [CHECKS, 'surface', '--api', base, '--batch', batchId, '--tasks', tasks, '--name', 'py-client', '--samples', String(SAMPLES), '--command', COMMAND, '--report', path.join(scratch, 'surface.json')], { cwd: scratch, env: { ...pipFree(), FLEET_API_TOKEN: TOKEN } });
    if (surface.code !== 0) console.log(surface.stdout, surface.stderr);
    expect(surface.code).toBe(0);
    const out = JSON.parse(await readFile(path.join(scratch, 'surface.json'), 'utf8')) as Record<string, any>;
    expect(out.uploaded).toHaveLength(TASKS);
    expect(out.status).toMatchObject({ type: 'BatchSummary', total: TOTAL, done: TOTAL, finished: true });
    expect(out.again).toEqual({ batchId, added: false, episodes: TOTAL });
    // The extra batch's one episode was waiting or running when cancelled; the listing is newest first.
    const extra = out.extra.batchId as string;
    expect(Object.values(out.extra.cancel)).toHaveLength(1);
    expect(['cancelled', 'cancelling']).toContain(Object.values(out.extra.cancel)[0]);
    expect(out.firstPage).toEqual({ ids: [extra], next: extra });
    expect(out.allBatches).toEqual([extra, batchId]);
    // Cancelling the finished batch: every episode had ended already.
    expect(new Set(Object.values(out.cancel))).toEqual(new Set(['ended']));
    expect(Object.keys(out.cancel)).toHaveLength(TOTAL);
    expect(out.retry).toEqual({ requeued: [], missing: [], pending: [] });
    expect(out.result).toMatch(new RegExp(`^${batchId}\\.`));
    expect(out.badSamples).toMatchObject({ status: 400, field: 'samples', value: 0 });
    expect(out.badTask).toMatchObject({ status: 422, value: '0'.repeat(64) });
    expect(out.badTask.field).toMatch(/^tasks/);
    expect(out.badKind).toMatchObject({ status: 400, field: 'kind', value: 'cosmic' });
    expect(out.noBatch).toMatchObject({ status: 404, field: 'batchId' });
    expect(out.badCursor).toMatchObject({ status: 400, field: 'Last-Event-ID', value: '9999999999999-0' });
    expect(out.wrongToken).toMatchObject({ status: 401, field: 'authorization' });
    expect(out.wrongToken.text).not.toContain('wrong-token-4411');
    expect(out.noTaskYaml.status).toBe(400);
    expect(out.noTaskYaml.message).toContain('task.yaml: not in the archive');
    expect(out.async).toEqual({ total: TOTAL, badSamples: { status: 400, field: 'samples', value: 0 }, listed: 2 });
    await waitForResults(env, extra, 1, 60_000);
    await waitForNoContainers(extra, 60_000);
  }, 120_000);

  it('sets and reads a policy version, sync and asyncio: forward only, errors naming the field', async () => {
    const endpoint = `py-policy-${process.pid}`;
    const report = path.join(scratch, 'policy.json');
    const ran = await exec(python, [CHECKS, 'policy', '--api', base, '--endpoint', endpoint, '--report', report], { cwd: scratch, env: { ...pipFree(), FLEET_API_TOKEN: TOKEN } });
    if (ran.code !== 0) console.log(ran.stdout, ran.stderr);
    expect(ran.code).toBe(0);
    const out = JSON.parse(await readFile(report, 'utf8')) as Record<string, any>;
    expect(out.before).toBeNull();
    expect(out.set3).toMatchObject({ type: 'PolicyVersion', endpoint, version: 3 });
    expect(Date.parse(out.set3.setAt)).toBeGreaterThan(0);
    expect(out.get3).toEqual({ version: 3, setAt: out.set3.setAt });
    expect(out.lower).toMatchObject({ status: 409, field: 'version' });
    expect(out.negative).toMatchObject({ status: 400, field: 'version', value: -1 });
    expect(out.async).toEqual({ set5: 5, get5: 5, lower: { status: 409, field: 'version' } });
    // The fleet's own client sees what the Python one set.
    expect(await client.getPolicyVersion(endpoint)).toMatchObject({ version: 5 });
  }, 60_000);

  it('runs examples/trainer/trainer.py, a short loop on the package, against the same batch', async () => {
    const trainer = path.join(ROOT, 'examples/trainer/trainer.py');
    expect((await readFile(trainer, 'utf8')).split('\n').length).toBeLessThan(100);
    const args = [trainer, '--api', base, '--tasks', tasks, '--samples', String(SAMPLES), '--name', 'py-client', '--agent-command', COMMAND];
    const ok = await exec(python, args, { cwd: scratch, env: { ...pipFree(), FLEET_API_TOKEN: TOKEN } });
    if (ok.code !== 0) console.log(ok.stdout, ok.stderr);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toContain(`batch ${batchId}: ${TOTAL} episodes (created before: from the start)`);
    expect(ok.stdout.match(/^group p\d\d: rewards [\d. -]+, advantages [\d. -]+ \(\d+\/100 done\)$/gm)).toHaveLength(TASKS);
    expect(ok.stdout).toMatch(new RegExp(`^batch ${batchId}: 100/100 episodes, mean reward [\\d.]+, pass@1 [\\d.]+, pass@4 [\\d.]+; 0 reconnects$`, 'm'));
    // A wrong token: exit 1 with the API's message and field, the token never printed.
    const wrong = 'not-the-token-but-secret-77c1';
    const bad = await exec(python, args, { cwd: scratch, env: { ...pipFree(), FLEET_API_TOKEN: wrong } });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain('HTTP 401');
    expect(bad.stderr).toContain('(field: authorization)');
    expect(bad.stdout + bad.stderr).not.toContain(wrong);
  }, 120_000);
});

// The Python example trainer (examples/trainer/trainer.py, standard library only) against the real API,
// workers and Docker engine: a 200-episode batch (50 cheap command-agent tasks, 4 samples each; a third
// always pass, a third pass at random, a third never) uploaded, created and consumed over the SSE stream
// with the connection dropped at three random events. Every episode is delivered exactly once, in the
// completion stream's order; every task's group once, right after its last result, with that task's
// rewards; and the first group arrives before 10% of the batch has finished (the trainer asks the API
// for the batch's done count when it gets its first group; the figure is printed). A wrong token: exit
// 1 with the API's message and field, the token never printed.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import type http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApiApp } from '../../src/api/api-server.ts';
import { FleetClient } from '../../src/client/fleet-client.ts';
import { EXAMPLES, ROOT, silentLog, spawnWorker, startFleetEnv, waitForNoContainers, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';

const TOKEN = 'python-trainer-token-5d1e8a';
const TRAINER = path.join(ROOT, 'examples/trainer/trainer.py');
const TASKS = 50;
const SAMPLES = 4;
const TOTAL = TASKS * SAMPLES;

interface Run { code: number | null; stdout: string; stderr: string; ms: number }

/** Run the trainer with `python3` to its end (killed after `timeoutMs`). */
async function runTrainer(args: string[], env: NodeJS.ProcessEnv, timeoutMs = 60_000): Promise<Run> {
  const started = Date.now();
  const child = spawn('python3', [TRAINER, ...args], { env: { ...env, PYTHONUNBUFFERED: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const killer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const [code] = (await once(child, 'close')) as [number | null];
  clearTimeout(killer);
  return { code, stdout, stderr, ms: Date.now() - started };
}

/** 50 task folders t00..t49: the agent writes `fixed`; verifiers pass always, at random, or never. */
async function writeTasks(): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-py-tasks-'));
  const verifiers = [
    'grep -qx fixed state.txt\n',
    'grep -qx fixed state.txt && [ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 ]\n',
    'grep -qx solved state.txt\n',
  ];
  for (let i = 0; i < TASKS; i++) {
    const id = `t${String(i).padStart(2, '0')}`;
    await mkdir(path.join(dir, id, 'workspace'), { recursive: true });
    await mkdir(path.join(dir, id, 'tests'));
    await writeFile(path.join(dir, id, 'task.yaml'), `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: sh /tests/test.sh\n  timeoutSec: 10\ndeadlineSec: 120\n`);
    await writeFile(path.join(dir, id, 'workspace', 'state.txt'), 'broken\n');
    await writeFile(path.join(dir, id, 'tests', 'test.sh'), verifiers[i % 3]!);
  }
  return dir;
}

/** Stream entry ids (`<ms>-<seq>`) in order. */
const before = (a: string, b: string) => {
  const [am, as] = a.split('-').map(BigInt) as [bigint, bigint];
  const [bm, bs] = b.split('-').map(BigInt) as [bigint, bigint];
  return am < bm || (am === bm && as < bs);
};

type ResultEntry = { kind: 'result'; cursor: string; episodeId: string; taskId: string; sample: number; status: string; reward: number | null };
type GroupEntry = { kind: 'group'; cursor: string; taskId: string; rewards: (number | null)[]; resultsBefore: number };
interface Report {
  batchId: string;
  total: number;
  events: (ResultEntry | GroupEntry)[];
  reconnects: number;
  firstGroup: { resultsBefore: number; batchDone: number; total: number } | null;
}

describe('the Python example trainer', () => {
  let env: FleetEnv;
  let client: FleetClient;
  let server: http.Server;
  let base: string;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
    server = createApiApp({ client, token: TOKEN, log: silentLog }).listen(0, '127.0.0.1');
    await once(server, 'listening');
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await client?.close();
    await env?.close();
  });

  it('exits 1 with the API\'s message and field on a wrong token, without printing the token', async () => {
    const wrong = 'not-the-token-but-secret-77c1';
    const run = await runTrainer(['--api', base, '--tasks', path.join(EXAMPLES, 'tasks')], { ...process.env, FLEET_API_TOKEN: wrong });
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('HTTP 401');
    expect(run.stderr).toContain('not the expected Bearer token');
    expect(run.stderr).toContain('(field: authorization)');
    expect(run.stdout + run.stderr).not.toContain(wrong);

    const unset = await runTrainer(['--api', base, '--token-env', 'NO_SUCH_TOKEN_VARIABLE'], { ...process.env, FLEET_API_TOKEN: TOKEN });
    expect(unset.code).toBe(2);
    expect(unset.stderr).toContain('NO_SUCH_TOKEN_VARIABLE');
    expect(unset.stdout + unset.stderr).not.toContain(TOKEN);
  });

  it('consumes a 200-episode batch over SSE with three random drops: each episode once, in completion order, groups early and right', async () => {
    // Two worker processes, four episodes each at a time; they take episodes in enqueue order.
    workers.push(spawnWorker(env.env, 'py-w0', 4), spawnWorker(env.env, 'py-w1', 4));
    const tasks = await writeTasks();
    // 250 events in all (200 results, 50 groups): three distinct drop points among the first 249.
    const drops = new Set<number>();
    while (drops.size < 3) drops.add(1 + Math.floor(Math.random() * (TOTAL + TASKS - 1)));
    const dropAt = [...drops].sort((a, b) => a - b);
    console.log(`python trainer: connection dropped after events ${dropAt.join(', ')}`);
    const reportFile = path.join(tasks, 'report.json');

    const run = await runTrainer([
      '--api', base, '--tasks', tasks, '--samples', String(SAMPLES), '--name', 'py-trainer',
      '--agent-command', 'echo fixed > state.txt', '--drop-at', dropAt.join(','), '--report', reportFile,
    ], { ...process.env, FLEET_API_TOKEN: TOKEN }, 360_000);
    if (run.code !== 0) console.log(`trainer stdout:\n${run.stdout}\ntrainer stderr:\n${run.stderr}\nworkers:\n${workers.map((w) => w.output()).join('\n')}`);
    expect(run.code).toBe(0);
    expect(run.stdout + run.stderr).not.toContain(TOKEN);
    const report = JSON.parse(await readFile(reportFile, 'utf8')) as Report;
    const { batchId } = report;
    console.log(`python trainer: ${TOTAL} episodes in ${(run.ms / 1000).toFixed(1)} s, ${report.reconnects} reconnects`);

    // Every episode exactly once, in the order of the batch's completion stream in Redis.
    const results = report.events.filter((e): e is ResultEntry => e.kind === 'result');
    const manifest = (await env.results.getManifest(batchId))!;
    expect(manifest.episodeIds).toHaveLength(TOTAL);
    expect(results.map((r) => r.episodeId).sort()).toEqual([...manifest.episodeIds].sort());
    expect(new Set(results.map((r) => r.episodeId)).size).toBe(TOTAL);
    const stream = await env.results.completions(batchId, '0', { count: 10 * TOTAL });
    expect(results.map((r) => r.cursor)).toEqual(stream.map((c) => c.cursor));
    for (let i = 1; i < results.length; i++) expect(before(results[i - 1]!.cursor, results[i]!.cursor)).toBe(true);
    // The rewards received are the ones recorded, and they vary (some tasks pass, some fail).
    const recorded = new Map((await env.results.results(batchId)).map((r) => [r.episodeId, r.reward]));
    for (const r of results) expect(r.reward).toBe(recorded.get(r.episodeId));
    expect(results.some((r) => r.reward === 1) && results.some((r) => r.reward === 0)).toBe(true);

    // Each task's group once, right after its last result, with its samples' rewards in sample order.
    const groups = report.events.filter((e): e is GroupEntry => e.kind === 'group');
    expect(groups.map((g) => g.taskId).sort()).toEqual(Array.from({ length: TASKS }, (_, i) => `t${String(i).padStart(2, '0')}`));
    for (const g of groups) {
      const mine = results.filter((r) => r.taskId === g.taskId);
      expect(g.rewards).toEqual([...mine].sort((a, b) => a.sample - b.sample).map((r) => r.reward));
      const at = report.events.indexOf(g);
      expect(report.events[at - 1]).toBe(mine.at(-1));
      expect(g.resultsBefore).toBe(results.indexOf(mine.at(-1)!) + 1);
    }
    expect(run.stdout.match(/^group t\d\d: mean reward [\d.]+ over 4 samples \(\d+\/200 episodes done\)$/gm)).toHaveLength(TASKS);
    expect(run.stdout).toMatch(new RegExp(`^batch ${batchId}: 200/200 episodes, 50 groups, mean reward [\\d.]+, pass@1 [\\d.]+, pass@4 [\\d.]+; \\d+ reconnects$`, 'm'));

    // Resumed at least three times, and the first group came before 10% of the batch had finished.
    expect(report.reconnects).toBeGreaterThanOrEqual(3);
    const first = report.firstGroup!;
    console.log(`python trainer: first group event after ${first.batchDone} of ${TOTAL} episodes finished (${((100 * first.batchDone) / TOTAL).toFixed(1)}%; ${first.resultsBefore} results received)`);
    expect(first.batchDone).toBeLessThan(TOTAL / 10);

    await waitForNoContainers(batchId, 60_000);
  }, 400_000);
});

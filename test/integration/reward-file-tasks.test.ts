// Tasks of the fleet's own format that opt in to a reward file (verify.reward: file,
// test/fixtures/reward-file): the verifier's reward.txt or reward.json is the grade, read as a Harbor
// task's is, its exit code ignored; partial credit is kept as a float with its metrics; a grader that
// wrote nothing is an error of kind verifier (a file the agent planted never counts); and the batch's
// passThreshold decides passed or failed, and pass@k, on real episodes.
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BatchSummaryBody, createApiApp } from '../../src/api/api-server.ts';
import { FleetClient, type BatchEvent } from '../../src/client/fleet-client.ts';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';
import { ROOT, enqueueFile, runCli, silentLog, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/reward-file');

describe('reward-file grading of our own tasks', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  /** The batch of the threshold test, read again through every surface by the last test. */
  let thresholdBatch: string | undefined;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'reward-file-w', { concurrency: 3 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  async function run(agent: string, extra = ''): Promise<{ batchId: string; byTask: Record<string, EpisodeResult> }> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-reward-file-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `name: reward-file\ntasks: [${JSON.stringify(FIXTURES)}]\nagent: ${agent}\nsamples: 1\n${extra}`);
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 240_000);
    await waitForNoContainers(plan.batchId);
    return { batchId: plan.batchId, byTask: Object.fromEntries(results.map((r) => [r.taskId, r])) };
  }

  it('the oracle gets full credit from the reward files; a grader that wrote none is an error, whatever the agent planted', async () => {
    const { byTask } = await run('{ kind: oracle }');
    expect(byTask['four-checks']).toMatchObject({ status: 'passed', reward: 1, metrics: { reward: 1 } });
    // The verifier exited 3: under exit-code grading a broken verifier, here ignored.
    expect(byTask['four-checks']!.verifier?.exitCode).toBe(3);
    expect(byTask['two-metrics']).toMatchObject({ status: 'passed', reward: 1, metrics: { correctness: 1, style: 1 } });
    expect(byTask['silent-grader']).toMatchObject({ status: 'error', reward: null, error: { kind: 'verifier', code: 'reward_file_missing' } });
    // The reward file is kept with the evidence, as a Harbor task's is.
    const logs = path.join(env.dataDir, 'evidence', byTask['four-checks']!.episodeId, 'attempt-1', 'logs', 'verifier');
    await expect(readFile(path.join(logs, 'reward.txt'), 'utf8')).resolves.toBe('1\n');
  });

  it('partial credit is a float with its metrics, failed under the default threshold of 1', async () => {
    const { batchId, byTask } = await run(`{ kind: command, command: "echo ok > a.txt; printf '42\\\\n\\\\n' > answer.txt" }`);
    expect(byTask['four-checks']).toMatchObject({ status: 'failed', reward: 0.25, metrics: { reward: 0.25 } });
    // No `reward` key in reward.json: the main reward is the mean of its values.
    expect(byTask['two-metrics']).toMatchObject({ status: 'failed', reward: 0.5, metrics: { correctness: 1, style: 0 } });
    const summary = await env.results.summary(batchId);
    expect(summary).toMatchObject({ passThreshold: 1, passAt: { 1: 0 }, byStatus: { passed: 0, failed: 2, error: 1 } });
    expect(summary!.meanReward).toBeCloseTo(0.375);
  });

  it("the batch's passThreshold makes the same partial credit a pass, and pass@k counts it", async () => {
    const { batchId, byTask } = await run(`{ kind: command, command: "echo ok > a.txt; printf '42\\\\n\\\\n' > answer.txt" }`, 'passThreshold: 0.25\n');
    expect(byTask['four-checks']).toMatchObject({ status: 'passed', reward: 0.25 });
    expect(byTask['two-metrics']).toMatchObject({ status: 'passed', reward: 0.5 });
    const summary = await env.results.summary(batchId);
    expect(summary).toMatchObject({ passThreshold: 0.25, passAt: { 1: 1 }, byStatus: { passed: 2, error: 1 } });
    expect((await env.results.getManifest(batchId))?.passThreshold).toBe(0.25);
    thresholdBatch = batchId;
  });

  it('floats and metrics reach the client, its group events and trajectories, the API and the CLI', async () => {
    const batchId = thresholdBatch!;
    expect(batchId).toBeDefined();
    const client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
    const server = http.createServer(createApiApp({ client, token: 'reward-file-token-0123', log: silentLog }));
    server.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const auth = { authorization: 'Bearer reward-file-token-0123' };
    try {
      // The client's stream, from the start: one group per task, its rewards and metrics by sample.
      const groups: Record<string, Extract<BatchEvent, { kind: 'group' }>> = {};
      for await (const event of client.results(batchId)) if (event.kind === 'group') groups[event.taskId] = event;
      expect(groups['four-checks']).toMatchObject({ rewards: [0.25], metrics: [{ reward: 0.25 }] });
      expect(groups['two-metrics']).toMatchObject({ rewards: [0.5], metrics: [{ correctness: 1, style: 0 }] });
      expect(groups['silent-grader']).toMatchObject({ rewards: [null], metrics: [null] });
      const episode = groups['two-metrics']!.episodeIds[0]!;
      expect(await client.trajectory(batchId, episode)).toMatchObject({ status: 'passed', reward: 0.5, metrics: { correctness: 1, style: 0 } });

      // The API: the summary as its OpenAPI schema says, strictly; the NDJSON stream's groups.
      const summary = await (await fetch(`${base}/v1/batches/${batchId}`, { headers: auth })).json();
      expect(BatchSummaryBody.parse(summary)).toMatchObject({ passThreshold: 0.25, metrics: { correctness: { mean: 1, n: 1 }, style: { mean: 0, n: 1 }, reward: { mean: 0.25, n: 1 } } });
      const lines = (await (await fetch(`${base}/v1/batches/${batchId}/results`, { headers: auth })).text()).trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(lines.filter((l) => l.kind === 'group').map((g) => [g.taskId, g.rewards, g.metrics]).sort()).toEqual([
        ['four-checks', [0.25], [{ reward: 0.25 }]], ['silent-grader', [null], [null]], ['two-metrics', [0.5], [{ correctness: 1, style: 0 }]],
      ]);
      const trajectory = await (await fetch(`${base}/v1/batches/${batchId}/episodes/${episode}/trajectory`, { headers: auth })).json();
      expect(trajectory).toMatchObject({ reward: 0.5, metrics: { correctness: 1, style: 0 } });
      // A bad threshold over HTTP: 400 naming the field and the value.
      for (const [bad, shown] of [[-1, '-1'], ['0.5', '"0.5"'], [null, 'null']] as const) {
        const res = await fetch(`${base}/v1/batches`, {
          method: 'POST', headers: { ...auth, 'content-type': 'application/json' },
          body: JSON.stringify({ name: 'bad', tasks: ['0'.repeat(64)], agent: { kind: 'oracle' }, passThreshold: bad }),
        });
        expect(res.status).toBe(400);
        expect(await res.json()).toMatchObject({ error: { field: 'passThreshold', message: expect.stringContaining(`passThreshold: expected a finite number greater than 0 (the reward an episode needs to pass) (got ${shown})`) } });
      }
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      await client.close();
    }

    // The CLI: status (text and JSON), JSON lines, CSV and trajectories.
    const status = await runCli(['status', batchId], env.env);
    expect(status.stdout).toContain('mean reward 0.375, pass@1 1.000 (passed: reward >= 0.25)');
    expect(status.stdout).toContain('metrics: correctness 1.000, reward 0.250, style 0.000');
    expect(JSON.parse((await runCli(['status', batchId, '--json'], env.env)).stdout)).toMatchObject({ passThreshold: 0.25, meanReward: 0.375 });
    const jsonl = (await runCli(['results', batchId, '--format', 'jsonl'], env.env)).stdout.trim().split('\n').map((l) => JSON.parse(l) as EpisodeResult);
    expect(jsonl.find((r) => r.taskId === 'four-checks')).toMatchObject({ reward: 0.25, metrics: { reward: 0.25 } });
    const csv = (await runCli(['results', batchId, '--format', 'csv'], env.env)).stdout.split('\n');
    expect(csv.find((l) => l.includes(',two-metrics,'))).toMatch(/,passed,,,0\.5,.*,"\{""correctness"":1,""style"":0\}"$/);
    const trajectories = (await runCli(['results', batchId, '--format', 'trajectories'], env.env)).stdout.trim().split('\n').map((l) => JSON.parse(l) as { taskId: string; metrics?: unknown });
    expect(trajectories.find((t) => t.taskId === 'two-metrics')?.metrics).toEqual({ correctness: 1, style: 0 });
  });

  it('the Python example trainer gets float rewards, advantages and metrics per group, and sets the threshold', async () => {
    const client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
    const token = 'reward-file-token-4567';
    const server = http.createServer(createApiApp({ client, token, log: silentLog }));
    server.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    const report = path.join(await mkdtemp(path.join(os.tmpdir(), 'rf-trainer-report-')), 'report.json');
    try {
      const { stdout } = await promisify(execFile)('python3', [
        path.join(ROOT, 'examples/trainer/grpo_advantages.py'), '--api', `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        '--tasks', FIXTURES, '--samples', '2', '--name', 'py-rewards', '--pass-threshold', '0.5', '--report', report,
        '--agent-command', "echo ok > a.txt; printf '42\\n\\n' > answer.txt",
      ], { env: { ...process.env, FLEET_API_TOKEN: token }, timeout: 240_000 });
      const got = JSON.parse(await readFile(report, 'utf8')) as { events: { kind: string; taskId: string; rewards?: unknown; advantages?: unknown; metrics?: unknown }[]; summary: Record<string, unknown> };
      const groups = Object.fromEntries(got.events.filter((e) => e.kind === 'group').map((g) => [g.taskId, g]));
      expect(groups['four-checks']).toMatchObject({ rewards: [0.25, 0.25], advantages: [0, 0], metrics: { reward: 0.25 } });
      expect(groups['two-metrics']).toMatchObject({ rewards: [0.5, 0.5], advantages: [0, 0], metrics: { correctness: 1, style: 0 } });
      expect(groups['silent-grader']).toMatchObject({ rewards: [null, null], advantages: [null, null], metrics: {} });
      // 0.25 fails and 0.5 passes at the threshold of 0.5 the trainer asked for.
      expect(got.summary).toMatchObject({ passThreshold: 0.5, byStatus: { passed: 2, failed: 2, error: 2 }, passAt: { 1: 0.5, 2: 0.5 } });
      expect(stdout).toMatch(/^group two-metrics: mean reward 0\.50 over 2 samples/m);
      expect(stdout).toMatch(/^  advantages 0\.00 0\.00; metrics correctness 1\.00, style 0\.00$/m);
      expect(stdout).toMatch(/pass@1 0\.500, pass@2 0\.500 \(passed: reward >= 0\.5\); 0 reconnects$/m);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      await client.close();
    }
  });

  it('an agent that owns /logs cannot plant a reward, nor leave /logs/verifier so that root (without capabilities) cannot empty it', async () => {
    // A task working in /logs: the agent owns the folder the verifier's reward files go in.
    const file = await writeBatch('name: planted\ntasks: [tasks]\nagent: { kind: command, command: "mkdir -p verifier/trap/deep && echo 1 > verifier/reward.txt && echo 1 > verifier/trap/deep/x && chmod 000 verifier/trap" }\n', {
      owned: {
        yaml: 'id: owned\ninstruction: anything\nworkdir: /logs\nverify: { command: sh /tests/test.sh, timeoutSec: 20, reward: file }\ndeadlineSec: 180\n',
        files: { 'workspace/README': 'x\n', 'tests/test.sh': 'ls -la /logs/verifier\necho 0.5 > /logs/verifier/reward.txt\n' },
      },
    });
    const plan = await enqueueFile(env, file);
    const [r] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(r).toMatchObject({ status: 'failed', reward: 0.5, attempts: 1 });
  });
});

// The operator's view in a real headless browser (Debian's chromium driven by playwright-core), on a
// real batch run by an in-process worker: without credentials the dashboard answers 401; with them it
// shows the queues in Bull Board, a finished episode's job, and the batch page with its charts and the
// episode's evidence, escaped. Also: /metrics, read-only Bull Board, redaction, path traversal.
import http from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium, type BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHECKPOINTS_QUEUE } from '../../queues/checkpoints/contract.ts';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { runCli, spawnDashboard, type Dashboard, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv, startEnvWorker, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const USER = 'operator';
const PASSWORD = 'correct horse battery staple';
const AUTH = `Basic ${Buffer.from(`${USER}:${PASSWORD}`).toString('base64')}`;
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

const task = (id: string, verify: string) => ({
  yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: ${verify}\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 30, verifySec: 20, closeSec: 20 }\n`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
});

describe('dashboard', () => {
  let env: FleetEnv;
  let worker: WorkerHandle | undefined;
  let dashboard: Dashboard | undefined;
  let context: BrowserContext | undefined;
  let profileDir: string | undefined;
  let batchId: string;
  let results: EpisodeResult[];
  let checkpointJobId: string;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'dashboard-w', { concurrency: 3 });
    // Two passing episodes, one failing, one whose verifier crashes (an error of kind verifier); the
    // agent prints markup that must be shown as text.
    const file = await writeBatch(
      `name: dash\ntasks: [tasks]\nsamples: 1\nagent: { kind: command, command: "echo '<script>window.pwned=1</script><b>bold</b>'; echo fixed > state.txt" }\n`,
      {
        good: task('good', 'grep -qx fixed state.txt'), also: task('also', 'grep -qx fixed state.txt'),
        bad: task('bad', 'grep -qx never state.txt'), crash: task('crash', 'exit 3'),
      },
    );
    const plan = await enqueueFile(env, file);
    batchId = plan.batchId;
    results = await waitForResults(env, batchId, 4);
    await waitForNoContainers(batchId);
    // A malformed checkpoint job carrying secrets by mistake: the writer refuses it (failed, not
    // retried), and Bull Board must not show the secrets.
    const { Queue } = await import('bullmq');
    const checkpoints = new Queue(CHECKPOINTS_QUEUE, { connection: env.client, prefix: env.prefix });
    const job = await checkpoints.add('checkpoint', {
      episodeId: results[0]!.episodeId, seq: 0, createdAt: new Date().toISOString(),
      state: { apiKey: 'sk-live-SECRET-1', nested: { Authorization: 'Bearer SECRET-2' }, turns: 1 },
    });
    checkpointJobId = job.id!;
    await waitFor('the checkpoint job to be refused', async () => (await job.getState()) === 'failed');
    await checkpoints.close();

    dashboard = await spawnDashboard(
      { ...env.env, FLEET_DASHBOARD_USER: USER, FLEET_DASHBOARD_PASSWORD: PASSWORD },
      ['--port', '0'],
    );
    profileDir = await mkdtemp(path.join(os.tmpdir(), 'rf-chromium-'));
    context = await chromium.launchPersistentContext(profileDir, { executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS, headless: true });
  }, 180_000);

  afterAll(async () => {
    await context?.close();
    if (profileDir) await rm(profileDir, { recursive: true, force: true });
    expect(await dashboard?.stop()).toBe(0);
    await worker?.close();
    // Worker and dashboard released every Redis connection: only the test's own is left.
    const clients = ((await env.client.client('LIST')) as string).trim().split('\n');
    await env?.close();
    expect(clients).toHaveLength(1);
  });

  it('refuses to start without credentials unless --local-only, which binds 127.0.0.1', async () => {
    const refused = await runCli(['dashboard', '--port', '0'], env.env);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('FLEET_DASHBOARD_USER and FLEET_DASHBOARD_PASSWORD are not set');
    const half = await runCli(['dashboard'], { ...env.env, FLEET_DASHBOARD_USER: USER });
    expect(half.stderr).toContain('must be set together');
    const local = await spawnDashboard({ ...env.env, FLEET_DASHBOARD_HOST: '0.0.0.0' }, ['--local-only', '--port', '0']);
    try {
      expect(local.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect((await fetch(`${local.url}/batches`)).status).toBe(200);
      // A DNS-rebinding page reaches 127.0.0.1 under its own host name: refused.
      const statusWithHost = (host: string) => new Promise<number>((resolve, reject) => {
        http.get(`${local.url}/batches`, { headers: { host } }, (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        }).on('error', reject);
      });
      expect(await statusWithHost('evil.example')).toBe(421);
      expect(await statusWithHost(`localhost:${new URL(local.url).port}`)).toBe(200);
    } finally {
      expect(await local.stop()).toBe(0);
    }
  });

  it('answers 401 without credentials (but /healthz), in the browser too', async () => {
    const url = dashboard!.url;
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    for (const p of ['/batches', '/queues/', '/queues/api/queues', '/metrics', `/batches/${batchId}`]) {
      const res = await fetch(`${url}${p}`);
      expect(res.status, p).toBe(401);
      expect(res.headers.get('www-authenticate')).toMatch(/^Basic realm=/);
    }
    const wrong = `Basic ${Buffer.from(`${USER}:wrong`).toString('base64')}`;
    expect((await fetch(`${url}/batches`, { headers: { authorization: wrong } })).status).toBe(401);
    // The browser gets the 401 and its challenge; having no credentials to answer with, it gives up.
    const page = await context!.newPage();
    const [res, navigation] = await Promise.all([
      page.waitForResponse(`${url}/batches`),
      page.goto(`${url}/batches`).then(() => 'loaded', (err: Error) => err.message),
    ]);
    expect(res.status()).toBe(401);
    expect(res.headers()['www-authenticate']).toMatch(/^Basic realm=/);
    expect(navigation).toContain('ERR_INVALID_AUTH_CREDENTIALS');
    await page.close();
  });

  it('shows the queues and a finished episode in Bull Board, read-only and redacted', async () => {
    const url = dashboard!.url;
    const page = await context!.newPage();
    await page.setExtraHTTPHeaders({ authorization: AUTH });
    await page.goto(`${url}/queues/`);
    for (const name of ['episodes', 'checkpoints', 'cleanup']) await page.getByText(name, { exact: true }).first().waitFor();
    const episodeId = results.find((r) => r.status === 'passed')!.episodeId;
    await page.goto(`${url}/queues/queue/episodes/${episodeId}`);
    await page.getByText(episodeId).first().waitFor();
    await page.screenshot({ path: '/tmp/rollout-fleet-bull-board-job.png', fullPage: true });
    // The job links back to the episode's page.
    expect(await page.getByRole('link', { name: 'Episode page' }).getAttribute('href')).toBe(`/batches/${batchId}/episodes/${episodeId}`);
    await page.close();

    // Read-only: Bull Board itself refuses writes (405), and cross-site writes are refused before it.
    const pause = await fetch(`${url}/queues/api/queues/episodes/pause`, { method: 'PUT', headers: { authorization: AUTH } });
    expect(pause.status).toBe(405);
    const crossSite = await fetch(`${url}/queues/api/queues/episodes/pause`, { method: 'PUT', headers: { authorization: AUTH, origin: 'http://evil.example' } });
    expect(crossSite.status).toBe(403);
    expect(await env.episodes.isPaused()).toBe(false);

    const job = await (await fetch(`${url}/queues/api/queues/${CHECKPOINTS_QUEUE}/${checkpointJobId}`, { headers: { authorization: AUTH } })).text();
    expect(job).toContain('[redacted]');
    expect(job).not.toContain('SECRET');
    expect(job).toContain('"turns":1');
  });

  it('shows the batch page with progress, outcome, charts, job links and escaped evidence', async () => {
    const url = dashboard!.url;
    const page = await context!.newPage();
    await page.setExtraHTTPHeaders({ authorization: AUTH });
    await page.goto(`${url}/batches`);
    await page.getByRole('link', { name: batchId }).click();
    await page.waitForURL(`**/batches/${batchId}`);
    expect(await page.locator('.progress').innerText()).toContain('4/4 done');
    const outcome = await page.locator('table.outcome').innerText();
    expect(outcome).toMatch(/passed\s+2/);
    expect(outcome).toMatch(/failed\s+1/);
    expect(outcome).toMatch(/error\s+1/);
    expect(await page.locator('table.kinds').innerText()).toMatch(/verifier\s+1/);
    expect(await page.locator('tr[data-episode$=".crash.0"]').innerText()).toContain('verifier/verifier_crashed');

    // Reward histogram: 10 bins, one failed episode at 0 and two passed at 1; the crash is not graded.
    const bars = page.locator('svg.histogram rect.bar');
    expect(await bars.count()).toBe(10);
    const counts = await bars.evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-count'))));
    expect(counts).toEqual([1, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    expect(Number(await bars.last().getAttribute('height'))).toBeGreaterThan(0);
    // Phase timings: a p50 and a p95 bar for setup, agent, verify and close.
    expect(await page.locator('svg.phases g.phase').evaluateAll((els) => els.map((e) => e.getAttribute('data-phase')))).toEqual(['setup', 'agent', 'verify', 'close']);
    expect(await page.locator('svg.phases rect.bar').count()).toBe(8);
    expect(await page.getByText('1 not graded').count()).toBe(1);
    const setupWidth = Number(await page.locator('g.phase[data-phase="setup"] rect.p95').getAttribute('width'));
    expect(setupWidth).toBeGreaterThan(0);
    await page.screenshot({ path: '/tmp/rollout-fleet-batch-page.png', fullPage: true });

    // Every episode links to its job in Bull Board; the link opens the job.
    const episodeId = results.find((r) => r.status === 'failed')!.episodeId;
    const row = page.locator(`tr[data-episode="${episodeId}"]`);
    expect(await row.locator('a.job').getAttribute('href')).toBe(`/queues/queue/episodes/${encodeURIComponent(episodeId)}`);
    expect(await page.locator('a.job').count()).toBe(4);

    // The episode page: its result and its evidence, with the agent's markup shown as text.
    await row.getByRole('link', { name: episodeId }).click();
    await page.getByText('attempt-1/agent.stdout.txt').waitFor();
    const stdout = page.locator('details.evidence', { hasText: 'attempt-1/agent.stdout.txt' }).locator('pre');
    expect(await stdout.innerText()).toContain('<script>window.pwned=1</script><b>bold</b>');
    expect(await page.locator('script, b').count()).toBe(0);
    expect(await page.evaluate(() => (globalThis as { pwned?: number }).pwned)).toBeUndefined();
    expect(await page.locator('pre.result').innerText()).toContain('"status": "failed"');
    await page.screenshot({ path: '/tmp/rollout-fleet-episode-page.png', fullPage: true });

    await page.locator('a.job').first().click();
    await page.getByText(episodeId).first().waitFor();
    await page.close();
  });

  it('serves only episodes of the batch: no path out of the evidence folder', async () => {
    const url = dashboard!.url;
    for (const p of [
      `/batches/${batchId}/episodes/..%2F..%2F..%2Fetc%2Fpasswd`,
      `/batches/${batchId}/episodes/other-episode`,
      '/batches/..%2F..%2Fetc',
    ]) {
      const res = await fetch(`${url}${p}`, { headers: { authorization: AUTH } });
      expect(res.status, p).toBe(404);
      expect(await res.text()).not.toContain('root:');
    }
  });

  it('exposes Prometheus metrics computed from results and queues', async () => {
    const text = await (await fetch(`${dashboard!.url}/metrics`, { headers: { authorization: AUTH } })).text();
    expect(text).toContain('rollout_fleet_episodes_total{status="passed",kind="none"} 2');
    expect(text).toContain('rollout_fleet_episodes_total{status="failed",kind="none"} 1');
    expect(text).toContain('rollout_fleet_episodes_total{status="error",kind="verifier"} 1');
    expect(text).toMatch(/rollout_fleet_episode_phase_duration_seconds_count\{phase="agent"\} 4/);
    expect(text).toMatch(/rollout_fleet_episode_phase_duration_seconds_bucket\{le="\+Inf",phase="setup"\} 4/);
    expect(text).toContain('rollout_fleet_queue_jobs{queue="episodes",state="completed"} 4');
    expect(text).toContain('rollout_fleet_queue_jobs{queue="checkpoints",state="failed"} 1');
    expect(text).toContain('rollout_fleet_queue_workers{queue="episodes"} 1');
    // One worker holds a lease; every episode mounted the runtime, all but the first preparation warm.
    expect(text).toContain('rollout_fleet_active_leases 1');
    expect(text).toMatch(/rollout_fleet_runtime_preparations_total\{warm="true"\} [34]/);
    expect(text).toMatch(/rollout_fleet_reaped_sandboxes \d+/);
    // A second scrape counts nothing twice.
    const again = await (await fetch(`${dashboard!.url}/metrics`, { headers: { authorization: AUTH } })).text();
    expect(again).toContain('rollout_fleet_episodes_total{status="passed",kind="none"} 2');
  });
});

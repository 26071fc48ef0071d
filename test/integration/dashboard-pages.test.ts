// The batch pages and the fleet page in a real headless browser (Debian's chromium driven by
// playwright-core), on a real batch of command agents with failing episodes, run by an in-process
// worker: the fleet page, opened before the worker and the batch exist, shows the worker, an episode
// running (with its phase), the queue depths and the throughput change without a reload; the batch
// list shows pass rate, mean reward, failures by kind and throughput; the batch page's filter leads to
// a failed episode. The screenshots in docs/screenshots/ are taken here, so they stay current.
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, enqueueFile, spawnDashboard, startEnvWorker, startFleetEnv, waitFor, waitForResults, type Dashboard, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const USER = 'operator';
const PASSWORD = 'pages-test-password';
const AUTH = `Basic ${Buffer.from(`${USER}:${PASSWORD}`).toString('base64')}`;
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const SCREENSHOTS = path.join(ROOT, 'docs', 'screenshots');

/** The number a page shows in an element now (NaN when it has none). */
const shown = async (page: Page, selector: string) => Number(await page.locator(selector).first().textContent({ timeout: 1_000 }).catch(() => 'NaN'));

const task = (id: string, verify: string) => ({
  yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: ${verify}\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 30, verifySec: 20, closeSec: 20 }\n`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
});

describe('dashboard pages', () => {
  let env: FleetEnv;
  let worker: WorkerHandle | undefined;
  let dashboard: Dashboard | undefined;
  let context: BrowserContext | undefined;
  let profileDir: string | undefined;
  let fleet: Page | undefined;
  let batchId: string;
  let results: EpisodeResult[];

  beforeAll(async () => {
    env = await startFleetEnv();
    dashboard = await spawnDashboard({ ...env.env, FLEET_DASHBOARD_USER: USER, FLEET_DASHBOARD_PASSWORD: PASSWORD }, ['--port', '0']);
    profileDir = await mkdtemp(path.join(os.tmpdir(), 'rf-chromium-'));
    context = await chromium.launchPersistentContext(profileDir, { executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS, headless: true, viewport: { width: 1400, height: 900 } });
    await context.setExtraHTTPHeaders({ authorization: AUTH });
    await mkdir(SCREENSHOTS, { recursive: true });
  }, 120_000);

  afterAll(async () => {
    await context?.close();
    if (profileDir) await rm(profileDir, { recursive: true, force: true });
    expect(await dashboard?.stop()).toBe(0);
    await worker?.close();
    await env?.close();
  });

  it('shows the fleet live: a worker, an episode running with its phase, queue depths and throughput change without a reload', async () => {
    const url = dashboard!.url;
    expect((await fetch(`${url}/fleet.json`)).status).toBe(401);
    const res = await fetch(`${url}/fleet`, { headers: { authorization: AUTH } });
    expect(res.headers.get('content-security-policy')).toBe("default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self'; base-uri 'none'; form-action 'self'");

    // Opened before any worker or batch: nothing runs.
    fleet = await context!.newPage();
    const errors: string[] = [];
    // Script errors, CSP refusals and failed fetches (but the favicon the browser asks for) would show here.
    fleet.on('console', (m) => {
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) errors.push(m.text());
    });
    fleet.on('pageerror', (e) => errors.push(e.message));
    fleet.on('response', (r) => {
      if (r.status() >= 400 && !r.url().endsWith('/favicon.ico')) errors.push(`${r.status()} ${r.url()}`);
    });
    await fleet.goto(`${url}/fleet`);
    expect(await fleet.locator('#t-workers tr.empty').count()).toBe(1);
    expect(await fleet.locator('#t-running tr.empty').count()).toBe(1);
    expect(await fleet.locator('[data-field="lastMinute"]').innerText()).toBe('0');
    const episodesQueue = fleet.locator('#t-queues tr[data-key="episodes"]');
    expect(await episodesQueue.locator('td.state-completed').innerText()).toBe('0');
    // Marks this document: still there at the end means the page never reloaded.
    await fleet.evaluate(() => Object.assign(globalThis, { fleetPageMark: 1 }));

    worker = await startEnvWorker(env, 'pages-w', { concurrency: 2, reaperIntervalMs: 2_000 });
    // Three tasks, two samples each: the agent takes a few seconds; "bad" fails its verifier, "crash"'s verifier crashes (kind verifier).
    const file = await writeBatch(
      'name: pages\ntasks: [tasks]\nsamples: 2\nagent: { kind: command, command: "sleep 3; echo fixed > state.txt" }\n',
      { good: task('good', 'grep -qx fixed state.txt'), bad: task('bad', 'grep -qx never state.txt'), crash: task('crash', 'exit 3') },
    );
    batchId = (await enqueueFile(env, file)).batchId;

    // The worker shows up, then an episode of the batch running in the agent phase; no reload.
    await fleet.locator('#t-workers tr[data-key="pages-w"]').waitFor({ timeout: 30_000 });
    const runningAgent = fleet.locator(`#t-running tr[data-key^="${batchId}."]`, { has: fleet.locator('td.phase', { hasText: 'agent' }) });
    await runningAgent.first().waitFor({ timeout: 60_000 });
    const row = await runningAgent.first().locator('td').allInnerTexts();
    expect(row[1]).toBe(batchId);
    expect(row[6]).toBe('pages-w');
    expect(await fleet.locator('#t-workers tr[data-key="pages-w"] meter').count()).toBe(1);
    // The queue: episodes active while they run, and completed ones counted as they end.
    const active = '#t-queues tr[data-key="episodes"] td.state-active';
    const completed = '#t-queues tr[data-key="episodes"] td.state-completed';
    await waitFor('episodes active on the page', async () => (await shown(fleet!, active)) > 0, 30_000);
    await waitFor('episodes completed on the page', async () => (await shown(fleet!, completed)) > 0, 90_000);
    await waitFor('the throughput of the last minute on the page', async () => (await shown(fleet!, '[data-field="lastMinute"]')) > 0, 30_000);
    // The screenshots with episodes both finished and running, if the batch is not over by then: the
    // fleet, and the batch list with the batch's throughput and ETA.
    await fleet.locator('#t-running tr[data-key]').first().waitFor({ timeout: 20_000 }).catch(() => undefined);
    await fleet.screenshot({ path: path.join(SCREENSHOTS, 'fleet.png'), fullPage: true });
    const list = await context!.newPage();
    await list.setViewportSize({ width: 1400, height: 240 });
    await list.goto(`${url}/batches`);
    const listed = list.locator(`table.batches tr[data-batch="${batchId}"]`);
    if ((await listed.locator('td.progress').innerText()).includes('running')) {
      expect(await listed.locator('td.throughput').innerText()).toMatch(/^\d+\.\d\/min$/);
      expect(await listed.locator('td.eta').innerText()).toMatch(/^\d+ (s|min)$/);
    }
    await list.screenshot({ path: path.join(SCREENSHOTS, 'batch-list.png'), fullPage: true });
    await list.close();

    results = await waitForResults(env, batchId, 6, 120_000);
    await waitFor('6 episodes completed on the page', async () => (await shown(fleet!, completed)) === 6, 30_000);
    await fleet.locator('#t-running tr.empty').waitFor({ timeout: 30_000 });
    // The reaper ran on this engine and said so.
    await fleet.locator('#t-reaper tr[data-key]').first().waitFor({ timeout: 30_000 });
    expect(await fleet.evaluate(() => (globalThis as { fleetPageMark?: number }).fleetPageMark)).toBe(1);
    expect(errors).toEqual([]);
  });

  it('lists the batch with pass rate, mean reward, failures by kind and throughput', async () => {
    const page = await context!.newPage();
    await page.goto(`${dashboard!.url}/batches`);
    const row = page.locator(`table.batches tr[data-batch="${batchId}"]`);
    expect(await row.locator('td.progress').innerText()).toBe('6/6');
    // 2 of 6 passed; graded: 2 passed (1) and 2 failed (0), the crashes are not graded.
    expect(await row.locator('td.pass-rate').innerText()).toBe('33.3%');
    expect(await row.locator('td.mean-reward').innerText()).toBe('0.500');
    expect(await row.locator('td.kinds').innerText()).toBe('verifier 2');
    expect(await row.locator('td.throughput').innerText()).toMatch(/^\d+\.\d\/min$/);
    expect(await row.locator('td.eta').innerText()).toBe('done');
    await page.close();
  });

  it('shows reward and pass@k by task and the timeline, and its filter leads to a failed episode', async () => {
    const page = await context!.newPage();
    await page.goto(`${dashboard!.url}/batches`);
    await page.getByRole('link', { name: batchId }).click();
    await page.waitForURL(`**/batches/${batchId}`);
    // Hardest first: "bad" (0.000), then "good" (1.000); "crash" was never graded.
    expect(await page.locator('table.tasks tbody tr').evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-task')))).toEqual(['bad', 'good', 'crash']);
    expect(await page.locator('table.tasks thead').innerText()).toMatch(/pass@1\s+pass@2/);
    expect(await page.locator('table.tasks tr[data-task="good"]').innerText()).toMatch(/good\s+2\s+2\s+0\s+1\.000\s+1\.000\s+1\.000/);
    expect(await page.locator('table.tasks tr[data-task="bad"]').innerText()).toMatch(/bad\s+2\s+0\s+0\s+0\.000\s+0\.000\s+0\.000/);
    const finishing = await page.locator('svg.timeline g.bin').evaluateAll((gs) => gs.reduce((n, g) => n + Number(g.getAttribute('data-count')), 0));
    expect(finishing).toBe(6);
    await page.screenshot({ path: path.join(SCREENSHOTS, 'batch.png'), fullPage: true });

    // The filter: failed episodes only, each with its transcript link; the first leads to its page.
    await page.locator('form.filters select[name="status"]').selectOption('failed');
    await page.locator('form.filters button[type="submit"]').click();
    await page.waitForURL(/status=failed/);
    const rows = page.locator('table.episodes tbody tr');
    const failed = results.filter((r) => r.status === 'failed').map((r) => r.episodeId).sort();
    expect(failed).toHaveLength(2);
    expect((await rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-episode')))).sort()).toEqual(failed);
    expect(await rows.locator('td.failed').count()).toBe(2);
    expect(await page.locator('p.matched').innerText()).toBe('2 of 6 episodes match');
    const first = rows.first();
    const episodeId = (await first.getAttribute('data-episode'))!;
    expect(await first.locator('a.transcript').getAttribute('href')).toBe(`/batches/${batchId}/episodes/${episodeId}/transcript`);
    await first.locator('a.episode').click();
    await page.waitForURL(`**/batches/${batchId}/episodes/${episodeId}`);
    expect(await page.locator('h1').innerText()).toBe(`Episode ${episodeId}`);
    expect(await page.locator('pre.result').innerText()).toContain('"status": "failed"');

    // By kind: the two verifier crashes.
    await page.goto(`${dashboard!.url}/batches/${batchId}?kind=verifier`);
    expect(await page.locator('table.episodes tbody tr td.error').count()).toBe(2);
    expect(await page.locator('table.episodes tbody tr').allInnerTexts()).toEqual([expect.stringContaining('verifier/verifier_crashed'), expect.stringContaining('verifier/verifier_crashed')]);
    // An unknown filter value is dropped, not echoed.
    await page.goto(`${dashboard!.url}/batches/${batchId}?status=%3Cscript%3E&task=%3Cb%3Ex`);
    expect(await page.locator('table.episodes tbody tr').count()).toBe(0);
    expect(await page.locator('script').count()).toBe(0);
    expect(await page.content()).not.toContain('<b>x');
    await page.close();
  });
});

// The episode transcript in a real headless browser (Debian's chromium driven by playwright-core), on
// episodes run by an in-process worker with the scripted model: a reference-agent episode shows every
// turn, tool call and the reward; one whose model call fails at its third turn is retried and resumes
// from its checkpoint, both attempts side by side; and a command agent that fills its model calls,
// its output, the workspace and the verifier's output with markup, scripts, NUL and control
// characters and very long lines gets a page on which all of it is inert text.
import http from 'node:http';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import type { Trajectory } from '../../src/evidence/trajectory.ts';
import { EPISODE_HEADER, TASK_HEADER } from '../../src/model/chat-protocol.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { RUNTIME_MOUNT_PATH } from '../../src/runtime/runtime-inputs.ts';
import { EXAMPLES, ROOT, enqueueFile, silentLog, spawnDashboard, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type Dashboard, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const USER = 'operator';
const PASSWORD = 'transcript horse battery';
const AUTH = `Basic ${Buffer.from(`${USER}:${PASSWORD}`).toString('base64')}`;
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const SCREENSHOTS = path.join(ROOT, 'docs', 'screenshots');

// What the hostile agent writes everywhere it can.
const EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"></details></pre><a href="javascript:window.__pwned=3">click me</a>';
const TOOL_NAME = '<svg onload=window.__pwned=4>';
const HOSTILE_AGENT = `
const EVIL = ${JSON.stringify(EVIL)};
const CTRL = 'nul[\\u0000] bel[\\u0007] esc[\\u001b[31m] rlo[\\u202e]';
const LONG = 'L'.repeat(50000);
const messages = [
  { role: 'system', content: 'system says ' + EVIL },
  { role: 'user', content: 'user says ' + EVIL + ' ' + CTRL },
  { role: 'assistant', content: 'assistant says ' + EVIL, tool_calls: [{ id: 'call_evil', type: 'function', function: { name: ${JSON.stringify(TOOL_NAME)}, arguments: JSON.stringify({ command: '</details><script>window.__pwned=5</script>', note: LONG }) } }] },
  { role: 'tool', tool_call_id: 'call_evil', content: 'tool says ' + EVIL + '\\n' + LONG },
];
const res = await fetch(process.env.OPENAI_BASE_URL + '/chat/completions', {
  method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer ' + process.env.OPENAI_API_KEY },
  body: JSON.stringify({ model: 'm', messages }),
});
console.log('model answered ' + res.status);
(await import('node:fs')).writeFileSync('evil.html', 'file says ' + EVIL + '\\n');
process.stdout.write('stdout says ' + EVIL + '\\n' + CTRL + '\\n' + LONG + '\\n');
process.stderr.write('stderr says ' + EVIL + '\\n');
`;

/**
 * The stub behind a relay that answers 503 once to set-port's call at its third turn (two assistant
 * messages in the prompt): with no upstream retries the agent fails with kind model, and the retried
 * attempt resumes from the checkpoint the first one left.
 */
async function flakyRelay(stub: ModelStub): Promise<{ baseUrl: string; failed: () => boolean; close: () => Promise<void> }> {
  const upstream = new URL(stub.baseUrl!);
  let failed = false;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const turn = (() => {
        try {
          return (JSON.parse(body.toString('utf8')) as { messages: { role: string }[] }).messages.filter((m) => m.role === 'assistant').length;
        } catch {
          return -1;
        }
      })();
      if (!failed && req.headers[TASK_HEADER] === 'set-port' && turn === 2) {
        failed = true;
        res.writeHead(503, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { type: 'internal_error', message: 'the relay fails this call once' } }));
        return;
      }
      const headers: Record<string, string> = { 'content-type': 'application/json' };
      for (const h of [EPISODE_HEADER, TASK_HEADER]) if (typeof req.headers[h] === 'string') headers[h] = req.headers[h];
      fetch(new URL(req.url!, upstream.origin), { method: req.method!, headers, ...(body.length > 0 && { body }) })
        .then(async (r) => res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'application/json' }).end(Buffer.from(await r.arrayBuffer())))
        .catch((err: Error) => res.writeHead(502).end(err.message));
    });
  });
  server.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  return {
    baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    failed: () => failed,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

describe('episode transcript', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let relay: Awaited<ReturnType<typeof flakyRelay>>;
  let worker: WorkerHandle | undefined;
  let dashboard: Dashboard | undefined;
  let context: BrowserContext | undefined;
  let profileDir: string | undefined;
  let llm: EpisodeResult[];
  let hostile: EpisodeResult;

  beforeAll(async () => {
    env = await startFleetEnv();
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0, host: '127.0.0.1' }, log: silentLog });
    relay = await flakyRelay(stub);
    worker = await startEnvWorker(env, 'transcript-w', {
      concurrency: 3, outputCapBytes: 256 * 1024,
      model: { baseUrl: relay.baseUrl, apiKey: 'sk-transcript-test', maxCalls: 20, maxTokens: 1_000_000, requestTimeoutMs: 30_000, upstreamRetries: 0 },
    });
    const tasks = (...ids: string[]) => `[${ids.map((id) => JSON.stringify(path.join(EXAMPLES, 'tasks', id))).join(', ')}]`;
    const llmPlan = await enqueueFile(env, await writeBatch(`name: transcript-llm\ntasks: ${tasks('fix-greeting', 'set-port')}\nagent: { kind: llm, maxTurns: 10 }\n`, {}));
    const hostilePlan = await enqueueFile(env, await writeBatch(
      `name: transcript-hostile\ntasks: [tasks]\nagent: { kind: command, command: ${JSON.stringify(`${RUNTIME_MOUNT_PATH}/bin/node hostile.mjs`)} }\n`,
      {
        'fix-greeting': {
          yaml: `id: fix-greeting\ninstruction: ${JSON.stringify(`make it ${EVIL}`)}\nverify:\n  command: ${JSON.stringify(`printf 'verifier says %s\\n' ${JSON.stringify(EVIL).replaceAll('$', '\\$')}; grep -q pwned evil.html`)}\n  timeoutSec: 10\ndeadlineSec: 120\n`,
          files: { 'workspace/hostile.mjs': HOSTILE_AGENT, 'tests/.keep': '' },
        },
      },
    ));
    [llm, [hostile]] = await Promise.all([
      waitForResults(env, llmPlan.batchId, 2, 240_000),
      waitForResults(env, hostilePlan.batchId, 1, 240_000) as Promise<[EpisodeResult]>,
    ]);
    await Promise.all([waitForNoContainers(llmPlan.batchId), waitForNoContainers(hostilePlan.batchId)]);

    dashboard = await spawnDashboard({ ...env.env, FLEET_DASHBOARD_USER: USER, FLEET_DASHBOARD_PASSWORD: PASSWORD }, ['--port', '0']);
    profileDir = await mkdtemp(path.join(os.tmpdir(), 'rf-chromium-'));
    context = await chromium.launchPersistentContext(profileDir, { executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS, headless: true, viewport: { width: 1500, height: 1000 } });
    await mkdir(SCREENSHOTS, { recursive: true });
  }, 300_000);

  afterAll(async () => {
    await context?.close();
    if (profileDir) await rm(profileDir, { recursive: true, force: true });
    expect(await dashboard?.stop()).toBe(0);
    await worker?.close();
    await relay?.close();
    await stub?.close();
    await env?.close();
  });

  const transcriptUrl = (r: EpisodeResult) => `${dashboard!.url}/batches/${r.batchId}/episodes/${r.episodeId}/transcript`;
  const trajectoryOf = async (r: EpisodeResult, attempt: number) =>
    JSON.parse(await readFile(path.join(env.dataDir, 'evidence', r.episodeId, `attempt-${attempt}`, 'trajectory.json'), 'utf8')) as Trajectory;
  const toolNames = (t: Trajectory, fromIndex = 0) => (t.messages.slice(fromIndex) as { role: string; tool_calls?: { function: { name: string } }[] }[])
    .flatMap((m) => (m.role === 'assistant' ? (m.tool_calls ?? []).map((c) => c.function.name) : []));

  async function open(url: string): Promise<{ page: Page; dialogs: string[]; console: string[]; csp: string | undefined }> {
    const page = await context!.newPage();
    const dialogs: string[] = [];
    const consoleLines: string[] = [];
    page.on('dialog', (d) => {
      dialogs.push(d.message());
      void d.dismiss();
    });
    page.on('console', (m) => consoleLines.push(m.text()));
    await page.setExtraHTTPHeaders({ authorization: AUTH });
    const res = await page.goto(url);
    expect(res?.status()).toBe(200);
    await page.locator('section.attempt').first().waitFor();
    return { page, dialogs, console: consoleLines, csp: res?.headers()['content-security-policy'] };
  }

  it('shows a reference agent episode turn by turn: every turn with its timing, every tool call, the checkpoints, the diff and the reward', async () => {
    const result = llm.find((r) => r.taskId === 'fix-greeting')!;
    expect([result.status, result.reward, result.attempts]).toEqual(['passed', 1, 1]);
    const trajectory = await trajectoryOf(result, 1);
    expect(trajectory.turns.length).toBeGreaterThanOrEqual(3);

    // Reached from the episode page's link.
    const page = await context!.newPage();
    await page.setExtraHTTPHeaders({ authorization: AUTH });
    await page.goto(`${dashboard!.url}/batches/${result.batchId}/episodes/${result.episodeId}`);
    await page.getByRole('link', { name: 'transcript', exact: true }).click();
    await page.waitForURL('**/transcript');
    const attempt = page.locator('section.attempt[data-attempt="1"]');
    await attempt.waitFor();
    expect(await page.locator('section.attempt').count()).toBe(1);

    // Each turn of trajectory.json, in order, with its model call's duration and tokens.
    const turns = attempt.locator('li.turn');
    expect(await turns.count()).toBe(trajectory.turns.length);
    expect(await turns.evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-seq'))))).toEqual(trajectory.turns.map((t) => t.seq));
    const timings = await attempt.locator('li.turn .timing').allInnerTexts();
    timings.forEach((text, i) => {
      const usage = trajectory.turns[i]!.usage as { prompt_tokens: number; completion_tokens: number };
      expect(text).toContain(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
    });
    // The system and user messages, and every tool call by name, with its output and the agent's event.
    expect(await attempt.locator('li[data-role="system"]').count()).toBe(1);
    expect(await attempt.locator('li[data-role="user"]').innerText()).toContain('greet.sh');
    expect(await attempt.locator('.tool-call .tool-name').allInnerTexts()).toEqual(toolNames(trajectory));
    expect(await attempt.locator('.tool-call .tool-output').count()).toBe(toolNames(trajectory).length);
    expect(await attempt.locator('.tool-call[data-tool="bash"]').first().innerText()).toMatch(/ok, exit 0, \d+/);
    // A checkpoint after every turn (each called a tool), the verifier, the reward and the diff.
    expect(await attempt.locator('li.checkpoint').count()).toBe(trajectory.turns.length);
    expect(await attempt.locator('.outcome .reward').innerText()).toBe('1');
    expect(await page.locator('.summary .final-reward').innerText()).toBe('1');
    expect(await attempt.locator('pre.diff .da').count()).toBeGreaterThan(0);
    expect(await attempt.locator('pre.diff .dh').count()).toBeGreaterThanOrEqual(2);
    await page.close();
  });

  it('shows a retried episode\'s attempts side by side, the resumed one marked where it picked up', async () => {
    const result = llm.find((r) => r.taskId === 'set-port')!;
    expect(relay.failed()).toBe(true);
    expect([result.status, result.reward, result.attempts]).toEqual(['passed', 1, 2]);
    expect(result.resumedFrom).toBeGreaterThanOrEqual(1);
    const { page, dialogs } = await open(transcriptUrl(result));
    expect(await page.locator('section.attempt').count()).toBe(2);
    const [first, second] = [page.locator('section.attempt[data-attempt="1"]'), page.locator('section.attempt[data-attempt="2"]')];
    // Side by side: the second column starts to the right of the first, at the same height.
    const [a, b] = [(await first.boundingBox())!, (await second.boundingBox())!];
    expect(b.x).toBeGreaterThanOrEqual(a.x + a.width);
    expect(Math.abs(b.y - a.y)).toBeLessThan(5);

    expect(await first.locator('.outcome').first().innerText()).toMatch(/status error/);
    expect(await first.locator('.outcome.error').innerText()).toMatch(/^model\//);
    expect(await first.locator('li.turn').count()).toBe((await trajectoryOf(result, 1)).turns.length);
    expect(await first.locator(`li.checkpoint[data-seq="${result.resumedFrom}"]`).count()).toBe(1);

    const second2 = await trajectoryOf(result, 2);
    expect(await second.locator('li.resumed').getAttribute('data-seq')).toBe(String(result.resumedFrom));
    expect(await second.locator('li.inherited summary').innerText()).toContain(`from checkpoint ${result.resumedFrom}`);
    // The turns this attempt's model calls answered are its own; the checkpoint's are folded above the mark.
    expect(await second.locator('ol.conversation > li.turn').count()).toBe(second2.turns.length);
    expect(await second.locator('ol.conversation > li.turn .tool-name').allInnerTexts()).toEqual(toolNames(second2, second2.turns[0]!.messageIndex));
    expect(await second.locator('.outcome .reward').innerText()).toBe('1');
    expect(dialogs).toEqual([]);
    await page.screenshot({ path: path.join(SCREENSHOTS, 'transcript.png'), fullPage: true });
    await page.close();
  });

  it('keeps what a hostile agent wrote inert: no script runs, its markup is visible as text', async () => {
    expect([hostile.status, hostile.reward], JSON.stringify(hostile.error)).toEqual(['passed', 1]);
    const { page, dialogs, console: consoleLines, csp } = await open(transcriptUrl(hostile));
    expect(csp).toMatch(/^default-src 'none'; style-src 'sha256-[^']+' 'sha256-[^']+'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'$/);
    await page.screenshot({ path: path.join(SCREENSHOTS, 'transcript-hostile.png'), fullPage: false });
    // Open every fold, so all the text is laid out and visible.
    await page.locator('details').evaluateAll((els) => els.forEach((d) => d.setAttribute('open', '')));

    const attempt = page.locator('section.attempt[data-attempt="1"]');
    for (const [where, said] of [['li[data-role="system"]', 'system says'], ['li[data-role="user"]', 'user says'], ['li.msg[data-role="assistant"]', 'assistant says'], ['.tool-output', 'tool says'], ['pre.agent-stdout', 'stdout says'], ['pre.agent-stderr', 'stderr says'], ['pre.verifier-stdout', 'verifier says'], ['pre.diff', 'file says']] as const) {
      const el = attempt.locator(where).first();
      expect(await el.isVisible(), where).toBe(true);
      expect(await el.innerText(), where).toContain(`${said} ${EVIL}`);
    }
    expect(await attempt.locator('.tool-name').first().innerText()).toBe(TOOL_NAME);
    expect(await attempt.locator('dl.args dd').first().innerText()).toBe('</details><script>window.__pwned=5</script>');
    // Control characters shown as their pictures; the long lines wrap instead of widening the page.
    expect(await attempt.locator('li[data-role="user"]').innerText()).toContain('nul[\u2400] bel[\u2407] esc[\u241b[31m] rlo[<U+202E>]');
    expect(await attempt.locator('details.fold summary').count()).toBeGreaterThanOrEqual(3);
    const root = page.locator('html');
    expect(await root.evaluate((e) => e.scrollWidth <= e.clientWidth)).toBe(true);

    // Nothing ran and nothing was even tried: no element the agent named, no dialog, no CSP report.
    expect(await page.locator('script, img, svg, iframe, a[href^="javascript"]').count()).toBe(0);
    expect(await page.evaluate(() => (globalThis as { __pwned?: number }).__pwned)).toBeUndefined();
    expect(dialogs).toEqual([]);
    expect(consoleLines.filter((l) => /Content.Security.Policy|Refused/i.test(l))).toEqual([]);
    await page.close();
  });

  it('is behind the dashboard\'s auth and serves episodes of the batch only', async () => {
    const result = llm[0]!;
    expect((await fetch(transcriptUrl(result))).status).toBe(401);
    for (const p of [`/batches/${result.batchId}/episodes/${hostile.episodeId}/transcript`, `/batches/${result.batchId}/episodes/..%2F..%2Fetc/transcript`]) {
      const res = await fetch(`${dashboard!.url}${p}`, { headers: { authorization: AUTH } });
      expect(res.status, p).toBe(404);
    }
  });
});

// The dashboard's pure parts: escaping, redaction, Basic auth, the evidence folder guard, the charts'
// numbers and the credential rule of the dashboard command.
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import { dashboardCredentials } from '../../src/cli/dashboard-command.ts';
import { loadConfig } from '../../src/config/config.ts';
import { checkBasicAuth } from '../../src/dashboard/basic-auth.ts';
import { percentile, phaseTimings, rewardHistogram } from '../../src/dashboard/batch-stats.ts';
import { evidenceFolder, readEvidence } from '../../src/dashboard/evidence-files.ts';
import { html } from '../../src/dashboard/html.ts';
import { REDACTED, redactSecrets } from '../../src/dashboard/redact.ts';
import { histogramSvg, phaseTimingSvg } from '../../src/dashboard/svg-charts.ts';

const result = (reward: number | null, timings: Partial<EpisodeResult['timings']> = {}): EpisodeResult => ({
  episodeId: 'b.t.0', batchId: 'b', taskId: 't', sample: 0, status: reward === 1 ? 'passed' : 'failed', reward, attempts: 1,
  workerId: 'w', timings: { totalMs: 10, ...timings }, provenance: { taskDigest: 'x', image: 'i', agent: { kind: 'oracle' } },
  startedAt: '', endedAt: '',
});

describe('html', () => {
  it('escapes interpolated values but not nested html', () => {
    const inner = html`<b>${'<i>'}</b>`;
    expect(html`<p title="${'"x"'}">${'<script>&'}${inner}${['<a>', html`<br>`]}${undefined}${null}${false}${0}</p>`.value)
      .toBe('<p title="&quot;x&quot;">&lt;script&gt;&amp;<b>&lt;i&gt;</b>&lt;a&gt;<br>0</p>');
  });
});

describe('redactSecrets', () => {
  it('replaces values under secret-looking keys at any depth, leaving the input alone', () => {
    const input = { apiKey: 'sk-1', nested: [{ Authorization: 'Bearer x', ok: 1 }], auth: { password: 'p', user: 'u' }, refresh_token: 't', SECRET: 's', plain: 'v' };
    expect(redactSecrets(input)).toEqual({
      apiKey: REDACTED, nested: [{ Authorization: REDACTED, ok: 1 }], auth: { password: REDACTED, user: 'u' }, refresh_token: REDACTED, SECRET: REDACTED, plain: 'v',
    });
    expect(input.apiKey).toBe('sk-1');
    expect(redactSecrets('text')).toBe('text');
    const loop: Record<string, unknown> = { a: 1 };
    loop.self = loop;
    expect(redactSecrets(loop)).toEqual({ a: 1, self: '[circular]' });
  });

  it('shows settings that merely mention a secret word, and hides the secrets beside them', () => {
    const task = {
      model: { contextWindowTokens: 8192, outputReserveTokens: 1024, maxTokens: 512, keep: 5, keys: ['a'] },
      env: { MODEL_API_KEY: 'sk-2', accessToken: 'at', token: 't', password: 'p', authorization: 'Basic x' },
    };
    expect(redactSecrets(task)).toEqual({
      model: { contextWindowTokens: 8192, outputReserveTokens: 1024, maxTokens: 512, keep: 5, keys: ['a'] },
      env: { MODEL_API_KEY: REDACTED, accessToken: REDACTED, token: REDACTED, password: REDACTED, authorization: REDACTED },
    });
  });
});

describe('checkBasicAuth', () => {
  const creds = { user: 'op', password: 'p:ss wörd' };
  const header = (s: string) => `Basic ${Buffer.from(s).toString('base64')}`;
  it('accepts exactly the credentials', () => {
    expect(checkBasicAuth(header('op:p:ss wörd'), creds)).toBe(true);
    expect(checkBasicAuth(`basic ${Buffer.from('op:p:ss wörd').toString('base64')}`, creds)).toBe(true);
  });
  it('refuses anything else', () => {
    for (const h of [undefined, '', 'Basic', header('op:p:ss'), header('op'), header(':p:ss wörd'), header('OP:p:ss wörd'), 'Bearer abc', `${header('op:p:ss wörd')} x`]) {
      expect(checkBasicAuth(h, creds), String(h)).toBe(false);
    }
  });
});

describe('evidence', () => {
  it('resolves only plain episode ids inside the evidence root', () => {
    expect(evidenceFolder('/data', 'b.t.0')).toBe(path.resolve('/data/evidence/b.t.0'));
    for (const id of ['..', '../x', 'a/../../x', '/etc', '.hidden', '', 'A']) expect(evidenceFolder('/data', id), id).toBeUndefined();
  });

  it('reads attempts in order, caps each file, skips symlinks and dot files', async () => {
    const data = await mkdtemp(path.join(os.tmpdir(), 'rf-ev-'));
    const dir = (n: number) => path.join(data, 'evidence', 'e.1', `attempt-${n}`);
    await mkdir(dir(1), { recursive: true });
    await mkdir(dir(10), { recursive: true });
    await mkdir(dir(2), { recursive: true });
    await writeFile(path.join(dir(1), 'agent.stdout.txt'), 'x'.repeat(100));
    await writeFile(path.join(dir(2), 'result.json'), '{}');
    await writeFile(path.join(dir(10), '.tmp'), 'partial');
    await writeFile(path.join(data, 'secret.txt'), 'do not show');
    await symlink(path.join(data, 'secret.txt'), path.join(dir(2), 'link.txt'));
    try {
      const files = await readEvidence(data, 'e.1', 10);
      expect(files.map((f) => [f.attempt, f.name, f.sizeBytes, f.text, f.truncated])).toEqual([
        [1, 'agent.stdout.txt', 100, 'x'.repeat(10), true],
        [2, 'result.json', 2, '{}', false],
      ]);
      expect(await readEvidence(data, '../evidence/e.1', 10)).toEqual([]);
    } finally {
      await rm(data, { recursive: true, force: true });
    }
  });
});

describe('batch charts', () => {
  it('bins rewards over [0, 1] and counts ungraded apart', () => {
    const { bins, ungraded } = rewardHistogram([result(0), result(1), result(1), result(0.55), result(null)]);
    expect(bins.map((b) => b.count)).toEqual([1, 0, 0, 0, 0, 1, 0, 0, 0, 2]);
    expect(ungraded).toBe(1);
  });

  it('computes nearest-rank percentiles per phase', () => {
    expect(percentile([], 50)).toBeUndefined();
    expect(percentile([5, 1, 4, 2, 3], 50)).toBe(3);
    expect(percentile(Array.from({ length: 20 }, (_, i) => i + 1), 95)).toBe(19);
    const t = phaseTimings([result(1, { setupMs: 100, agentMs: 1000 }), result(0, { setupMs: 300 })]);
    expect(t).toEqual([
      { phase: 'setup', count: 2, p50Ms: 100, p95Ms: 300 },
      { phase: 'agent', count: 1, p50Ms: 1000, p95Ms: 1000 },
      { phase: 'verify', count: 0, p50Ms: undefined, p95Ms: undefined },
      { phase: 'close', count: 0, p50Ms: undefined, p95Ms: undefined },
    ]);
  });

  it('draws bars proportional to the values, labels escaped', () => {
    const svg = histogramSvg([{ label: '<0>', from: 0, to: 0.5, count: 1 }, { label: 'b', from: 0.5, to: 1, count: 2 }], 'r & r').value;
    expect(svg).toContain('<title>r &amp; r</title>');
    expect(svg).not.toContain('<0>');
    const heights = [...svg.matchAll(/class="bar"[^>]* height="(\d+)"/g)].map((m) => Number(m[1]));
    expect(heights).toHaveLength(2);
    expect(heights[1]).toBe(2 * heights[0]!);
    const phases = phaseTimingSvg([{ phase: 'setup', count: 1, p50Ms: 50, p95Ms: 100 }], 'p').value;
    const widths = [...phases.matchAll(/class="bar (p50|p95)"[^>]* width="(\d+)"/g)].map((m) => [m[1], Number(m[2])]);
    expect(widths).toEqual([['p95', 370], ['p50', 185]]);
  });
});

describe('dashboard credentials', () => {
  const config = (env: Record<string, string>) => loadConfig({ REDIS_URL: 'redis://127.0.0.1:1', ...env });
  it('requires both or, with --local-only, neither', () => {
    expect(dashboardCredentials(config({ FLEET_DASHBOARD_USER: 'u', FLEET_DASHBOARD_PASSWORD: 'p' }), false)).toEqual({ user: 'u', password: 'p' });
    expect(dashboardCredentials(config({}), true)).toBeUndefined();
    expect(() => dashboardCredentials(config({}), false)).toThrow(/--local-only/);
    expect(() => dashboardCredentials(config({ FLEET_DASHBOARD_USER: 'u' }), true)).toThrow(/set together/);
  });
  it('has safe defaults: loopback, read-only', () => {
    const c = config({});
    expect([c.FLEET_DASHBOARD_HOST, c.FLEET_DASHBOARD_PORT, c.FLEET_DASHBOARD_WRITE]).toEqual(['127.0.0.1', 3000, false]);
    expect(config({ FLEET_DASHBOARD_WRITE: 'true', FLEET_DASHBOARD_PORT: '8080' })).toMatchObject({ FLEET_DASHBOARD_WRITE: true, FLEET_DASHBOARD_PORT: 8080 });
    expect(() => config({ FLEET_DASHBOARD_WRITE: 'maybe' })).toThrow(/FLEET_DASHBOARD_WRITE/);
  });
});

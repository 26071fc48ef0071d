// The endpoint table (FLEET_MODEL_ENDPOINTS or its file): parsed, checked, every problem named with
// its field and value (a key's variable by name, never its value); today's MODEL_* settings are the
// endpoint `default`; a batch's `model` options validated; the proxy's request overrides.
import { mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, configEndpoints, loadConfig } from '../../src/config/config.ts';
import { EndpointTableError, loadEndpointTable, parseEndpointTable } from '../../src/config/model-endpoints.ts';
import { modelSettings } from '../../src/cli/worker-command.ts';
import { settingsEndpoints } from '../../src/episode/episode-attempt.ts';
import { endpointIdentity } from '../../src/model/fleet-limits.ts';
import { applyOverrides } from '../../src/model/request-overrides.ts';
import { BatchFile } from '../../src/tasks/batch-spec.ts';
import { BatchRequest } from '../../src/api/api-server.ts';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { batchPage } from '../../src/dashboard/batch-view.ts';
import { formatSummary, summarize } from '../../src/results/batch-summary.ts';

const problemsOf = (f: () => unknown): string[] => {
  try {
    f();
  } catch (err) {
    if (err instanceof EndpointTableError || err instanceof ConfigError) return err.problems;
    throw err;
  }
  throw new Error('expected it to throw');
};

const SECRET = 'sk-fast-0123456789abcdefABCDEF';

describe('the model endpoint table', () => {
  it('reads every field, the key from the variable keyEnv names', () => {
    const table = parseEndpointTable([
      { name: 'fast', baseUrl: 'http://127.0.0.1:8001/v1', keyEnv: 'FAST_KEY', model: 'qwen-small', maxConcurrent: 2, requestsPerMinute: 60, tokensPerMinute: 9000, capture: 'tokens' },
      { name: 'slow.v2', baseUrl: 'https://models.example.com/v1' },
    ], 'FLEET_MODEL_ENDPOINTS', { FAST_KEY: SECRET });
    expect(table).toEqual([
      { name: 'fast', baseUrl: 'http://127.0.0.1:8001/v1', apiKey: SECRET, model: 'qwen-small', limits: { maxConcurrent: 2, requestsPerMinute: 60, tokensPerMinute: 9000 }, capture: 'tokens' },
      { name: 'slow.v2', baseUrl: 'https://models.example.com/v1', limits: {} },
    ]);
  });

  it('names each bad field and value, and a missing key variable by its name only', () => {
    const problems = problemsOf(() => parseEndpointTable([
      { name: 'a', baseUrl: 'ftp://x', maxConcurrent: 0 },
      { name: '-bad', baseUrl: 'http://127.0.0.1:1/v1', keyEnv: 'NO_SUCH_KEY_VAR', speed: 3 },
      { name: 'a', baseUrl: 'http://user:pw@127.0.0.1:2/v1' },
    ], 'FLEET_MODEL_ENDPOINTS', {}));
    expect(problems).toEqual(expect.arrayContaining([
      'FLEET_MODEL_ENDPOINTS: 0.baseUrl: must be an http:// or https:// URL (got "ftp://x")',
      expect.stringMatching(/^FLEET_MODEL_ENDPOINTS: 0\.maxConcurrent: .* \(got 0\)$/),
      expect.stringMatching(/^FLEET_MODEL_ENDPOINTS: 1\.name: an endpoint name.* \(got "-bad"\)$/),
      expect.stringMatching(/^FLEET_MODEL_ENDPOINTS: 1: .*speed/),
      expect.stringMatching(/^FLEET_MODEL_ENDPOINTS: 2\.baseUrl: must hold no password/),
    ]));
    expect(problems.join('\n')).not.toContain('pw@');
    // Structure first; the names and keys once the entries are well-formed.
    const second = problemsOf(() => parseEndpointTable([
      { name: 'a', baseUrl: 'http://127.0.0.1:1/v1', keyEnv: 'NO_SUCH_KEY_VAR' },
      { name: 'a', baseUrl: 'http://127.0.0.1:2/v1' },
    ], 'FLEET_MODEL_ENDPOINTS', {}));
    expect(second).toEqual([
      'FLEET_MODEL_ENDPOINTS: 0.keyEnv: the environment variable NO_SUCH_KEY_VAR that holds the key of endpoint "a" is not set (got "NO_SUCH_KEY_VAR")',
      'FLEET_MODEL_ENDPOINTS: 1.name: the endpoint "a" is named twice',
    ]);
  });

  it('comes from JSON or a YAML file (not both), and never echoes what it could not parse', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-endpoints-'));
    const file = path.join(dir, 'endpoints.yaml');
    await writeFile(file, `endpoints:\n  - name: fast\n    baseUrl: http://127.0.0.1:8001/v1\n    keyEnv: FAST_KEY\n    requestsPerMinute: 30\n`);
    expect(loadEndpointTable({ file }, { FAST_KEY: SECRET })).toEqual([{ name: 'fast', baseUrl: 'http://127.0.0.1:8001/v1', apiKey: SECRET, limits: { requestsPerMinute: 30 } }]);
    expect(problemsOf(() => loadEndpointTable({ json: '[]', file }, {}))).toEqual(['FLEET_MODEL_ENDPOINTS and FLEET_MODEL_ENDPOINTS_FILE are both set: set one of them']);
    const notJson = problemsOf(() => loadEndpointTable({ json: `[{"name": "x", "baseUrl": "${SECRET}"` }, {}));
    expect(notJson).toEqual([expect.stringMatching(/^FLEET_MODEL_ENDPOINTS: not valid JSON \(got a string of \d+ bytes\)$/)]);
    const bad = path.join(dir, 'bad.yaml');
    await writeFile(bad, `- name: x\n  baseUrl: [${SECRET}\n`);
    const notYaml = problemsOf(() => loadEndpointTable({ file: bad }, {}));
    expect(notYaml).toEqual([expect.stringMatching(/^FLEET_MODEL_ENDPOINTS_FILE .*bad\.yaml: not valid JSON or YAML/)]);
    expect(notYaml.join('')).not.toContain(SECRET);
    expect(problemsOf(() => loadEndpointTable({ file: path.join(dir, 'missing.yaml') }, {}))).toEqual([expect.stringMatching(/missing\.yaml.*ENOENT/)]);
  });

  it("makes today's MODEL_* settings the endpoint `default`, beside the table's", () => {
    const env = { REDIS_URL: 'redis://127.0.0.1:6379', MODEL_BASE_URL: 'http://127.0.0.1:8000/v1', MODEL_API_KEY: 'sk-default-key', MODEL_NAME: 'm0', MODEL_MAX_CONCURRENT: '4', FLEET_MODEL_ENDPOINTS: JSON.stringify([{ name: 'fast', baseUrl: 'http://127.0.0.1:8001/v1', keyEnv: 'FAST_KEY', requestsPerMinute: 60 }]), FAST_KEY: SECRET };
    const config = loadConfig(env);
    const all = configEndpoints(config, env);
    expect(all.map((e) => e.name)).toEqual(['default', 'fast']);
    expect(all[0]).toMatchObject({ baseUrl: 'http://127.0.0.1:8000/v1', apiKey: 'sk-default-key', model: 'm0', limits: { maxConcurrent: 4 } });
    // What the worker command hands startWorker: the same two, `default` from baseUrl.
    const settings = modelSettings(config, config.MODEL_BASE_URL, env);
    expect(settingsEndpoints(settings).map((e) => [e.name, e.baseUrl, e.apiKey])).toEqual([
      ['default', 'http://127.0.0.1:8000/v1', 'sk-default-key'],
      ['fast', 'http://127.0.0.1:8001/v1', SECRET],
    ]);
    // Only the table: no `default` unless it names one.
    const onlyTable = { FLEET_MODEL_ENDPOINTS: env.FLEET_MODEL_ENDPOINTS, FAST_KEY: SECRET };
    expect(settingsEndpoints(modelSettings(loadConfig(onlyTable), undefined, onlyTable)).map((e) => e.name)).toEqual(['fast']);
    // A table naming `default` beside MODEL_BASE_URL is refused; alone, it is `default`.
    const clash = { MODEL_BASE_URL: 'http://127.0.0.1:8000/v1', FLEET_MODEL_ENDPOINTS: JSON.stringify([{ name: 'default', baseUrl: 'http://127.0.0.1:8009/v1' }]) };
    expect(problemsOf(() => loadConfig(clash))).toEqual([expect.stringMatching(/^FLEET_MODEL_ENDPOINTS: 0\.name: MODEL_BASE_URL already makes the endpoint "default"/)]);
    expect(configEndpoints(loadConfig({ FLEET_MODEL_ENDPOINTS: clash.FLEET_MODEL_ENDPOINTS }), {}).map((e) => [e.name, e.baseUrl])).toEqual([['default', 'http://127.0.0.1:8009/v1']]);
  });

  it('stops a bad table at config load, and a missing key variable only where keys are used (the worker)', () => {
    expect(problemsOf(() => loadConfig({ FLEET_MODEL_ENDPOINTS: '{"name": 1}' }))).toEqual([expect.stringMatching(/^FLEET_MODEL_ENDPOINTS: .*expected array/)]);
    const noKey = { FLEET_MODEL_ENDPOINTS: JSON.stringify([{ name: 'fast', baseUrl: 'http://127.0.0.1:8001/v1', keyEnv: 'FAST_KEY' }]) };
    const config = loadConfig(noKey);
    expect(problemsOf(() => modelSettings(config, undefined, noKey))).toEqual([expect.stringMatching(/0\.keyEnv: the environment variable FAST_KEY/)]);
  });

  it('keys each endpoint\'s limits by its name, so two endpoints of one URL keep apart', () => {
    const url = 'http://127.0.0.1:8000/v1';
    const plain = endpointIdentity(url).id;
    expect(plain).toMatch(/^[0-9a-f]{12}$/);
    expect(endpointIdentity(url, 'fast').id).toBe(`fast.${plain}`);
    expect(endpointIdentity(url, 'slow').id).not.toBe(endpointIdentity(url, 'fast').id);
  });
});

describe("a batch's model options", () => {
  const batch = (model: unknown) => ({ tasks: ['t'], agent: { kind: 'oracle' }, model });

  it('take endpoint, name, sampling, enforce and capture', () => {
    const parsed = BatchFile.parse(batch({ endpoint: 'fast', name: 'qwen', sampling: { temperature: 0.7, top_p: 0.9, max_tokens: 256, seed: 7 }, enforce: true, capture: 'tokens' }));
    expect(parsed.model).toEqual({ endpoint: 'fast', name: 'qwen', sampling: { temperature: 0.7, top_p: 0.9, max_tokens: 256, seed: 7 }, enforce: true, capture: 'tokens' });
  });

  it("are the API's too (POST /v1/batches)", () => {
    const body = { name: 'api', tasks: ['a'.repeat(64)], agent: { kind: 'oracle' }, model: { endpoint: 'fast', sampling: { seed: 3 }, enforce: true } };
    expect(BatchRequest.parse(body).model).toEqual({ endpoint: 'fast', sampling: { seed: 3 }, enforce: true });
    const bad = { ...body, model: { endpoint: 'fast', sampling: { seed: 1.5 } } };
    const parsed = BatchRequest.safeParse(bad);
    expect(describeIssues(parsed.error!, bad)).toEqual([expect.stringMatching(/^model\.sampling\.seed: .* \(got 1\.5\)$/)]);
  });

  it('name the field and value of each bad one', () => {
    const input = batch({ endpoint: 'no good', sampling: { temperature: 9, top_p: 0, temprature: 1 }, enforce: 'yes' });
    const parsed = BatchFile.safeParse(input);
    expect(parsed.success).toBe(false);
    const lines = describeIssues(parsed.error!, input);
    expect(lines).toEqual(expect.arrayContaining([
      expect.stringMatching(/^model\.endpoint: an endpoint name.* \(got "no good"\)$/),
      expect.stringMatching(/^model\.sampling\.temperature: .* \(got 9\)$/),
      expect.stringMatching(/^model\.sampling\.top_p: .* \(got 0\)$/),
      expect.stringMatching(/^model\.sampling: .*temprature/),
      expect.stringMatching(/^model\.enforce: .* \(got "yes"\)$/),
    ]));
  });
});

describe("the proxy's request overrides", () => {
  const sent = { model: 'agent-model', messages: [{ role: 'user', content: 'hi' }], temperature: 1.3 };

  it('fill in sampling the agent omitted, keeping what it sent', () => {
    expect(applyOverrides(sent, { defaultModel: 'batch-model', sampling: { temperature: 0.2, seed: 5 } })).toEqual({ ...sent, seed: 5 });
    expect(applyOverrides({ messages: sent.messages }, { defaultModel: 'batch-model', sampling: { temperature: 0.2 } })).toEqual({ messages: sent.messages, model: 'batch-model', temperature: 0.2 });
  });

  it('overwrite it (and the model) with enforce', () => {
    expect(applyOverrides(sent, { forceModel: 'batch-model', defaultModel: 'batch-model', sampling: { temperature: 0.2, seed: 5 }, enforce: true })).toEqual({ ...sent, model: 'batch-model', temperature: 0.2, seed: 5 });
    // The agent's body is left as it was (the evidence keeps it).
    expect(sent.temperature).toBe(1.3);
  });
});

describe("a batch's endpoint and model in its summary and on its page", () => {
  it('are in the summary (status, --json) and the batch page; `default` for a batch naming none', () => {
    const manifest = { batchId: 'b', name: 'n', createdAt: '2026-01-01T00:00:00.000Z', episodeIds: ['b.t.0'], model: { endpoint: 'fast', name: 'qwen<3>' } };
    const summary = summarize('b', 1, [], 1, manifest.model);
    expect(summary.model).toEqual({ endpoint: 'fast', name: 'qwen<3>' });
    expect(formatSummary(summary)).toContain('model endpoint fast, model qwen<3>');
    const page = batchPage({ manifest, summary, results: [] }, { bullBoardPath: '/queues', episodesQueue: 'episodes' }).value;
    expect(page).toContain('model endpoint <b class="model-endpoint">fast</b>, model <b class="model-name">qwen&lt;3&gt;</b>');
    expect(summarize('b', 1, []).model).toEqual({ endpoint: 'default' });
  });
});

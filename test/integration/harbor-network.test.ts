// Network per phase (test/fixtures/harbor-network, written for this suite): a loopback HTTP server
// stands in for the allowed host (FLEET_EGRESS_HOSTS-style name overrides given to the worker).
// A grader on an allowlist reaches it (plain HTTP and CONNECT) and is refused another host, Redis and
// localhost, while its agent had no network at all (its probe from inside finds no proxy, no
// forwarder, no egress socket); a public grader is still refused Redis by the private-address guard;
// an agent on an allowlist fetches the host while its grader has none; a separate verifier's own
// container gets its network the same way, and a grader beside a task service reaches it by name
// directly. Every decision is in the
// episode's egress.jsonl. Under a lower ceiling the same tasks run unchanged at the ceiling, and the
// result records requested vs applied.
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EgressDecision } from '../../src/egress/egress-proxy.ts';
import { parseEgressHosts } from '../../src/egress/host-rules.ts';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { WorkerHandle, WorkerOptions } from '../../src/worker/start-worker.ts';
import { startModelStub } from '../../src/model/model-stub.ts';
import { ROOT, runTaskFolders, silentLog, startEnvWorker, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor-network');
const BODY = 'hello from the allowed host\n';
const HOSTS = parseEgressHosts('allowed.example=127.0.0.1,files.allowed.example=127.0.0.1');

describe('network per phase of Harbor tasks', () => {
  let env: FleetEnv;
  let server: http.Server;
  let port: number;
  let redisPort: number;
  const hits: string[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    server = http.createServer((req, res) => {
      hits.push(`${req.headers.host} ${req.url}`);
      res.end(BODY);
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    port = (server.address() as net.AddressInfo).port;
    redisPort = Number(new URL(env.redis.url).port);
    // Read by the fixtures' [verifier.env] and [solution.env] where the batch is enqueued.
    process.env.EGRESS_TEST_PORT = String(port);
    process.env.EGRESS_TEST_REDIS_PORT = String(redisPort);
  });
  afterAll(async () => {
    delete process.env.EGRESS_TEST_PORT;
    delete process.env.EGRESS_TEST_REDIS_PORT;
    server?.close();
    await env?.close();
  });

  async function egressOf(r: EpisodeResult): Promise<EgressDecision[]> {
    const text = await readFile(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1', 'egress.jsonl'), 'utf8').catch(() => '');
    return text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as EgressDecision);
  }

  async function withWorker<T>(id: string, network: WorkerOptions['network'], run: () => Promise<T>): Promise<T> {
    const worker: WorkerHandle = await startEnvWorker(env, id, { concurrency: 2, ...(network && { network }) });
    try {
      return await run();
    } finally {
      await worker.close();
    }
  }

  it('under a public ceiling: each phase gets what it asked for, through the proxy, and never the host\'s side', async () => {
    const byTask = await withWorker('net-public', { ceiling: 'public', hostsMap: HOSTS }, () => runTaskFolders(env, [FIXTURES], '{ kind: oracle }'));

    // The grader on an allowlist: the allowed host by HTTP and CONNECT, another host, Redis and localhost refused; the agent had nothing.
    const grader = byTask.get('grader-allowlist')!;
    expect(grader, JSON.stringify(grader)).toMatchObject({
      status: 'passed', reward: 1,
      metrics: { allowed_http: 1, other_refused: 1, allowed_connect: 1, redis_refused: 1, localhost_refused: 1, agent_isolated: 1 },
    });
    expect(grader.network).toEqual({
      agent: { requested: 'no-network', applied: 'no-network' },
      verifier: { requested: 'allowlist', applied: 'allowlist', allowedHosts: ['allowed.example'] },
    });
    const lines = await egressOf(grader);
    // Only the verifier's phase had a proxy: no line of the agent's.
    expect(lines.every((d) => d.phase === 'verifier' && d.episodeId === grader.episodeId)).toBe(true);
    const by = (method: string, host: string, p: number) => lines.filter((d) => d.method === method && d.host === host && d.port === p);
    expect(by('GET', 'allowed.example', port)).toEqual([expect.objectContaining({ decision: 'allowed', address: '127.0.0.1', mapped: true, bytesDown: BODY.length })]);
    expect(by('CONNECT', 'allowed.example', port)).toEqual([expect.objectContaining({ decision: 'allowed', bytesUp: expect.any(Number), bytesDown: expect.any(Number) })]);
    expect(by('CONNECT', 'allowed.example', port)[0]!.bytesDown).toBeGreaterThan(BODY.length);
    expect(by('GET', 'other.example', port)).toEqual([expect.objectContaining({ decision: 'refused', reason: 'not_allowed' })]);
    expect(by('CONNECT', '127.0.0.1', redisPort)).toEqual([expect.objectContaining({ decision: 'refused', reason: 'not_allowed' })]);
    expect(by('CONNECT', 'localhost', redisPort)).toEqual([expect.objectContaining({ decision: 'refused', reason: 'not_allowed' })]);
    expect(lines).toHaveLength(5);

    // The public grader: any host, but Redis and localhost still refused by the guard.
    const open = byTask.get('grader-public')!;
    expect(open, JSON.stringify(open)).toMatchObject({
      status: 'passed', reward: 1,
      metrics: { allowed_http: 1, other_refused: 1, allowed_connect: 1, redis_refused: 1, localhost_refused: 1, agent_isolated: 1 },
    });
    expect(open.network).toEqual({ agent: { requested: 'no-network', applied: 'no-network' }, verifier: { requested: 'public', applied: 'public' } });
    const publicLines = await egressOf(open);
    const refusedRedis = publicLines.filter((d) => d.method === 'CONNECT' && d.port === redisPort);
    expect(refusedRedis.map((d) => [d.host, d.decision, d.reason])).toEqual([['127.0.0.1', 'refused', 'private_address'], ['localhost', 'refused', 'private_address']]);
    // other.example is not mapped: it does not resolve here (or would be refused if it resolved to a private address).
    expect(publicLines.find((d) => d.host === 'other.example')).toMatchObject({ decision: 'refused', reason: expect.stringMatching(/^(resolve_failed|private_address)$/) });

    // The agent on an allowlist fetched *.allowed.example; its grader has no proxy, no forwarder.
    const agent = byTask.get('agent-allowlist')!;
    expect(agent, JSON.stringify(agent)).toMatchObject({ status: 'passed', reward: 1, metrics: { fetched: 1, grader_no_proxy_env: 1, grader_port_closed: 1 } });
    expect(agent.network).toEqual({
      agent: { requested: 'allowlist', applied: 'allowlist', allowedHosts: ['*.allowed.example'] },
      verifier: { requested: 'no-network', applied: 'no-network' },
    });
    expect((await egressOf(agent)).map((d) => [d.phase, d.method, d.host, d.decision])).toEqual([['agent', 'GET', 'files.allowed.example', 'allowed']]);
    expect(hits).toContain(`files.allowed.example:${port} /hello`);

    // Beside a task service: the service by name straight (NO_PROXY), only the allowed host through the proxy.
    const withService = byTask.get('grader-with-service')!;
    expect(withService, JSON.stringify(withService)).toMatchObject({ status: 'passed', reward: 1, metrics: { service_direct: 1, allowed_http: 1, no_proxy_names_api: 1 } });
    expect((await egressOf(withService)).map((d) => [d.phase, d.host, d.decision])).toEqual([['verifier', 'allowed.example', 'allowed']]);

    // A separate verifier: its own container gets the run folder and a forwarder; the agent's had neither.
    const separate = byTask.get('separate-grader')!;
    expect(separate, JSON.stringify(separate)).toMatchObject({ status: 'passed', reward: 1, metrics: { allowed_http: 1, other_refused: 1, artifact: 1 } });
    expect((await egressOf(separate)).map((d) => [d.phase, d.host, d.decision, d.reason ?? null])).toEqual([
      ['verifier', 'allowed.example', 'allowed', null], ['verifier', 'other.example', 'refused', 'not_allowed'],
    ]);
  });

  it('a command agent and the reference agent (its bash tool, beside the model) get the agent\'s network too', async () => {
    const task = path.join(FIXTURES, 'agent-allowlist');
    const viaCommand = await withWorker('net-command', { ceiling: 'allowlist', hostsMap: HOSTS }, () => runTaskFolders(env, [task], '{ kind: command, command: "python3 /usr/local/bin/fetch-allowed.py" }'));
    expect(viaCommand.get('agent-allowlist'), JSON.stringify(viaCommand.get('agent-allowlist'))).toMatchObject({ status: 'passed', reward: 1 });
    expect((await egressOf(viaCommand.get('agent-allowlist')!)).map((d) => [d.phase, d.host, d.decision])).toEqual([['agent', 'files.allowed.example', 'allowed']]);

    // The stub plays the task's solve.sh through the reference agent's bash tool: the model's socket and
    // the egress socket share the run folder, each proxy its own.
    const stub = await startModelStub({ tasksDir: FIXTURES, listen: { port: 0, host: '127.0.0.1' }, log: silentLog });
    try {
      const model = { baseUrl: stub.baseUrl!, maxCalls: 20, maxTokens: 200_000, requestTimeoutMs: 30_000, upstreamRetries: 1 };
      const worker = await startEnvWorker(env, 'net-llm', { concurrency: 1, network: { ceiling: 'allowlist', hostsMap: HOSTS }, model });
      let viaLlm: Map<string, EpisodeResult>;
      try {
        viaLlm = await runTaskFolders(env, [task], '{ kind: llm, model: stub }');
      } finally {
        await worker.close();
      }
      const r = viaLlm.get('agent-allowlist')!;
      expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1 });
      expect((await egressOf(r)).map((d) => [d.phase, d.host, d.decision])).toEqual([['agent', 'files.allowed.example', 'allowed']]);
      const calls = await readFile(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1', 'model-calls.jsonl'), 'utf8');
      expect(calls.trim().split('\n').length).toBeGreaterThanOrEqual(2);
    } finally {
      await stub.close();
    }
  });

  it('under a lower ceiling the tasks still run, at the ceiling, and the result says what was asked and what was applied', async () => {
    const byTask = await withWorker('net-none', { ceiling: 'no-network', hostsMap: HOSTS }, () => runTaskFolders(env, [path.join(FIXTURES, 'grader-allowlist')], '{ kind: oracle }'));
    const grader = byTask.get('grader-allowlist')!;
    // Graded, not refused: with no network the grader's probes fail and so does its reward.
    expect(grader, JSON.stringify(grader)).toMatchObject({ status: 'failed', reward: 0, metrics: { allowed_http: 0, allowed_connect: 0, agent_isolated: 1 } });
    expect(grader.network).toEqual({ agent: { requested: 'no-network', applied: 'no-network' }, verifier: { requested: 'allowlist', applied: 'no-network' } });
    expect(await egressOf(grader)).toEqual([]);

    // The default ceiling (allowlist): a public ask with no hosts runs with none.
    const atDefault = await withWorker('net-default', undefined, () => runTaskFolders(env, [path.join(FIXTURES, 'grader-public')], '{ kind: oracle }'));
    const open = atDefault.get('grader-public')!;
    expect(open.network).toEqual({ agent: { requested: 'no-network', applied: 'no-network' }, verifier: { requested: 'public', applied: 'no-network' } });
    expect(open).toMatchObject({ status: 'failed', reward: 0, metrics: { allowed_http: 0 } });
    expect(await egressOf(open)).toEqual([]);
  });
});

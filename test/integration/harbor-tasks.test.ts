// Harbor task folders (test/fixtures/harbor, written for this suite) run unchanged on the fleet: their
// environments built on the stand-in base images, the oracle passing where the task is right, an agent
// that does nothing failing with the reward its verifier wrote, and every grader that could not grade
// ending as an error with a kind, never a reward. A reward file the agent planted gives nothing.
import { chmod, cp, mkdtemp, readFile, readdir, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { ROOT, docker, enqueueFile, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor');

describe('Harbor tasks', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'harbor-w', { concurrency: 4 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  async function run(tasks: string[], agent: string, samples = 1, more = ''): Promise<Map<string, EpisodeResult[]>> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-harbor-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `tasks: ${JSON.stringify(tasks)}\nagent: ${agent}\nsamples: ${samples}\n${more}`);
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 600_000);
    await waitForNoContainers(plan.batchId);
    const byTask = new Map<string, EpisodeResult[]>();
    for (const r of results) byTask.set(r.taskId, [...(byTask.get(r.taskId) ?? []), r]);
    return byTask;
  }
  const one = (m: Map<string, EpisodeResult[]>, id: string) => m.get(id)![0]!;

  const GRADABLE = ['hello-file', 'chmod-copy', 'prebuilt-image', 'healthy-server', 'non-root-agent', 'env-vars', 'partial-credit', 'two-metrics', 'pytest-uvx', 'background-process', 'node-options-image'];
  /** The fixtures of the first test's batch: all but planted-reward, whose left-behind planter (root's) is stopped only under agentProcesses: stop. */
  const ALL_BUT_PLANTED = async () => (await readdir(FIXTURES)).filter((id) => id !== 'planted-reward').map((id) => path.join(FIXTURES, id));

  it('the oracle passes every gradable task; graders that cannot grade and broken environments are errors with a kind', async () => {
    const byTask = await run(await ALL_BUT_PLANTED(), '{ kind: oracle }');
    const stopped = await run([path.join(FIXTURES, 'planted-reward'), path.join(FIXTURES, 'background-process')], '{ kind: oracle }', 1, 'agentProcesses: stop\n');
    for (const id of GRADABLE) {
      expect({ id, ...one(byTask, id) }, id).toMatchObject({ id, status: 'passed', reward: 1 });
    }
    expect(one(byTask, 'two-metrics').metrics).toEqual({ correctness: 1, documentation: 1 });
    expect(one(byTask, 'hello-file').provenance.environment).toMatchObject({ source: 'built' });
    expect(one(byTask, 'prebuilt-image').provenance).toMatchObject({ image: 'python:3.12-slim', environment: { source: 'docker_image' } });
    expect(one(byTask, 'hello-file').network).toEqual({ agent: { requested: 'public', applied: 'no-network' }, verifier: { requested: 'public', applied: 'no-network' } });
    expect(one(byTask, 'silent-verifier')).toMatchObject({ status: 'error', reward: null, error: { kind: 'verifier', code: 'reward_file_missing' } });
    // Timed out once: not graded again (its processes stay kept; a timeout is the verifier's own end).
    expect(one(byTask, 'slow-verifier')).toMatchObject({ status: 'error', reward: null, error: { kind: 'verifier', code: 'verifier_timeout' }, grading: { agentProcesses: 'kept' } });
    // The "solution" only plants reward files (and a process to plant them again): with the agent's
    // processes stopped, the verifier, which writes one only for a right answer, finds /logs/verifier empty.
    expect(one(stopped, 'planted-reward')).toMatchObject({ status: 'error', reward: null, error: { code: 'reward_file_missing' } });
    // The process the task asked the agent to leave running: there for the tests when kept (above), gone when stopped.
    expect(one(stopped, 'background-process')).toMatchObject({ status: 'failed', reward: 0, grading: { agentProcesses: 'stopped' } });
    // Kept, the result says so and counts what ran beside the grader; the evidence names it.
    const kept = one(byTask, 'background-process');
    expect(kept.grading?.agentProcesses).toBe('kept');
    expect(kept.grading?.beside).toBeGreaterThanOrEqual(1);
    const keptEvidence = JSON.parse(await readFile(path.join(env.dataDir, 'evidence', kept.episodeId, 'attempt-1', 'evidence.json'), 'utf8')) as { besideGrader: { processes: Array<{ uid: number; cmd: string }> } };
    expect(keptEvidence.besideGrader.processes).toContainEqual(expect.objectContaining({ uid: 0, cmd: expect.stringContaining('/tmp/heartbeat') }));
    // Kept, a non-root agent's planters still run while the tests do, and can neither write where the
    // root verifier writes nor swap its folder for one of their own (failed before /logs was made root's 0755).
    expect(one(byTask, 'non-root-planter')).toMatchObject({ status: 'error', reward: null, error: { code: 'reward_file_missing' } });
    const planterLog = path.join(env.dataDir, 'evidence', one(byTask, 'non-root-planter').episodeId, 'attempt-1', 'logs', 'verifier', 'test-stdout.txt');
    await expect(readFile(planterLog, 'utf8')).resolves.toContain('planter alive: yes');
    expect(one(byTask, 'broken-dockerfile')).toMatchObject({ status: 'error', reward: null, attempts: 1, error: { kind: 'invalid', code: 'environment_build_failed' } });
    expect(one(byTask, 'hanging-build')).toMatchObject({ status: 'error', reward: null, attempts: 1, error: { kind: 'invalid', code: 'environment_build_timeout' } });
    // The oracle's output is where Harbor puts it, and kept.
    const evidence = path.join(env.dataDir, 'evidence', one(byTask, 'hello-file').episodeId, 'attempt-1');
    await expect(readFile(path.join(evidence, 'result.json'), 'utf8')).resolves.toContain('"reward": 1');
    await expect(readFile(path.join(evidence, 'logs', 'verifier', 'reward.txt'), 'utf8')).resolves.toBe('1\n');
    // The planted files are gone from what the verifier left: it wrote none, and none survived.
    const planted = path.join(env.dataDir, 'evidence', one(stopped, 'planted-reward').episodeId, 'attempt-1', 'logs', 'verifier');
    await expect(readFile(path.join(planted, 'test-stdout.txt'), 'utf8')).resolves.toContain('checked');
    await expect(readFile(path.join(planted, 'reward.txt'), 'utf8')).rejects.toThrow(/ENOENT/);
  });

  it('an agent that does nothing fails with the reward its verifier wrote; half the work is half the reward', async () => {
    const nothing = await run(GRADABLE.map((id) => path.join(FIXTURES, id)), '{ kind: command, command: "true" }');
    for (const id of GRADABLE) expect({ id, ...one(nothing, id) }, id).toMatchObject({ id, status: 'failed', reward: 0 });
    expect(one(nothing, 'two-metrics').metrics).toEqual({ correctness: 0, documentation: 0 });
    const half = await run([path.join(FIXTURES, 'partial-credit')], '{ kind: command, command: "echo alpha > /app/a.txt" }');
    expect(one(half, 'partial-credit')).toMatchObject({ status: 'failed', reward: 0.5, metrics: { reward: 0.5 } });
  });

  it('grades a root verifier in one exec after the agent, its copies of the workspace and /logs the evidence; a verifier of another user gets its own exec, as that user; scripts not executable are made so', async () => {
    // A copy of non-root-agent whose verifier runs as builder and says whether it did.
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-harbor-verifier-user-'));
    const asBuilder = path.join(dir, 'verifier-as-builder');
    await cp(path.join(FIXTURES, 'non-root-agent'), asBuilder, { recursive: true });
    const toml = path.join(asBuilder, 'task.toml');
    await writeFile(toml, (await readFile(toml, 'utf8')).replace('[verifier]\n', '[verifier]\nuser = "builder"\n'));
    await writeFile(path.join(asBuilder, 'tests', 'test.sh'), '#!/bin/bash\nif [ "$(id -un)" = builder ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n');
    // And hello-file with its scripts not executable: Harbor makes solve.sh and test.sh so itself.
    const hello = path.join(dir, 'hello-file');
    await cp(path.join(FIXTURES, 'hello-file'), hello, { recursive: true });
    for (const task of [asBuilder, hello]) for (const script of ['solution/solve.sh', 'tests/test.sh']) await chmod(path.join(task, script), 0o644);
    const seen: Array<{ id: string; action: string }> = [];
    const events = await docker.getEvents({ filters: { type: ['container'], label: [`${LABEL.fleet}=${env.prefix}`] } });
    events.on('data', (chunk: Buffer) => {
      for (const line of chunk.toString().split('\n').filter(Boolean)) {
        const e = JSON.parse(line) as { Action: string; Actor: { ID: string } };
        seen.push({ id: e.Actor.ID, action: e.Action });
      }
    });
    try {
      const ran = await run([hello, asBuilder], '{ kind: oracle }');
      /** What the engine did in the episode's sandbox from the end of the oracle's exec to its removal. */
      const afterAgent = async (id: string) => {
        const container = one(ran, id).sandbox?.containerId;
        await waitFor(`${id}'s destroy event`, async () => seen.some((e) => e.id === container && e.action === 'destroy'), 10_000);
        const mine = seen.filter((e) => e.id === container).map((e) => e.action);
        const agent = mine.findIndex((a) => a.startsWith('exec_create: bash -c (/solution/solve.sh)'));
        expect(agent, `${id}: the oracle's exec among ${mine.join(', ')}`).toBeGreaterThanOrEqual(0);
        return mine.slice(mine.indexOf('exec_die', agent) + 1);
      };
      expect(one(ran, 'hello-file')).toMatchObject({ status: 'passed', reward: 1 });
      expect(one(ran, 'verifier-as-builder')).toMatchObject({ status: 'passed', reward: 1 });
      const root = await afterAgent('hello-file');
      // The agent's processes kept (no restart), then one exec of the end-of-turn program.
      expect(root).not.toContain('restart');
      expect(root.filter((a) => a.startsWith('exec_create'))).toEqual([expect.stringMatching(/^exec_create: \S+\/node\.real \S+\/end-of-turn\.cjs /)]);
      expect(root).not.toContain('extract-to-dir');
      // Nor a get at close: the workspace as the agent left it and /logs after the verifier came out on the exec's stream.
      expect(root).not.toContain('archive-path');
      const evidence = path.join(env.dataDir, 'evidence', one(ran, 'hello-file').episodeId, 'attempt-1');
      await expect(readFile(path.join(evidence, 'logs', 'verifier', 'reward.txt'), 'utf8')).resolves.toBe('1\n');
      await expect(readFile(path.join(evidence, 'logs', 'agent', 'oracle.txt'), 'utf8')).resolves.toBeDefined();
      const kept = JSON.parse(await readFile(path.join(evidence, 'evidence.json'), 'utf8')) as { workspace: { takenAt: string; added: string[] } };
      expect(kept.workspace).toMatchObject({ takenAt: 'agent-stopped', added: expect.arrayContaining(['greeting.txt']) });
      const builder = await afterAgent('verifier-as-builder');
      expect(builder).toContain('exec_create: bash -c (/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1');
      expect(builder).toContain('extract-to-dir');
    } finally {
      (events as unknown as { destroy(): void }).destroy();
    }
  });

  it('builds an environment once for many samples, and again when a file in environment/ changes', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-harbor-build-'));
    const task = path.join(dir, 'counted');
    await cp(path.join(FIXTURES, 'hello-file'), task, { recursive: true });
    // A fresh environment for this run, so the count starts from nothing.
    const dockerfile = path.join(task, 'environment', 'Dockerfile');
    await writeFile(dockerfile, `${await readFile(dockerfile, 'utf8')}RUN echo ${path.basename(dir)} > /etc/run-mark\n`);
    const tags: string[] = [];
    const events = await docker.getEvents({ filters: { type: ['image'], event: ['tag'] } });
    events.on('data', (chunk: Buffer) => {
      for (const line of chunk.toString().split('\n').filter(Boolean)) tags.push((JSON.parse(line) as { Actor: { Attributes: { name: string } } }).Actor.Attributes.name);
    });
    try {
      const first = await run([task], '{ kind: oracle }', 6);
      expect([...first.get('counted')!].map((r) => r.status)).toEqual(Array(6).fill('passed'));
      const digests = new Set(first.get('counted')!.map((r) => r.provenance.environment?.digest));
      expect(digests.size).toBe(1);
      await writeFile(path.join(task, 'environment', 'extra.txt'), 'changed\n');
      const second = await run([task], '{ kind: oracle }', 2);
      const digest2 = one(second, 'counted').provenance.environment?.digest;
      expect(digest2).not.toBe([...digests][0]);
      // The engine is shared with the files running beside this one (their builds tag images too):
      // only this task's two environments are counted, each tagged once.
      const mine = [[...digests][0]!, digest2!].map((d) => `rollout-fleet/env:${d.slice(0, 24)}`);
      await waitFor('the second build\'s tag event', async () => tags.includes(mine[1]!), 10_000);
      expect(tags.filter((t) => mine.includes(t))).toEqual(mine);
    } finally {
      (events as unknown as { destroy(): void }).destroy();
    }
  });
});

// Hostile agents against the two things prepared images changed (docs/HARBOR.md, docs/USAGE.md, "The
// warm sandbox pool"): a Harbor sandbox (and a services namespace's holder) is kept alive by the runtime
// generation's static `bin/keep-alive` from a read-only mount, the ENTRYPOINT's argument under the
// engine's init; and the folders every sandbox of a kind starts with (a Harbor task's /logs/agent,
// /logs/verifier, /logs/artifacts; our own tasks' /tests and workdir) are a layer of the image the
// sandbox is created from, where rename(2) of such a folder fails with EXDEV. Written black-box, from
// the docs and the existing tests, without reading src/.
//
// The promises checked (fixtures: test/fixtures/prepared-hostile; every Harbor test there writes the
// reward it computes into reward.txt, never reward.json, so a reward.json read, or its "planted" key in
// the metrics, can only be the agent's):
// a. a Harbor agent that kills every process it can see but PID 1, the keep-alive last (as root, with
//    task services, as the image's non-root USER whose keep-alive it may signal, and with the image's
//    WORKDIR made a file or its ENTRYPOINT made to fail, so that the sandbox cannot start again or stops
//    by itself: those two are the agent's error, once) ends its episode, with the real test's
//    reward or an error of a kind, never a reward the real test did not give; nothing of the batch
//    (container, holder, volume) is left on the engine;
// b. a root agent that tries every way to replace the keep-alive (cp, cat >, mv, ln, chmod, chown, rm,
//    mount(2), unshare, renaming /opt or the mount, a keep-alive first on PATH, the engine's init) with
//    a reward planter, plants a reward and kills the keep-alive so that a restart would run its
//    program, gets no reward of 1 (the real test writes 0), with the agent's processes kept (Harbor's
//    way) and with agentProcesses: stop; beside it, an honest agent in a task whose own ENTRYPOINT
//    cannot run twice is graded when kept, and an infrastructure error (not the agent's) when stopped;
// c. a root agent that moves /logs/verifier away and links it to /tmp, makes it a file, plants a
//    reward in it beside a chain of 400 folders of 200-character names (no path reaches its end, and
//    the folder cannot be renamed aside: EXDEV), does so with no /tmp to move the chain into (a file,
//    a link to the read-only runtime, a dangling link), replaces /logs by a link, or makes the WORKDIR
//    a file: reward 0 (the real test's) or an error of a kind, never 1, in both modes;
// d. a non-root command agent in one of our own tasks fills /tests and the workdir with chains too
//    deep for busybox's rm -rf (rehearsed in the sandbox) and leaves a test.sh and an expected.txt of
//    its own in /tests (read-only, in a read-only /tests, one a folder; then every pid taken; a
//    reward-file task too): the real tests run (their marker is in the verifier's output, the agent's
//    is not) and decide: a wrong answer fails, the right one passes.
// All batches are enqueued at once (one worker, four episodes at a time); each case waits on its own.
// Measured alone on 2 cores: about 45 s for the file.
import { cp, mkdtemp, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, docker, enqueueFile, fleetContainers, startEnvWorker, startFleetEnv, waitFor, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const SOURCES = path.join(ROOT, 'test/fixtures/prepared-hostile');
/** Files several fixture tasks carry (a task folder is whole on its own): kept once in _shared/, laid into each task's copy. */
const SHARED: Array<{ file: string; into: string; tasks: readonly string[] }> = [
  { file: 'kill-all.py', into: 'solution', tasks: ['kill-keepalive-right', 'kill-keepalive-wrong', 'kill-keepalive-services', 'kill-keepalive-user', 'kill-keepalive-no-workdir', 'kill-keepalive-entrypoint', 'replace-keepalive'] },
  { file: 'chain.sh', into: 'workspace', tasks: ['own-fake-pass', 'own-fake-fail', 'own-fake-pids', 'own-reward-file'] },
  { file: 'bury.py', into: 'solution', tasks: ['verifier-deep', 'verifier-deep-no-tmp-file', 'verifier-deep-no-tmp-link-dangling', 'verifier-deep-no-tmp-link-ro'] },
  { file: 'test.sh', into: 'tests', tasks: ['own-fake-pass', 'own-fake-fail', 'own-fake-pids'] },
];
/** The fixture tasks as enqueued: a copy of SOURCES with the shared files in place (set in beforeAll). */
let fixtures = '';
/** Root agents (one the image's USER, as its keep-alive) that kill every process they can see but PID 1. */
const KILLERS = ['kill-keepalive-right', 'kill-keepalive-wrong', 'kill-keepalive-services', 'kill-keepalive-user', 'kill-keepalive-no-workdir', 'kill-keepalive-entrypoint'];
/** Root agents that plant a reward of 1 in, or in place of, /logs/verifier. */
const BURIERS = [
  'verifier-moved-link', 'verifier-file', 'verifier-deep', 'logs-link-away',
  'verifier-deep-no-tmp-file', 'verifier-deep-no-tmp-link-ro', 'verifier-deep-no-tmp-link-dangling', 'workdir-file',
];
/** Our own tasks' non-root command agents. */
const OWN = ['own-fake-pass', 'own-fake-fail', 'own-fake-pids', 'own-reward-file'];
/** How long a batch may take to its last result: the episodes take seconds; past this one hangs. */
const RESULTS_WITHIN_MS = 150_000;

interface Run {
  batchId: string;
  byTask: Map<string, EpisodeResult>;
  seconds: number;
}

/** The containers and volumes carrying the batch's label. */
async function leftOf(batchId: string) {
  const containers = await fleetContainers('batch', batchId);
  const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.batch}=${batchId}`] } });
  return {
    containers: containers.map((c) => `${c.Labels[LABEL.environmentRole] ?? 'sandbox'} ${c.Names[0]} ${c.State}`),
    volumes: (Volumes ?? []).map((v) => v.Name),
  };
}

describe('prepared images and the static keep-alive against hostile agents', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  const runs: Record<'a' | 'b' | 'bStop' | 'c' | 'cStop' | 'd', Promise<Run>> = {} as never;

  /** Enqueue the fixture tasks `ids` with `agent`; resolves once every result is in and nothing of the batch is left. */
  async function run(ids: string[], agent: string, more = ''): Promise<Run> {
    const started = Date.now();
    const file = await writeBatch(`tasks: ${JSON.stringify(ids.map((id) => path.join(fixtures, id)))}\nagent: ${agent}\nsamples: 1\n${more}`, {});
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, RESULTS_WITHIN_MS);
    const byTask = new Map(results.map((r) => [r.taskId, r]));
    // Whatever the agents did to their sandboxes, nothing of the batch stays on the engine.
    let last = await leftOf(plan.batchId);
    try {
      await waitFor(`nothing of ${plan.batchId} left`, async () => {
        last = await leftOf(plan.batchId);
        return last.containers.length === 0 && last.volumes.length === 0;
      }, 60_000, 250);
    } catch (err) {
      throw new Error(`${(err as Error).message}: left ${JSON.stringify(last)}; results ${JSON.stringify(results.map(brief))}`);
    }
    return { batchId: plan.batchId, byTask, seconds: (Date.now() - started) / 1000 };
  }

  beforeAll(async () => {
    fixtures = path.join(await mkdtemp(path.join(os.tmpdir(), 'rf-prepared-hostile-')), 'tasks');
    await cp(SOURCES, fixtures, { recursive: true });
    for (const { file, into, tasks } of SHARED) {
      for (const task of tasks) await cp(path.join(SOURCES, '_shared', file), path.join(fixtures, task, into, file));
    }
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'prepared-hostile-w', { concurrency: 4 });
    const oracle = '{ kind: oracle }';
    // Harbor's way (the agent's processes kept: the sandbox restarts only because it stopped), and with
    // agentProcesses: stop (it always restarts before grading).
    runs.a = run(KILLERS, oracle);
    runs.b = run(['replace-keepalive', 'honest', 'entrypoint-once'], oracle);
    runs.bStop = run(['replace-keepalive', 'honest', 'entrypoint-once'], oracle, 'agentProcesses: stop\n');
    runs.c = run([...BURIERS, 'honest'], oracle);
    runs.cStop = run([...BURIERS, 'honest'], oracle, 'agentProcesses: stop\n');
    runs.d = run(OWN, '{ kind: command, command: "sh ./attack.sh" }');
    // Each case awaits its own; a failure is reported there, not as an unhandled rejection.
    for (const p of Object.values(runs)) p.catch(() => undefined);
  });
  afterAll(async () => {
    await Promise.allSettled(Object.values(runs));
    await worker?.close();
    await env?.close();
  }, RESULTS_WITHIN_MS + 90_000);

  const brief = (r: EpisodeResult) => ({ task: r.taskId, status: r.status, reward: r.reward, metrics: r.metrics, error: r.error, attempts: r.attempts, grading: r.grading });
  const attemptDir = (r: EpisodeResult) => path.join(env.dataDir, 'evidence', r.episodeId, `attempt-${r.attempts ?? 1}`);
  const evidenceText = (r: EpisodeResult, ...rel: string[]) => readFile(path.join(attemptDir(r), ...rel), 'utf8').catch((e: Error) => `(none: ${e.message})`);
  /** What to print with a failed expectation: the result, and what the agent and the real test said. */
  async function why(r: EpisodeResult): Promise<string> {
    const logs = await Promise.all([
      ['oracle', ['logs', 'agent', 'oracle.txt']], ['kills', ['logs', 'agent', 'kills.txt']], ['attempts', ['logs', 'agent', 'attempts.txt']],
      ['verifier', ['logs', 'verifier', 'test-stdout.txt']], ['agent stdout', ['agent.stdout.txt']], ['verifier stdout', ['verifier.stdout.txt']],
    ].map(async ([name, rel]) => `  ${name as string}: ${(await evidenceText(r, ...(rel as string[]))).slice(0, 1500)}`));
    return `${JSON.stringify(brief(r))}\n${logs.join('\n')}`;
  }

  /**
   * The episode ended with the reward the real test gives (`real`), graded, or as an error of a kind
   * with no reward; never with a planted reward.json (its "planted" key) or any other number.
   */
  async function onlyTheRealTest(r: EpisodeResult | undefined, real: number): Promise<void> {
    expect(r, 'no result').toBeDefined();
    const said = await why(r!);
    expect(r!.metrics?.planted, `a planted reward file was read:\n${said}`).toBeUndefined();
    if (r!.status === 'error') {
      expect(r!.reward, said).toBeNull();
      expect(r!.error?.kind, said).toBeTruthy();
    } else {
      expect(['passed', 'failed'], said).toContain(r!.status);
      expect(r!.reward, said).toBe(real);
    }
  }

  const show = (label: string, run: Run) => console.log(`${label} (${run.seconds.toFixed(1)} s):\n${[...run.byTask.values()].map((r) => `  ${JSON.stringify(brief(r))}`).join('\n')}`);

  it('a: a root agent that kills every process but PID 1, the keep-alive too, gets the real test\'s reward or an error of a kind; nothing of the batch is left', async () => {
    // run() already waited for every result (a hang fails it) and for no container or volume of the batch.
    const a = await runs.a;
    show('a', a);
    // The right answer was written before the kill: 1 (not the planted 0.25), or an error.
    await onlyTheRealTest(a.byTask.get('kill-keepalive-right'), 1);
    await onlyTheRealTest(a.byTask.get('kill-keepalive-services'), 1);
    // A wrong answer and a planted 1: the real test writes 0.
    await onlyTheRealTest(a.byTask.get('kill-keepalive-wrong'), 0);
    await onlyTheRealTest(a.byTask.get('kill-keepalive-user'), 0);
    // The sandbox cannot start again (its working folder a file): the agent's error, once, never an
    // infra error retried (breaking the sandbox must not buy another try).
    const noWorkdir = a.byTask.get('kill-keepalive-no-workdir');
    await onlyTheRealTest(noWorkdir, 0);
    expect({ code: noWorkdir?.error?.code, kind: noWorkdir?.error?.kind, attempts: noWorkdir?.attempts }, await why(noWorkdir!)).toEqual({ code: 'agent_crashed', kind: 'agent', attempts: 1 });
    // Its ENTRYPOINT made a program that fails: started again, the sandbox stops by itself. The same.
    const entrypoint = a.byTask.get('kill-keepalive-entrypoint');
    await onlyTheRealTest(entrypoint, 0);
    expect({ code: entrypoint?.error?.code, kind: entrypoint?.error?.kind, attempts: entrypoint?.attempts }, await why(entrypoint!)).toEqual({ code: 'agent_crashed', kind: 'agent', attempts: 1 });
    // The attack was real: the agent saw the keep-alive, the runtime's static program, and killed it.
    for (const id of KILLERS) {
      const r = a.byTask.get(id)!;
      const kills = await evidenceText(r, 'logs', 'agent', 'kills.txt');
      expect(kills, `${id}: the agent's record of what it killed\n${await why(r)}`).toMatch(/found pid \d+ exe=\/opt\/rollout-fleet\/bin\/keep-alive/);
      expect(kills, id).toMatch(/keep-alive pids: \[\d+/);
    }
  }, RESULTS_WITHIN_MS + 90_000);

  it('b: a root agent that tries to put a reward planter in place of the keep-alive, then kills it, never gets a reward of 1', async () => {
    for (const [mode, pending] of [['kept', runs.b], ['stop', runs.bStop]] as const) {
      const b = await pending;
      show(`b, agentProcesses ${mode}`, b);
      // The control: the same test gives 1 to a right answer in this image.
      const honest = b.byTask.get('honest')!;
      expect(honest, `${mode}: ${await why(honest)}`).toMatchObject({ status: 'passed', reward: 1 });
      const r = b.byTask.get('replace-keepalive')!;
      const said = `${mode}: ${await why(r)}`;
      expect(r.reward, said).not.toBe(1);
      await onlyTheRealTest(r, 0);
      // The mount is read-only: no attempt replaced the program itself.
      expect(await evidenceText(r, 'logs', 'agent', 'attempts.txt'), said).toContain('keep-alive unchanged');
      // An honest agent in a task whose own ENTRYPOINT cannot run twice: graded when nothing restarts
      // the sandbox; started again (agentProcesses: stop) it stops by itself, and that is not the
      // agent's error (it changed none of the ENTRYPOINT's files) but the infrastructure's, retried.
      const once = b.byTask.get('entrypoint-once')!;
      if (mode === 'kept') expect(once, `${mode}: ${await why(once)}`).toMatchObject({ status: 'passed', reward: 1 });
      else expect({ status: once.status, kind: once.error?.kind }, `${mode}: ${await why(once)}`).toEqual({ status: 'error', kind: 'infra' });
    }
  }, RESULTS_WITHIN_MS + 90_000);

  it('c: a root agent that moves, links, replaces or buries /logs/verifier (a folder of the image\'s layer) never gets the 1 it planted', async () => {
    const failures: string[] = [];
    for (const [mode, pending] of [['kept', runs.c], ['stop', runs.cStop]] as const) {
      const c = await pending;
      show(`c, agentProcesses ${mode}`, c);
      const honest = c.byTask.get('honest')!;
      expect(honest, `${mode}: ${await why(honest)}`).toMatchObject({ status: 'passed', reward: 1 });
      for (const id of BURIERS) {
        const r = c.byTask.get(id)!;
        try {
          expect(r.reward, id).not.toBe(1);
          await onlyTheRealTest(r, 0);
          // /logs a link to the agent's tree: made again as a real folder, so the real test's output
          // is in the evidence's copy of /logs.
          if (id === 'logs-link-away') expect(await evidenceText(r, 'logs', 'verifier', 'test-stdout.txt'), await why(r)).toContain('real test');
        } catch (err) {
          failures.push(`${id} (agentProcesses ${mode}): ${(err as Error).message}`);
        }
      }
    }
    expect(failures, failures.join('\n\n')).toEqual([]);
  }, RESULTS_WITHIN_MS + 90_000);

  it('d: our own task\'s non-root agent buries /tests and the workdir under chains too deep for rm -rf and leaves tests of its own: the real tests run and decide', async () => {
    const d = await runs.d;
    show('d', d);
    const expected: Record<string, { status: string; reward: number }> = {
      'own-fake-pass': { status: 'failed', reward: 0 },
      'own-fake-fail': { status: 'passed', reward: 1 },
      'own-fake-pids': { status: 'failed', reward: 0 },
      'own-reward-file': { status: 'failed', reward: 0 },
    };
    for (const id of OWN) {
      const r = d.byTask.get(id)!;
      const said = await why(r);
      // The attack is real: busybox's rm -rf could not remove the same chain in the sandbox.
      expect(await evidenceText(r, 'agent.stdout.txt'), `${id}: the rehearsal\n${said}`).toContain('rehearsal=ok');
      expect(r.metrics?.planted, said).toBeUndefined();
      // Every pid taken is a resource attack: an error of a kind is an honest end for it, a grade only the real test's.
      if (id === 'own-fake-pids' && r.status === 'error') {
        expect(r.reward, said).toBeNull();
        expect(r.error?.kind, said).toBeTruthy();
        continue;
      }
      expect({ id, status: r.status, reward: r.reward }, said).toEqual({ id, ...expected[id] });
      // The real test.sh ran (its marker), not the agent's.
      const verifierOut = await evidenceText(r, 'verifier.stdout.txt');
      expect(verifierOut, said).toContain('real-test-5d1c9e');
      expect(verifierOut, said).not.toContain('agent-fake-test');
    }
  }, RESULTS_WITHIN_MS + 90_000);
});

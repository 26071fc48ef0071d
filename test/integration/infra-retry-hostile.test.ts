// Hostile root agents that try to turn a failed episode into an infrastructure error. An infra error
// (docs/USAGE.md, the error table) is retried, up to 3 attempts, and never scored as the agent's
// failure: an agent that cannot solve its task gains from breaking what the fleet needs after its turn
// (restarting the sandbox, exec'ing the grader into it). docs/HARBOR.md ("The end of the agent's
// turn", "What a root agent can still do") promises that a sandbox the agent broke is the agent's
// error, once, never an infrastructure error retried. Written black-box, from the docs and the
// existing tests (prepared-hostile.test.ts), without reading src/.
//
// The property checked (fairness), for each attack, with the agent's processes kept (Harbor's way, the
// default) and with agentProcesses: stop (a restart before grading): the episode does not end with
// reward 1 (every fixture's answer is wrong; its test.sh, bash builtins only, always writes the reward it
// computes: 1 only for "42" in /app/answer.txt), and it is not an infra error, nor anything after a
// retry: it ends graded 0 (failed) or as an error of kind agent or verifier, in one attempt.
// Fixtures: test/fixtures/infra-retry-hostile, all root agents (the image's USER), the oracle running
// each solution/solve.sh as the agent:
//   no-bash             bash deleted (test.sh's interpreter, and what the grader runs it with);
//   false-tools         sh, env, tar, cat, cp, mv, rm, mkdir, ls, sleep, python3... made /bin/false;
//   no-passwd           /etc/passwd and /etc/group deleted, the task naming user = "root" for both phases;
//   odd-paths           /tmp a file, /tests a dangling link, /logs/artifacts a FIFO, /dev/null a file,
//                       /logs, /logs/*, /app and / mode 000;
//   process-killer      a detached process SIGKILLs every process started after it (every later exec);
//   pids-exhaust        a detached process holds every pid the limit allows;
//   memory-hog          /dev/shm filled and a detached supervisor keeps allocating to the memory limit;
//   entrypoint-removed  the image's own ENTRYPOINT script deleted (a restart has nothing to run);
//   stop-under-verifier a watcher (left running, and put in the ENTRYPOINT) that, once grading shows,
//                       SIGKILLs every process but PID 1, the keep-alive too: the sandbox stops under the verifier;
//   entrypoint-signal-stop the ENTRYPOINT rewritten to SIGKILL the keep-alive at every start, then the
//                       keep-alive killed: started again for grading, the sandbox stops by a signal (137).
//                       First seen failing (both modes: infra docker_error "not-swept", 3 attempts, when
//                       only a stop by exit 0-127 counted as the agent's); now the agent's error, once.
// A watcher the agent leaves running may still kill the sandbox under the verifier (stop-under-verifier,
// kept): a root agent's processes are not trusted in that mode (docs/HARBOR.md); the verifier's error
// it then ends with is accepted here.
// Beside them an honest agent in the same image passes (the control). Both batches are enqueued at
// once (one worker, four episodes at a time); each case waits on its batch.
// Measured alone on 2 cores: about 31 s for the file (the failing case's retries included).
import { cp, mkdtemp, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, enqueueFile, fleetContainers, startEnvWorker, startFleetEnv, waitFor, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const SOURCES = path.join(ROOT, 'test/fixtures/infra-retry-hostile');
const ATTACKS = ['no-bash', 'false-tools', 'no-passwd', 'odd-paths', 'process-killer', 'pids-exhaust', 'memory-hog', 'entrypoint-removed', 'stop-under-verifier', 'entrypoint-signal-stop'] as const;
/**
 * Attacks whose outcome may honestly be kind infra, with the reason (none so far: every attack here is
 * the agent's own doing inside its own container, which the fleet can tell from an engine failure).
 */
const INFRA_ACCEPTED: Partial<Record<(typeof ATTACKS)[number], string>> = {};
/** How long a batch may take to its last result: the episodes take seconds, retries add 2 + 4 s of backoff. */
const RESULTS_WITHIN_MS = 120_000;

type Mode = 'kept' | 'stop';
interface Run {
  batchId: string;
  byTask: Map<string, EpisodeResult>;
  seconds: number;
}

describe('a root agent cannot buy an infrastructure retry by breaking its sandbox', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let fixtures = '';
  const runs = {} as Record<Mode, Promise<Run>>;

  /** Enqueue every fixture task with the oracle; resolves once every result is in and nothing of the batch is left. */
  async function run(more: string): Promise<Run> {
    const started = Date.now();
    const ids = ['honest', ...ATTACKS];
    const file = await writeBatch(`tasks: ${JSON.stringify(ids.map((id) => path.join(fixtures, id)))}\nagent: { kind: oracle }\nsamples: 1\n${more}`, {});
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, RESULTS_WITHIN_MS);
    await waitFor(`nothing of ${plan.batchId} left`, async () => (await fleetContainers('batch', plan.batchId)).length === 0, 60_000, 250);
    return { batchId: plan.batchId, byTask: new Map(results.map((r) => [r.taskId, r])), seconds: (Date.now() - started) / 1000 };
  }

  beforeAll(async () => {
    // Enqueued from a copy, as the other hostile files do (the fixture folder stays as written).
    fixtures = path.join(await mkdtemp(path.join(os.tmpdir(), 'rf-infra-retry-hostile-')), 'tasks');
    await cp(SOURCES, fixtures, { recursive: true });
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'infra-retry-hostile-w', { concurrency: 4 });
    runs.kept = run('');
    runs.stop = run('agentProcesses: stop\n');
    // Each case awaits its own; a failure is reported there, not as an unhandled rejection.
    for (const p of Object.values(runs)) p.catch(() => undefined);
  });
  afterAll(async () => {
    await Promise.allSettled(Object.values(runs));
    await worker?.close();
    await env?.close();
  }, RESULTS_WITHIN_MS + 60_000);

  const brief = (r: EpisodeResult) => ({ task: r.taskId, status: r.status, reward: r.reward, error: r.error, attempts: r.attempts, grading: r.grading });
  const evidenceText = (r: EpisodeResult, attempt: number, ...rel: string[]) =>
    readFile(path.join(env.dataDir, 'evidence', r.episodeId, `attempt-${attempt}`, ...rel), 'utf8').catch((e: Error) => `(none: ${e.message})`);
  /** What to print with a failed expectation: the result, and what the agent and the real test said in the first attempt. */
  async function why(r: EpisodeResult): Promise<string> {
    const logs = await Promise.all([
      ['oracle', ['logs', 'agent', 'oracle.txt']], ['verifier', ['logs', 'verifier', 'test-stdout.txt']],
      ['agent stdout', ['agent.stdout.txt']], ['verifier stdout', ['verifier.stdout.txt']],
    ].map(async ([name, rel]) => `  ${name as string}: ${(await evidenceText(r, 1, ...(rel as string[]))).slice(0, 800)}`));
    return `${JSON.stringify(brief(r))}\n${logs.join('\n')}`;
  }
  const show = (label: string, run: Run) => console.log(`${label} (${run.seconds.toFixed(1)} s):\n${[...run.byTask.values()].map((r) => `  ${JSON.stringify(brief(r))}`).join('\n')}`);

  for (const mode of ['kept', 'stop'] as const) {
    it(`${mode}: the control, an honest agent in the same image, passes`, async () => {
      const r = (await runs[mode]).byTask.get('honest');
      show(`agentProcesses ${mode}`, await runs[mode]);
      expect(r, 'no result').toBeDefined();
      expect({ status: r!.status, reward: r!.reward, attempts: r!.attempts }, await why(r!)).toEqual({ status: 'passed', reward: 1, attempts: 1 });
    }, RESULTS_WITHIN_MS + 60_000);

    for (const id of ATTACKS) {
      it(`${mode}: ${id} ends graded 0 or as the agent's or the verifier's error, once; never 1, never an infra retry`, async () => {
        const r = (await runs[mode]).byTask.get(id);
        expect(r, 'no result').toBeDefined();
        const said = `${id} (agentProcesses ${mode}): ${await why(r!)}`;
        expect(r!.reward, said).not.toBe(1);
        expect(r!.status, said).not.toBe('passed');
        if (r!.status === 'error') {
          expect(r!.reward, said).toBeNull();
          const allowed = INFRA_ACCEPTED[id] ? ['agent', 'verifier', 'infra'] : ['agent', 'verifier'];
          expect(allowed, `the error's kind: ${said}`).toContain(r!.error?.kind);
        } else {
          expect({ status: r!.status, reward: r!.reward }, said).toEqual({ status: 'failed', reward: 0 });
        }
        // One attempt: breaking the sandbox bought no second try.
        expect(r!.attempts, `attempts: ${said}`).toBe(1);
      }, RESULTS_WITHIN_MS + 60_000);
    }
  }
});

// Verification: nothing the agent started may outlive it (the sandbox is restarted, so every pid and
// all memory are free again), the model is gone, and only then do the hidden tests enter the sandbox
// (owned by root, so the agent's leftovers cannot edit them). The verifier's exit code is the reward,
// unless the task opts in to a reward file (`verify.reward: file`): then /logs/verifier is made afresh
// by root right before the verifier runs, and its reward.json or reward.txt is read as a Harbor task's
// is (reward-file.ts), its exit code ignored.
// The whole phase runs under the verification reserve: a stalled engine ends it as an infrastructure
// failure, never as a reward. An agent that filled its engine-enforced disk quota, so the tests cannot
// even be copied in, failed for its disk limit (kind agent), as where the limit is watched.
// Returns the grade; the sweep's workspace copy and the verifier's run (also one that arrives after the
// reserve) are left in the trail, which close reads whether or not verification returned.
import type { AgentRun } from '../agent/agent.ts';
import { Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { keepWorkspaceEarly } from '../evidence/workspace-copy.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import { passes } from '../tasks/batch-spec.ts';
import { HARBOR_VERIFIER_RESET } from './harbor-checks.ts';
import { verifyHarbor } from './harbor-verify.ts';
import { readSandboxReward } from './reward-file.ts';
import { runVerifier } from './run-verifier.ts';
import type { AttemptTrail, EpisodeAttempt, EpisodeDeps, Graded, SetUpResult } from './episode-attempt.ts';

/** What verification uses of the worker's clients and stores. */
export type VerifyDeps = Pick<EpisodeDeps, 'evidence' | 'snapshotLimits' | 'log' | 'outputCapBytes' | 'docker' | 'callTimeoutMs' | 'prefix' | 'workerId' | 'sandboxRuntime'>;

/** Where the hidden tests are copied for verification, after the agent stopped. */
export const TESTS_DIR = '/tests';
const ROOT_OWNER = { uid: 0, gid: 0 } as const;
/**
 * /logs/verifier made afresh for a reward-file task, in two steps (after every process of the agent is
 * gone). First as the sandbox user: what the agent left there (a task may work in /logs) is its own, so
 * it can open it up and remove it, even a folder it made unreadable, which root without capabilities
 * (no DAC_OVERRIDE) could not; where /logs is the user's, it makes the folder again itself (root could
 * not write there). Then as root: unless an empty real folder is there now, it is removed and made.
 */
const VERIFIER_LOGS_AS_USER = '{ [ -d /logs ] && [ -O /logs ] && chmod u+rwx /logs; } 2>/dev/null; if [ -e /logs/verifier ] || [ -L /logs/verifier ]; then chmod -R u+rwx /logs/verifier 2>/dev/null; rm -rf /logs/verifier 2>/dev/null; fi; mkdir -p /logs/verifier 2>/dev/null && chmod 777 /logs/verifier 2>/dev/null; true';
const VERIFIER_LOGS_AS_ROOT = `if [ -d /logs/verifier ] && [ ! -L /logs/verifier ] && [ -z "$(ls -A /logs/verifier)" ]; then exit 0; fi; ${HARBOR_VERIFIER_RESET}`;

/** A tar of the workspace is its files plus headers: this much past the snapshot's cap is still taken whole. */
const SNAPSHOT_TAR_SLACK_BYTES = 1024 * 1024;

/**
 * The agent's failure when `err` (from writing into the sandbox) is its engine-enforced disk quota
 * being full: "disk quota exceeded" (btrfs qgroups) always; "no space left on device" (xfs project
 * quotas, but also the engine's whole disk) only when the layer measures at least 90% of the limit.
 */
async function diskFullByAgent(session: SandboxSession, diskMb: number, err: unknown, signal: AbortSignal): Promise<FleetError | undefined> {
  if (!session.diskEnforced) return undefined;
  const message = err instanceof Error ? err.message : String(err);
  const quota = /disk quota exceeded/i.test(message);
  if (!quota && !/no space left on device/i.test(message)) return undefined;
  if (!quota) {
    const bytes = await session.writableLayerBytes(signal).catch(() => 0);
    if (bytes < diskMb * 1024 * 1024 * 0.9) return undefined;
  }
  return new FleetError(
    'disk_limit_exceeded',
    `the agent filled the sandbox's disk to its limits.diskMb of ${diskMb} MB (enforced by the engine): the tests could not be copied in`,
    { cause: err },
  );
}

/** The agent's process ended by a signal (exit 128+, or no code): its sandbox may have gone with it. */
function killedBySignal(agentRun: AgentRun): boolean {
  return !agentRun.timedOut && (agentRun.exitCode === null || agentRun.exitCode >= 128);
}

export async function verify(
  attempt: EpisodeAttempt,
  deps: VerifyDeps,
  made: Pick<SetUpResult, 'archive' | 'proxy' | 'runtime' | 'verifierImage' | 'services'>,
  session: SandboxSession,
  trail: Pick<AttemptTrail, 'verifyRun' | 'workspaceCopy'>,
  agentRun: AgentRun,
): Promise<Graded> {
  const { task } = attempt.job;
  if (task.harbor) return verifyHarbor(attempt, deps, made, session, trail, agentRun, task.harbor);
  const deadline = new Deadline('verify', task.reserves.verifySec * 1000, attempt.signal);
  try {
    // A process left behind could rewrite the tests once they arrive, and a fork bomb or zombies could
    // leave the verifier no pid to run with. First the cheap way: one exec kills every process of the
    // sandbox user until none is left. Its running at all shows the sandbox is up with its init. (Not
    // skipped when the engine's process list looks clean: `top` reads the container's pids, then runs
    // ps, and keeps what is in both, so a relay of processes living milliseconds each slips between the
    // two; test/integration/verify-evasion.test.ts.)
    // The same exec then copies the workspace as the agent left it: close keeps that, not the engine's
    // copy after the verifier ran (one archive call fewer on the result's path).
    const copy = { dir: task.workdir, capBytes: deps.snapshotLimits.maxBytes + SNAPSHOT_TAR_SLACK_BYTES };
    const sweep = killedBySignal(agentRun) ? { swept: false } : await deadline.run('stopping what the agent left running', (signal) => session.sweepProcesses(signal, copy));
    if (sweep.tar !== undefined) trail.workspaceCopy = keepWorkspaceEarly(deps, { episodeId: attempt.job.episodeId, attempt: attempt.attempt }, sweep.tar);
    const { swept } = sweep;
    if (!swept) {
      // Only a sandbox that is still up is verified: one that stopped under the agent (the engine
      // restarted, or something outside killed it) cut the agent short, and the restart below would
      // hide that and grade a half-done workspace. The sandbox user cannot stop it (its init is root's).
      const before = await deadline.run('checking the sandbox', (signal) => session.state(signal));
      // The engine learns of a killed sandbox a moment after its processes die: an agent killed by a
      // signal (exit 128+) is followed by a probe, which cannot start in a sandbox whose init is gone.
      const alive = before.running && (!killedBySignal(agentRun) || (await deadline.run('probing the sandbox', (signal) => session.alive(signal))));
      if (!alive) {
        if (before.initOomKilled) throw new FleetError('agent_crashed', 'the sandbox ran out of memory under the agent and its init was killed');
        throw new FleetError('sandbox_lost', `the sandbox stopped under the agent (agent exit ${agentRun.exitCode}): the engine restarted or it was stopped from outside`);
      }
      // The engine kills everything and starts the sandbox afresh (files kept), which needs no pid inside it.
      await deadline.run('restarting the sandbox', (signal) => session.restart(signal));
    }
    // The verifier runs without a model.
    await deadline.run('closing the model proxy', async () => made.proxy?.close());
    const tests = await made.archive.partAsTar('tests', TESTS_DIR, ROOT_OWNER);
    await deadline.run('copying the tests in', (signal) => session.putArchive(tests, '/', signal))
      .catch(async (err: unknown) => {
        throw await diskFullByAgent(session, task.limits.diskMb, err, deadline.signal) ?? err;
      });
    const status = (reward: number) => (agentRun.timedOut ? 'timeout' : passes(reward, attempt.job.passThreshold) ? 'passed' : 'failed');
    if (task.verify.reward === 'file') {
      // Made now, by root, after everything the agent started is gone: nothing it left there counts.
      await deadline.run('making /logs/verifier afresh', async (signal) => {
        await session.exec(VERIFIER_LOGS_AS_USER, { timeoutMs: 30_000, capBytes: 4096, workdir: '/', signal });
        const run = await session.exec(VERIFIER_LOGS_AS_ROOT, { timeoutMs: 30_000, capBytes: 4096, user: '0', workdir: '/', signal });
        if (run.exitCode !== 0) throw new FleetError('docker_error', `making /logs/verifier afresh failed (exit ${run.exitCode}): ${run.stderr.text.slice(0, 300)}`);
      });
      await runVerifier(session, deadline, trail, task.verify.command, task.verify.timeoutSec, { capBytes: deps.outputCapBytes });
      const { reward, metrics } = await deadline.run('reading the reward file', (signal) => readSandboxReward(session, signal));
      return { status: status(reward), reward, metrics };
    }
    const verifyRun = await runVerifier(session, deadline, trail, task.verify.command, task.verify.timeoutSec, { capBytes: deps.outputCapBytes });
    if (verifyRun.exitCode !== 0 && verifyRun.exitCode !== 1) {
      throw new FleetError('verifier_crashed', `verifier exited with ${verifyRun.exitCode} (0 passes, 1 fails, anything else is a broken verifier)`);
    }
    const reward = verifyRun.exitCode === 0 ? 1 : 0;
    return { status: status(reward), reward };
  } finally {
    deadline.dispose();
  }
}

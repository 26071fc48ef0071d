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
import { tarBuffer, tarFolderName } from '../archive/tar-buffer.ts';
import { SANDBOX_USER, type SandboxSession } from '../sandbox/sandbox-session.ts';
import { passes } from '../tasks/batch-spec.ts';
import { HARBOR_VERIFIER_RESET } from './harbor-checks.ts';
import { verifyHarbor } from './harbor-verify.ts';
import { copyCapBytes, keepCopies, rewardOfFiles, verifiedRun } from './end-of-turn-outcome.ts';
import { superviseVerifier } from './run-verifier.ts';
import type { AttemptTrail, EpisodeAttempt, EpisodeDeps, Graded, SetUpResult } from './episode-attempt.ts';

/** What verification uses of the worker's clients and stores. */
export type VerifyDeps = Pick<EpisodeDeps, 'evidence' | 'snapshotLimits' | 'log' | 'outputCapBytes' | 'docker' | 'callTimeoutMs' | 'prefix' | 'workerId' | 'sandboxRuntime'>;

/** Where the hidden tests are copied for verification, after the agent stopped. */
export const TESTS_DIR = '/tests';

/**
 * In each of our own tasks' sandboxes from the start (part of the image it is created from:
 * prepared-images.ts): /tests and the workdir, the sandbox user's and empty, so that the end-of-turn
 * exec (run as that user) can unpack the tests in /tests, and the agent's exec its workspace in the
 * workdir. The agent may put things in /tests while it runs; the end of its turn empties it once none
 * of its processes is left. (A seeded sandbox has the workspace written over it before its start.)
 */
export const userFoldersTar: (workdir: string) => Promise<Buffer> = (() => {
  const made = new Map<string, Promise<Buffer>>();
  return (workdir) => {
    let tar = made.get(workdir);
    if (tar === undefined) {
      tar = tarBuffer((pack) => {
        for (const folder of [TESTS_DIR, workdir]) {
          pack.entry({ name: tarFolderName(folder), type: 'directory', mode: 0o755, uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid, mtime: new Date(0) });
        }
      });
      made.set(workdir, tar);
    }
    return tar;
  };
})();
const ROOT_OWNER = { uid: 0, gid: 0 } as const;
/**
 * /logs/verifier made afresh for a reward-file task, after every process of the agent is gone. The
 * end-of-turn program does it as the sandbox user: what the agent left there is its own, so it can
 * open it up and remove it, even a folder it made unreadable, which root without capabilities (no
 * DAC_OVERRIDE) could not. Only when something there is root's (an image's /logs) is this run as root:
 * unless an empty real folder is there now, it is removed and made.
 */
const VERIFIER_LOGS_AS_ROOT = `if [ -d /logs/verifier ] && [ ! -L /logs/verifier ] && [ -z "$(ls -A /logs/verifier)" ]; then exit 0; fi; ${HARBOR_VERIFIER_RESET}`;

/** The agent's process ended by a signal (exit 128+, or no code): its sandbox may have gone with it. */
function killedBySignal(agentRun: AgentRun): boolean {
  return !agentRun.timedOut && (agentRun.exitCode === null || agentRun.exitCode >= 128);
}

export async function verify(
  attempt: EpisodeAttempt,
  deps: VerifyDeps,
  made: Pick<SetUpResult, 'archive' | 'proxy' | 'runtime' | 'verifierImage' | 'services' | 'image'>,
  session: SandboxSession,
  trail: Pick<AttemptTrail, 'verifyRun' | 'workspaceCopy' | 'logsCopy'>,
  agentRun: AgentRun,
): Promise<Graded> {
  const { task } = attempt.job;
  if (task.harbor) return verifyHarbor(attempt, deps, made, session, trail, agentRun, task.harbor);
  const deadline = new Deadline('verify', task.reserves.verifySec * 1000, attempt.signal);
  try {
    // The verifier runs without a model.
    await deadline.run('closing the model proxy', async () => made.proxy?.close());
    const tests = await made.archive.partAsTar('tests', TESTS_DIR, ROOT_OWNER);
    const rewardFile = task.verify.reward === 'file';
    // One exec ends the agent's turn (end-of-turn.ts): it kills every process of the sandbox user until
    // none is left (a process left behind could rewrite the tests once they arrive; a fork bomb or
    // zombies could leave the verifier no pid), copies the workspace as the agent left it (close keeps
    // that, not the engine's copy after the verifier ran), empties /tests of what the agent left there,
    // unpacks the tests from its stdin, and runs the verifier. Nothing of the image's PATH runs in it
    // but /bin/sh's builtins: the rest is the runtime generation's node. (The sweep is not skipped when
    // the engine's process list looks clean: `top` reads the container's pids, then runs ps, and keeps
    // what is in both, so a relay of processes living milliseconds each slips between the two;
    // test/integration/verify-evasion.test.ts.)
    let verifierStarted: number | undefined;
    const endTurn = () => superviseVerifier(deadline, trail, task.verify.timeoutSec, () => verifierStarted, (signal) => session.endTurn({
      runtimeMountPath: made.runtime.mountPath, workdir: task.workdir, testsDir: TESTS_DIR, tests: [tests],
      copyCapBytes: copyCapBytes(deps), ...(rewardFile && { logsCapBytes: copyCapBytes(deps) }),
      command: task.verify.command, rewardFile, verifierTimeoutMs: task.verify.timeoutSec * 1000, outputCapBytes: deps.outputCapBytes,
      signal, onVerifierStart: () => (verifierStarted = performance.now()),
    }), (end) => (end.outcome === 'verified' ? end.verifyRun : undefined));
    let end = killedBySignal(agentRun) ? { outcome: 'not-swept' as const } : await endTurn();
    if (end.outcome === 'not-swept') {
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
      end = await endTurn();
      if (end.outcome === 'not-swept') throw new FleetError('docker_error', 'the end of the agent\'s turn could not run in the restarted sandbox');
    }
    if (end.outcome === 'logs-need-root') {
      // What the agent left in /logs that only root can remove (the image made /logs root's): made afresh by root, then again.
      await deadline.run('making /logs/verifier afresh', async (signal) => {
        const run = await session.exec(VERIFIER_LOGS_AS_ROOT, { timeoutMs: 30_000, capBytes: 4096, user: '0', workdir: '/', signal });
        if (run.exitCode !== 0) throw new FleetError('docker_error', `making /logs/verifier afresh failed (exit ${run.exitCode}): ${run.stderr.text.slice(0, 300)}`);
      });
      end = await endTurn();
      if (end.outcome === 'not-swept' || end.outcome === 'logs-need-root') throw new FleetError('docker_error', `/logs/verifier could not be made afresh for the verifier (${end.outcome})`);
    }
    keepCopies(deps, attempt, trail, end);
    const verifyRun = await verifiedRun(end, session, deadline, task.limits.diskMb);
    const status = (reward: number) => (agentRun.timedOut ? 'timeout' : passes(reward, attempt.job.passThreshold) ? 'passed' : 'failed');
    if (rewardFile) {
      const { reward, metrics } = rewardOfFiles(end.outcome === 'verified' ? end.reward : undefined);
      return { status: status(reward), reward, metrics };
    }
    if (verifyRun.exitCode !== 0 && verifyRun.exitCode !== 1) {
      throw new FleetError('verifier_crashed', `verifier exited with ${verifyRun.exitCode} (0 passes, 1 fails, anything else is a broken verifier)`);
    }
    const reward = verifyRun.exitCode === 0 ? 1 : 0;
    return { status: status(reward), reward };
  } finally {
    deadline.dispose();
  }
}

// Verification of a Harbor task, as Harbor's shared verifier runs it (H:verifier/verifier.py) with
// the fleet's guarantees added. What the agent left running keeps running into grading, as under
// Harbor (a server or VM the task asked for is there for the tests), unless the batch says
// `agentProcesses: stop`: then, since the agent may have run as root and no process of it is trusted to
// be gone by a sweep of one user, the sandbox is restarted (the engine kills every process; the image's
// ENTRYPOINT starts the task's services again, and its healthcheck is waited for again). Then, as root,
// /logs/verifier is emptied (a reward file planted before grading never counts), /tests is replaced by
// the tests, and `(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1` runs as [verifier].user with
// [verifier].env. Its exit code is ignored: the reward file is the grade.
// When the verifier runs as root (Harbor's tasks' usual case) all of that is ONE exec, the end-of-turn
// program (src/sandbox/end-of-turn/) run as root by the runtime generation's node; a verifier of
// another user gets the steps one call each after a restart (root's exec, the tests' put, its own exec,
// the reward files read through the engine), so the engine itself makes it that user.
import type { AgentRun } from '../agent/agent.ts';
import { Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import { DEFAULT_AGENT_PROCESSES, passes } from '../tasks/batch-spec.ts';
import { hasEgress } from '../egress/network-grant.ts';
import type { HarborRun, TaskSpec } from '../tasks/task-spec.ts';
import type { AttemptTrail, EpisodeAttempt, Graded, SetUpResult } from './episode-attempt.ts';
import { HARBOR_TESTS_RESET, HARBOR_VERIFIER_RESET, execAsRoot, runHealthcheck } from './harbor-checks.ts';
import { copyCapBytes, keepCopies, rewardOfFiles, verifiedRun } from './end-of-turn-outcome.ts';
import { readSandboxReward, type Reward } from './reward-file.ts';
import { runVerifier, superviseVerifier } from './run-verifier.ts';
import { verifySeparately, type SeparateVerifyDeps } from './separate-verifier.ts';
import { phaseGrants } from './phase-egress.ts';
import { openVerifierEgress } from './verifier-egress.ts';
import { MODEL_FORWARDER_PATH } from '../agent/sandbox-programs.ts';

const TESTS_DIR = '/tests';
/** How long a sandbox that failed an exec after its restart gets to be seen stopped (it may be going down). */
const STOPPING_MS = 3_000;
const ROOT_OWNER = { uid: 0, gid: 0 } as const;

export async function verifyHarbor(
  attempt: EpisodeAttempt,
  deps: SeparateVerifyDeps,
  made: Pick<SetUpResult, 'archive' | 'proxy' | 'runtime' | 'verifierImage' | 'services' | 'runFolder' | 'image'>,
  session: SandboxSession,
  trail: Pick<AttemptTrail, 'verifyRun' | 'workspaceCopy' | 'logsCopy' | 'grading'>,
  agentRun: AgentRun,
  harbor: HarborRun,
  /**
   * A step of a multi-step task: the folders of the task that make /tests, in order (the step's own
   * over the task's), and whether it is the last (a separate verifier stops the agent's environment
   * only then). Undefined: the task's one step, whose workspace and /logs the end of its turn copies.
   */
  step?: { testsParts: readonly string[]; last: boolean },
): Promise<Graded> {
  const task: TaskSpec = attempt.job.task;
  const testsParts = step?.testsParts ?? ['tests'];
  const stopsAgent = step?.last ?? true;
  const deadline = new Deadline('verify', task.reserves.verifySec * 1000, attempt.signal);
  try {
    const before = await deadline.run('checking the sandbox', (signal) => session.state(signal));
    if (!before.running && before.initOomKilled) throw new FleetError('agent_crashed', 'the sandbox ran out of memory under the agent and its init was killed');
    if (harbor.separateVerifier !== undefined) {
      // Harbor's separate mode: the grader runs in a container of its own (separate-verifier.ts).
      const { reward, metrics } = await verifySeparately(attempt, deps, made, session, trail, harbor, deadline, { testsParts, stopsAgent });
      return { status: agentRun.timedOut ? 'timeout' : passes(reward, attempt.job.passThreshold) ? 'passed' : 'failed', reward, metrics };
    }
    // The agent's processes run on into grading, as under Harbor (a server or VM it started is there
    // for the tests), unless the batch says stop. Not with a grader's network of its own, which would be
    // open to them, nor in a sandbox that stopped (the restart starts it again).
    const rootVerifier = asRoot(harbor.verifierUser || made.image.config.user);
    // (A verifier of another user could not stop the fleet's own forwarders, which are root's: a restart.)
    const keep = (attempt.job.agentProcesses ?? DEFAULT_AGENT_PROCESSES) === 'keep'
      && !hasEgress(phaseGrants(task, deps.network)?.verifier) && before.running && rootVerifier;
    let restarted = false;
    const restart = async () => {
      // Every process of every user stops; files stay. The ENTRYPOINT starts the task's services again.
      restarted = true;
      await deadline.run('restarting the sandbox', (signal) => session.restart(signal));
      const check = harbor.healthcheck;
      if (check) await deadline.run('waiting for the healthcheck again', (signal) => runHealthcheck(session, check, signal));
    };
    // The model goes before anything is graded.
    await deadline.run('closing the model proxy', async () => made.proxy?.close());
    trail.grading = { agentProcesses: keep ? 'kept' : 'stopped' };
    if (!keep) await restart();
    const parts = testsParts.filter((p) => made.archive.has(p));
    const { reward, metrics } = await (rootVerifier
      ? verifyInOneExec(attempt, deps, made, session, trail, harbor, deadline, parts, { copies: step === undefined, ...(keep && { restart }) })
      : verifyStepByStep(attempt, deps, made, session, trail, harbor, deadline, parts)
    ).catch(async (err: unknown) => {
      throw restarted ? await stoppedByChangedEntrypoint(session, deadline, err) : err;
    });
    return { status: agentRun.timedOut ? 'timeout' : passes(reward, attempt.job.passThreshold) ? 'passed' : 'failed', reward, metrics };
  } finally {
    deadline.dispose();
  }
}

/**
 * An engine error after the restart, when the sandbox has stopped since and the files of its ENTRYPOINT
 * were changed in it: the agent made what starts the sandbox end it (exit, kill the keep-alive, run out
 * of memory), an error of the agent's; an infra error retried would only reward breaking it. Still
 * running, or with its ENTRYPOINT's files as the image had them (a task whose ENTRYPOINT cannot run
 * twice, the engine stopping it), the error stays as it was.
 */
async function stoppedByChangedEntrypoint(session: SandboxSession, deadline: Deadline, err: unknown): Promise<unknown> {
  if (!(err instanceof FleetError) || (err.code !== 'docker_error' && err.code !== 'sandbox_lost')) return err;
  const check = () => deadline.run('checking the sandbox', (signal) => session.state(signal)).catch(() => undefined);
  let state = await check();
  // An exec cut short as the sandbox went down can fail before the engine says it stopped.
  if (state?.running && await deadline.run('waiting for the sandbox to stop', (signal) => session.stopsWithin(STOPPING_MS, signal)).catch(() => false)) state = await check();
  if (state === undefined || state.running) return err;
  const changed = await deadline.run('listing the sandbox\'s changes', (signal) => session.entrypointChanges(signal)).catch(() => [] as string[]);
  if (changed.length === 0) return err;
  return new FleetError('agent_crashed', `the sandbox, started again for grading, stopped (exit ${state.exitCode ?? '?'}${state.oomKilled ? ', an OOM kill' : ''}): its ENTRYPOINT's ${changed.slice(0, 3).join(', ')} changed during the agent's turn`, { cause: err });
}

/** Whether `user` (a Harbor [verifier].user, or the image's USER: '' is root) is root; undefined is not known. */
function asRoot(user: string | undefined): boolean {
  return user !== undefined && /^(|root|0)(:(root|0))?$/.test(user);
}

type VerifyMade = Pick<SetUpResult, 'archive' | 'runtime' | 'runFolder'>;

/** As root, in one exec (after the restart, if any): /logs/verifier and /tests made afresh, the tests in, test.sh run, its reward files read. */
async function verifyInOneExec(
  attempt: EpisodeAttempt, deps: SeparateVerifyDeps, made: VerifyMade, session: SandboxSession,
  trail: Pick<AttemptTrail, 'verifyRun' | 'workspaceCopy' | 'logsCopy' | 'grading'>, harbor: HarborRun, deadline: Deadline, parts: readonly string[],
  how: {
    /** The workspace as the agent left it and /logs after the verifier, copied out by the same exec (not for a step of several: its /logs moves on). */
    copies: boolean;
    /** With the agent's processes kept: what makes room when the exec cannot start or run (what the agent left took every pid). */
    restart?: () => Promise<void>;
  },
): Promise<Reward> {
  const task = attempt.job.task;
  const cap = copyCapBytes(deps);
  const tests = await Promise.all(parts.map((part) => made.archive.partAsTar(part, TESTS_DIR, ROOT_OWNER)));
  // The grader's own network (only after a restart: the agent's processes are gone).
  const egress = await openVerifierEgress(attempt, deps, made, session, deadline);
  try {
    let started: number | undefined;
    const { copies } = how;
    const kept = () => trail.grading?.agentProcesses === 'kept';
    const endTurn = () => superviseVerifier(deadline, trail, task.verify.timeoutSec, () => started, (signal) => session.endTurn({
      runtimeMountPath: made.runtime.mountPath, workdir: task.workdir, testsDir: TESTS_DIR, tests,
      // A task working in / keeps /logs as its workspace (close's choice): the whole file system is not one.
      copyCapBytes: copies && task.workdir !== '/' ? cap : null, ...(copies && { logsCapBytes: cap }),
      command: task.verify.command, rewardFile: true, verifierTimeoutMs: task.verify.timeoutSec * 1000, outputCapBytes: deps.outputCapBytes,
      // /logs/verifier root's 0755: the root verifier writes there, nothing the agent left running as
      // another user can. With the agent's processes kept, /logs is made root's 0755 first (so none of
      // them can swap /logs/verifier for a folder of its own), and the fleet's own forwarders of its
      // phase go (their ports with them).
      asRoot: {
        env: { ...harbor.verifierEnv, ...egress?.env }, shell: ['bash', '-c'], executable: ['test.sh'], logsMode: 0o755,
        ...(kept() && { lockLogs: true, listBeside: true, stopHelpers: [`${made.runtime.mountPath}/${MODEL_FORWARDER_PATH}`] }),
      },
      signal, onVerifierStart: () => (started = performance.now()),
    }), (e) => (e.outcome === 'verified' ? e.verifyRun : undefined));
    let end = await endTurn();
    // The exec could not start, or its program could not run (no pid or memory left by what the agent
    // left running): once more after the restart, which frees them.
    // Or it was cut short after the verifier ran, before the reward was read (the sandbox stopped under
    // it): with the agent's processes kept, one of them may have done it, so the grade is not taken as
    // it stands (no reward, or an infra error retried, would each reward the agent): graded again,
    // the agent's processes stopped by the restart.
    const cutShort = end.outcome === 'verified' && (end.cutShort === true || end.verifyRun.sandboxStopped === true);
    if ((end.outcome === 'not-swept' || end.outcome === 'failed' || cutShort) && how.restart) {
      deps.log.warn({ outcome: end.outcome, cutShort, why: end.outcome === 'failed' ? end.why : undefined }, 'the end of the turn did not finish with the agent\'s processes kept: once more after a restart');
      await how.restart();
      trail.grading = { agentProcesses: 'stopped' };
      end = await endTurn();
    }
    if (end.outcome === 'verified' && end.beside && kept()) trail.grading = { agentProcesses: 'kept', beside: end.beside };
    keepCopies(deps, attempt, trail, end);
    await verifiedRun(end, session, deadline, task.limits.diskMb);
    return rewardOfFiles(end.outcome === 'verified' ? end.reward : undefined);
  } finally {
    await egress?.close().catch((err: unknown) => deps.log.warn({ err: String(err) }, 'closing the verifier\'s egress proxy failed'));
  }
}

/** After the restart, one call each: root's exec, the tests' put, the verifier's own exec as its user, the reward files read through the engine. */
async function verifyStepByStep(
  attempt: EpisodeAttempt, deps: SeparateVerifyDeps, made: VerifyMade, session: SandboxSession,
  trail: Pick<AttemptTrail, 'verifyRun'>, harbor: HarborRun, deadline: Deadline, parts: readonly string[],
): Promise<Reward> {
  const task = attempt.job.task;
  const asRootExec = (what: string, command: string) => execAsRoot(session, deadline, what, command);
  await asRootExec('emptying /logs/verifier and removing /tests', `${HARBOR_VERIFIER_RESET} && ${HARBOR_TESTS_RESET}`);
  // test.sh executable in the tars themselves (as `chmod +x` after them would make it).
  for (const part of parts) {
    const tests = await made.archive.partAsTar(part, TESTS_DIR, ROOT_OWNER, [], ['test.sh']);
    await deadline.run(`copying ${part}/ in`, (signal) => session.putArchive(tests, '/', signal));
  }
  const egress = await openVerifierEgress(attempt, deps, made, session, deadline);
  try {
    await runVerifier(session, deadline, trail, task.verify.command, task.verify.timeoutSec, {
      capBytes: deps.outputCapBytes, env: { ...harbor.verifierEnv, ...egress?.env }, user: harbor.verifierUser ?? '',
    });
  } finally {
    await egress?.close().catch((err: unknown) => deps.log.warn({ err: String(err) }, 'closing the verifier\'s egress proxy failed'));
  }
  return deadline.run('reading the reward file', (signal) => readSandboxReward(session, signal));
}

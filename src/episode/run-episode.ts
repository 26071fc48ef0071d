// One episode attempt, start to finish: seed ONE sandbox session, copy the workspace in, run the agent
// under its ceiling, copy the hidden tests in and verify, then close: evidence first, then the sandbox
// is handed to the cleanup queue. Every failure becomes a result with a kind, or a retry.
import type Docker from 'dockerode';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { EpisodeJob, EpisodeResult } from '../../queues/episodes/contract.ts';
import { createAgent, type AgentRun } from '../agent/agent.ts';
import { FleetError, toFleetError } from '../errors/fleet-error.ts';
import type { EvidenceStore } from '../evidence/evidence-store.ts';
import { SANDBOX_USER, SandboxSession, removeContainer, type ExecResult } from '../sandbox/sandbox-session.ts';
import { getTaskArchive } from '../tasks/task-store.ts';
import { agentCeilingSec } from '../tasks/task-spec.ts';

/** Where the hidden tests are copied for verification, after the agent stopped. */
export const TESTS_DIR = '/tests';

export interface EpisodeDeps {
  docker: Docker;
  redis: Redis;
  prefix: string;
  log: Logger;
  workerId: string;
  evidence: EvidenceStore;
  /** Deadline of each Docker API call. */
  callTimeoutMs: number;
  outputCapBytes: number;
  /** Hand a sandbox to the cleanup queue. */
  scheduleCleanup(episodeId: string, containerId: string): Promise<void>;
}

export interface EpisodeAttempt {
  job: EpisodeJob;
  /** 1-based. */
  attempt: number;
  signal: AbortSignal;
}

export interface EpisodeOutcome {
  result: EpisodeResult;
  /** The failure may go away on another attempt (infrastructure, model). */
  retry: boolean;
  error?: FleetError;
}

/** A signal that aborts with `error` after `ms`, or when `parent` aborts. */
function phaseSignal(parent: AbortSignal, ms: number, error: () => FleetError): AbortSignal {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(error()), ms);
  timer.unref();
  const onParent = () => ctrl.abort(parent.reason);
  if (parent.aborted) onParent();
  else parent.addEventListener('abort', onParent, { once: true });
  ctrl.signal.addEventListener('abort', () => {
    clearTimeout(timer);
    parent.removeEventListener('abort', onParent);
  }, { once: true });
  return ctrl.signal;
}

const summary = (run: AgentRun | ExecResult) => ({ exitCode: run.exitCode, timedOut: run.timedOut, durationMs: run.durationMs });

export async function runEpisode(attempt: EpisodeAttempt, deps: EpisodeDeps): Promise<EpisodeOutcome> {
  const { job, signal } = attempt;
  const { task } = job;
  const log = deps.log.child({ episodeId: job.episodeId, attempt: attempt.attempt });
  const startedAt = new Date();
  const t0 = performance.now();
  const since = (t: number) => Math.round(performance.now() - t);
  const timings: EpisodeResult['timings'] = { totalMs: 0 };
  const provenance: EpisodeResult['provenance'] = { taskDigest: job.taskDigest, image: task.image, agent: job.agent };
  const base = { episodeId: job.episodeId, batchId: job.batchId, taskId: task.id, sample: job.sample, attempts: attempt.attempt, workerId: deps.workerId };

  let containerId: string | undefined;
  let session: SandboxSession | undefined;
  let agentRun: AgentRun | undefined;
  let verifyRun: ExecResult | undefined;
  let oomKilled: boolean | undefined;
  let outcome: Omit<EpisodeOutcome, 'result'> & { status: EpisodeResult['status']; reward: number | null };

  try {
    // Set-up: fetch the task, seed the one sandbox of this episode, copy the workspace in.
    const tSetup = performance.now();
    const setupSignal = phaseSignal(signal, task.reserves.setupSec * 1000, () =>
      new FleetError('docker_timeout', `set-up passed its reserve of ${task.reserves.setupSec}s`));
    const archive = await getTaskArchive(deps.redis, deps.prefix, job.taskDigest);
    session = await SandboxSession.open(
      { docker: deps.docker, log, callTimeoutMs: deps.callTimeoutMs },
      { image: task.image, workdir: task.workdir, limits: task.limits, owner: { episodeId: job.episodeId, batchId: job.batchId, workerId: deps.workerId, attempt: attempt.attempt } },
      (id) => {
        containerId = id;
      },
      setupSignal,
    );
    provenance.imageId = session.imageId;
    await session.putArchive(await archive.partAsTar('workspace', task.workdir, SANDBOX_USER), '/', setupSignal);
    timings.setupMs = since(tSetup);
    log.info({ containerId, setupMs: timings.setupMs }, 'sandbox ready');

    // The agent, under its ceiling: the deadline minus the set-up, verification and close reserves.
    const ceilingMs = agentCeilingSec(task) * 1000;
    agentRun = await createAgent(job.agent).run({ session, task, archive, ceilingMs, outputCapBytes: deps.outputCapBytes, signal });
    timings.agentMs = agentRun.durationMs;
    log.info({ exitCode: agentRun.exitCode, timedOut: agentRun.timedOut, agentMs: agentRun.durationMs }, 'agent stopped');

    // Verification: the hidden tests exist in the sandbox only from now on.
    const tVerify = performance.now();
    await session.putArchive(await archive.partAsTar('tests', TESTS_DIR, SANDBOX_USER), '/', signal);
    verifyRun = await session.exec(task.verify.command, { timeoutMs: task.verify.timeoutSec * 1000, capBytes: deps.outputCapBytes, signal });
    timings.verifyMs = since(tVerify);
    if (verifyRun.timedOut) throw new FleetError('verifier_timeout', `verifier passed its timeout of ${task.verify.timeoutSec}s`);
    if (verifyRun.exitCode !== 0 && verifyRun.exitCode !== 1) {
      throw new FleetError('verifier_crashed', `verifier exited with ${verifyRun.exitCode} (0 passes, 1 fails, anything else is a broken verifier)`);
    }
    const reward = verifyRun.exitCode === 0 ? 1 : 0;
    const status = agentRun.timedOut ? 'timeout' : reward === 1 ? 'passed' : 'failed';
    outcome = { status, reward, retry: false };
  } catch (err) {
    const error = toFleetError(err);
    outcome = { status: 'error', reward: null, retry: error.outcome.retry, error };
    log.warn({ code: error.code, kind: error.outcome.kind, err: error.message }, 'episode attempt failed');
  }

  // Close: evidence first, then the sandbox goes to the cleanup queue. Never throws.
  const tClose = performance.now();
  if (session !== undefined) {
    oomKilled = await session.state().then((s) => s.oomKilled, () => undefined);
  }
  await Promise.all([
    agentRun && deps.evidence.writeOutput(job.episodeId, attempt.attempt, 'agent', agentRun),
    verifyRun && deps.evidence.writeOutput(job.episodeId, attempt.attempt, 'verifier', verifyRun),
  ]).catch((err: unknown) => log.error({ err }, 'writing evidence failed'));
  if (containerId !== undefined) {
    const id = containerId;
    await deps.scheduleCleanup(job.episodeId, id).catch(async (err: unknown) => {
      log.warn({ containerId: id, err: String(err) }, 'cleanup queue unavailable; removing the sandbox directly');
      await removeContainer(deps.docker, id, task.reserves.closeSec * 1000).catch((e: unknown) =>
        log.error({ containerId: id, err: String(e) }, 'sandbox not removed; the reaper will find it by its labels'));
    });
  }
  timings.closeMs = since(tClose);
  timings.totalMs = since(t0);

  const { error } = outcome;
  const result: EpisodeResult = {
    ...base,
    status: outcome.status,
    ...(error && { error: { kind: error.outcome.kind, code: error.code, message: error.message } }),
    reward: outcome.reward,
    timings,
    provenance,
    ...(agentRun && { agent: summary(agentRun) }),
    ...(verifyRun && { verifier: summary(verifyRun) }),
    ...(oomKilled !== undefined && { oomKilled }),
    startedAt: startedAt.toISOString(),
    endedAt: new Date().toISOString(),
  };
  await deps.evidence.writeJson(job.episodeId, attempt.attempt, 'result', result).catch(() => undefined);
  return { result, retry: outcome.retry, ...(error && { error }) };
}

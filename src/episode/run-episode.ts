// One episode attempt, start to finish, phase by phase: set-up (and resume), agent, verification,
// then close, each under its own deadline. Every failure becomes a result with a kind, or a retry.
import type { EpisodeResult } from './episode-job.ts';
import type { AgentRun } from '../agent/agent.ts';
import { stopOf } from '../errors/episode-stop.ts';
import { toFleetError } from '../errors/fleet-error.ts';
import type { ExecResult } from '../sandbox/sandbox-session.ts';
import { runAgent } from './agent-phase.ts';
import { closeDeadline, closeEpisode } from './close-phase.ts';
import { msSince, type AttemptState, type EpisodeAttempt, type EpisodeDeps, type EpisodeOutcome, type Graded } from './episode-attempt.ts';
import { resumePoint } from './resume-phase.ts';
import { setUp } from './set-up-phase.ts';
import { verify } from './verify-phase.ts';


export async function runEpisode(attempt: EpisodeAttempt, deps: EpisodeDeps): Promise<EpisodeOutcome> {
  const { job } = attempt;
  const log = deps.log.child({ episodeId: job.episodeId, attempt: attempt.attempt });
  const phaseDeps: EpisodeDeps = { ...deps, log };
  const startedAt = new Date();
  const t0 = performance.now();
  const state: AttemptState = { snapshots: new Set(), timings: { totalMs: 0 } };

  let graded: Graded;
  try {
    graded = await setUpRunVerify(attempt, phaseDeps, state);
  } catch (err) {
    const stop = stopOf(attempt.signal);
    if (stop) {
      graded = { status: 'cancelled', reward: null, stop: stop.reason };
    } else {
      const error = toFleetError(err);
      graded = { status: 'error', reward: null, error };
      log.warn({ code: error.code, kind: error.outcome.kind, err: error.message }, 'episode attempt failed');
    }
  }

  const tClose = performance.now();
  attempt.onPhase?.('close');
  const deadline = closeDeadline(attempt);
  try {
    const closed = await closeEpisode(attempt, phaseDeps, state, deadline, graded.stop !== undefined);
    if (closed.cancelled) graded = { status: 'cancelled', reward: null, stop: 'cancelled' };
    state.timings.closeMs = msSince(tClose);
    state.timings.totalMs = msSince(t0);
    const result = assembleResult(attempt, deps.workerId, state, graded, closed.oomKilled, startedAt);
    await deadline.run('writing the result', () => deps.evidence.writeJson(job.episodeId, attempt.attempt, 'result', result))
      .catch((err: unknown) => log.warn({ err: String(err) }, 'result evidence not written'));
    const { error } = graded;
    return { result, retry: error?.outcome.retry ?? false, handBack: graded.stop === 'drain', ...(error && { error }) };
  } finally {
    deadline.dispose();
  }
}

/** Set-up, agent, verification. Throws on failure; the signal's EpisodeStop when stopped from outside. */
async function setUpRunVerify(attempt: EpisodeAttempt, deps: EpisodeDeps, state: AttemptState): Promise<Graded> {
  const { job, signal } = attempt;
  const { timings } = state;

  let session;
  let resume;
  try {
    session = await setUp(attempt, deps, state, attempt.setUp);
    // A retried llm episode continues from its latest durable checkpoint, workspace included.
    resume = job.agent.kind === 'llm' ? await resumePoint(attempt, deps, session, state, attempt.setUp) : undefined;
  } finally {
    // From pick-up: the processor's Redis steps count against the reserve too.
    timings.setupMs = attempt.setUp.elapsedMs;
  }
  deps.log.info({ containerId: state.containerId, setupMs: timings.setupMs, runtime: state.runtime?.generationId.slice(0, 12), warm: state.runtime?.warm }, 'sandbox ready');

  attempt.onPhase?.('agent');
  const agentRun = await runAgent(attempt, deps, session, state, resume);
  state.agentRun = agentRun;
  timings.agentMs = agentRun.durationMs;
  deps.log.info({ exitCode: agentRun.exitCode, timedOut: agentRun.timedOut, agentMs: agentRun.durationMs }, 'agent stopped');
  signal.throwIfAborted();

  const tVerify = performance.now();
  attempt.onPhase?.('verify');
  try {
    return await verify(attempt, deps, session, state, agentRun);
  } finally {
    timings.verifyMs = msSince(tVerify);
  }
}

const summary = (run: AgentRun | ExecResult) => ({ exitCode: run.exitCode, timedOut: run.timedOut, durationMs: run.durationMs });

function assembleResult(attempt: EpisodeAttempt, workerId: string, state: AttemptState, graded: Graded, oomKilled: boolean | undefined, startedAt: Date): EpisodeResult {
  const { job } = attempt;
  const { error } = graded;
  return {
    episodeId: job.episodeId,
    batchId: job.batchId,
    taskId: job.task.id,
    sample: job.sample,
    status: graded.status,
    ...(error && { error: { kind: error.outcome.kind, code: error.code, message: error.message } }),
    reward: graded.reward,
    attempts: attempt.attempt,
    workerId,
    timings: state.timings,
    provenance: { taskDigest: job.taskDigest, image: job.task.image, ...(state.imageId && { imageId: state.imageId }), agent: job.agent },
    ...(state.runtime && { runtime: { generationId: state.runtime.generationId, warm: state.runtime.warm, prepareMs: state.runtime.prepareMs } }),
    ...(state.containerId !== undefined && { sandbox: { containerId: state.containerId, pooled: state.pooled === true } }),
    ...(state.agentRun && { agent: summary(state.agentRun) }),
    ...(state.agentRun?.usage && { usage: state.agentRun.usage }),
    ...(state.resumedFrom !== undefined && { resumedFrom: state.resumedFrom }),
    ...(state.verifyRun && { verifier: summary(state.verifyRun) }),
    ...(oomKilled !== undefined && { oomKilled }),
    startedAt: startedAt.toISOString(),
    endedAt: new Date().toISOString(),
  };
}

// One episode attempt, start to finish, phase by phase: set-up (and resume), agent, verification,
// then close, each under its own deadline. Every failure becomes a result with a kind, or a retry.
// Each phase gets only the dependencies it uses and hands its result to the next; the attempt's trail
// (with the lease on its environment) is what close and the result read, however far the phases got.
import type { EpisodeResult } from './episode-job.ts';
import type { AgentRun } from '../agent/agent.ts';
import { stopOf } from '../errors/episode-stop.ts';
import { FleetError, toFleetError } from '../errors/fleet-error.ts';
import { DEFAULT_ENDPOINT } from '../config/model-endpoints.ts';
import { resetEpisodeVersions } from '../model/policy-versions.ts';
import type { ExecResult } from '../sandbox/sandbox-session.ts';
import { runAgent } from './agent-phase.ts';
import { closeDeadline, closeEpisode } from './close-phase.ts';
import { EnvironmentLease } from '../sandbox/environment-lease.ts';
import { msSince, type AttemptTrail, type EpisodeAttempt, type EpisodeDeps, type EpisodeOutcome, type Graded } from './episode-attempt.ts';
import { resumePoint } from './resume-phase.ts';
import { runHarborSteps } from './harbor-steps.ts';
import { setUp } from './set-up-phase.ts';
import { verify } from './verify-phase.ts';
import { DEFAULT_NETWORK, grantNetwork, type NetworkSettings } from '../egress/network-grant.ts';


export async function runEpisode(attempt: EpisodeAttempt, deps: EpisodeDeps): Promise<EpisodeOutcome> {
  const { job } = attempt;
  const log = deps.log.child({ episodeId: job.episodeId, attempt: attempt.attempt });
  const phaseDeps: EpisodeDeps = { ...deps, log };
  const startedAt = new Date();
  const t0 = performance.now();
  const lease = new EnvironmentLease({ docker: deps.docker, log, callTimeoutMs: deps.callTimeoutMs, scheduleCleanup: deps.scheduleCleanup }, job.episodeId);
  const trail: AttemptTrail = {
    lease, setUp: {}, snapshots: new Set(), agentRun: undefined, verifyRun: undefined, workspaceCopy: undefined, resumedFrom: undefined, timings: { totalMs: 0 },
  };

  let graded: Graded;
  try {
    graded = await setUpRunVerify(attempt, phaseDeps, trail);
  } catch (err) {
    const stop = stopOf(attempt.signal);
    if (stop?.reason === 'stale') {
      graded = staleGrade();
    } else if (stop) {
      graded = { status: 'cancelled', reward: null, stop: stop.reason };
    } else {
      const error = toFleetError(err);
      graded = { status: 'error', reward: null, error };
      log.warn({ code: error.code, kind: error.outcome.kind, err: error.message }, 'episode attempt failed');
    }
  }

  // A stale stop that landed after the agent's run ended still restarts the episode: its conversation spanned too many versions.
  if (stopOf(attempt.signal)?.reason === 'stale' && graded.stop !== 'stale') graded = staleGrade();

  const tClose = performance.now();
  attempt.onPhase?.('close');
  const deadline = closeDeadline(attempt);
  try {
    const closed = await closeEpisode(attempt, phaseDeps, trail, deadline, graded.stop !== undefined);
    if (closed.cancelled) graded = { status: 'cancelled', reward: null, stop: 'cancelled' };
    trail.timings.closeMs = msSince(tClose);
    trail.timings.totalMs = msSince(t0);
    const result = assembleResult(attempt, deps.workerId, trail, graded, closed.oomKilled, startedAt, deps.network);
    await deadline.run('writing the result', () => deps.evidence.writeJson(job.episodeId, attempt.attempt, 'result', result))
      .catch((err: unknown) => log.warn({ err: String(err) }, 'result evidence not written'));
    const { error } = graded;
    return { result, retry: error?.outcome.retry ?? false, handBack: graded.stop === 'drain', ...(graded.stop === 'stale' && { staleRestart: true }), ...(error && { error }) };
  } finally {
    deadline.dispose();
  }
}

/** The grade of an attempt stopped as stale: an error of kind model (the result if the episode is past its stale restarts). */
function staleGrade(): Graded {
  const error = new FleetError('policy_stale', "a model call would have taken the episode past its batch's maxStaleness (policy versions between its first call and its last)");
  return { status: 'error', reward: null, error, stop: 'stale' };
}

/** Set-up, agent, verification. Throws on failure; the signal's EpisodeStop when stopped from outside. */
async function setUpRunVerify(attempt: EpisodeAttempt, deps: EpisodeDeps, trail: AttemptTrail): Promise<Graded> {
  const { job, signal } = attempt;
  const { timings } = trail;

  let made;
  let resumed;
  // From set-up on, the phases see the task as its image decided it (the image run, the workdir).
  let ran = attempt;
  try {
    made = await setUp(attempt, deps, trail, attempt.setUp);
    ran = made.task === job.task ? attempt : { ...attempt, job: { ...job, task: made.task } };
    // A retried llm episode continues from its latest durable checkpoint, workspace included.
    // (A multi-step task resumes at its last step boundary instead: harbor-steps.ts.)
    resumed = job.agent.kind === 'llm' && made.task.harbor?.steps === undefined ? await resumePoint(ran, deps, made.session, attempt.setUp) : undefined;
    if (resumed) trail.resumedFrom = resumed.seq;
    // An attempt that starts afresh has a conversation of its own: what earlier attempts saw is not its.
    if (resumed === undefined && attempt.attempt > 1 && made.task.harbor?.steps === undefined) {
      await attempt.setUp.run('forgetting earlier policy versions', () => resetEpisodeVersions(deps.redis, deps.prefix, job.episodeId)).catch((err: unknown) => deps.log.warn({ err: String(err) }, 'policy versions of earlier attempts not forgotten'));
    }
  } finally {
    // From pick-up: the processor's Redis steps count against the reserve too.
    timings.setupMs = attempt.setUp.elapsedMs;
  }
  const { session, runtime } = made;
  deps.log.info({ containerId: session.containerId, setupMs: timings.setupMs, runtime: runtime.generationId.slice(0, 12), warm: runtime.warm }, 'sandbox ready');
  // A multi-step Harbor task runs its steps, each an agent and a verification, in the one sandbox.
  const harbor = ran.job.task.harbor;
  if (harbor?.steps !== undefined) return runHarborSteps(ran, deps, made, session, trail, harbor);

  attempt.onPhase?.('agent');
  const agentRun = await runAgent(ran, deps, made, session, trail, resumed?.agent);
  trail.agentRun = agentRun;
  timings.agentMs = agentRun.durationMs;
  deps.log.info({ exitCode: agentRun.exitCode, timedOut: agentRun.timedOut, agentMs: agentRun.durationMs }, 'agent stopped');
  signal.throwIfAborted();

  const tVerify = performance.now();
  attempt.onPhase?.('verify');
  try {
    return await verify(ran, deps, made, session, trail, agentRun);
  } finally {
    timings.verifyMs = msSince(tVerify);
  }
}

const summary = (run: AgentRun | ExecResult) => ({ exitCode: run.exitCode, timedOut: run.timedOut, durationMs: run.durationMs });

function assembleResult(
  attempt: EpisodeAttempt,
  workerId: string,
  trail: AttemptTrail,
  graded: Graded,
  oomKilled: boolean | undefined,
  startedAt: Date,
  network: NetworkSettings | undefined,
): EpisodeResult {
  const { lease } = trail;
  const { runtime, imageId, image, task: ranTask } = trail.setUp;
  const harbor = attempt.job.task.harbor;
  const { agentRun, verifyRun, resumedFrom } = trail;
  const { job } = attempt;
  const { error } = graded;
  const { proxy } = trail.setUp;
  // The agent's own count (the llm agent's, earlier attempts included), else what the episode's model
  // proxy counted of this attempt's calls (a command agent: any client in the sandbox).
  const usage = agentRun?.usage ?? proxy?.usage();
  // The endpoint and model the episode played: its batch's, or the endpoint it ran a proxy for.
  const played = job.model !== undefined || proxy !== undefined
    ? { endpoint: job.model?.endpoint ?? DEFAULT_ENDPOINT, ...((proxy?.model ?? job.model?.name) !== undefined && { name: (proxy?.model ?? job.model?.name)! }) }
    : undefined;
  return {
    episodeId: job.episodeId,
    batchId: job.batchId,
    taskId: job.task.id,
    sample: job.sample,
    status: graded.status,
    ...(error && { error: { kind: error.outcome.kind, code: error.code, message: error.message } }),
    reward: graded.reward,
    ...(graded.metrics && { metrics: graded.metrics }),
    attempts: attempt.attempt,
    workerId,
    timings: trail.timings,
    provenance: {
      taskDigest: job.taskDigest, image: ranTask?.image ?? job.task.image, ...(imageId && { imageId }), agent: job.agent,
      ...(image && image.source !== 'image' && { environment: { source: image.source, ...(image.digest && { digest: image.digest }) } }),
      ...(lease.session?.spec.runtime && { sandboxRuntime: lease.session.spec.runtime.name }),
    },
    // What each phase asked for and what it got under the operator's ceiling (src/egress/network-grant.ts).
    ...(harbor && { network: grantNetwork(harbor, network ?? DEFAULT_NETWORK) }),
    ...(trail.grading && { grading: { agentProcesses: trail.grading.agentProcesses, ...(trail.grading.beside && { beside: trail.grading.beside.processes.length + trail.grading.beside.more }) } }),
    ...(runtime && { runtime: { generationId: runtime.generationId, warm: runtime.warm, prepareMs: runtime.prepareMs } }),
    ...(lease.containerId !== undefined && { sandbox: { containerId: lease.containerId, pooled: lease.pooled, ...(lease.seeded && { seeded: true }) } }),
    ...(agentRun && { agent: summary(agentRun) }),
    ...(usage && { usage }),
    ...(played && { model: played }),
    ...(resumedFrom !== undefined && { resumedFrom }),
    ...(verifyRun && { verifier: summary(verifyRun) }),
    ...(oomKilled !== undefined && { oomKilled }),
    startedAt: startedAt.toISOString(),
    endedAt: new Date().toISOString(),
  };
}

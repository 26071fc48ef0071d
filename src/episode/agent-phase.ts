// The agent phase: the agent works in the sandbox until it finishes or its ceiling passes (the
// episode deadline minus the set-up, verification and close reserves, minus the agent time earlier
// attempts used). Each checkpoint it reports is read from the sandbox and offered to the writer in the
// background: the agent never waits for it. An agent that writes past its disk limit is stopped.
// Returns the agent's run; a run that does not come back that way (the agent crashed, passed its disk
// limit, or finished after its phase ended) and the snapshots in flight are left in the trail for close.
import { createAgent, type AgentRun } from '../agent/agent.ts';
import type { AgentEvent } from '../agent/reference/agent-events.ts';
import { Deadline } from '../deadlines/deadline.ts';
import { agentCeilingSec } from '../tasks/task-spec.ts';
import { watchDisk } from '../sandbox/disk-watch.ts';
import { largestPartBytes } from '../sandbox/task-services.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { AttemptTrail, EpisodeAttempt, EpisodeDeps, SetUpResult } from './episode-attempt.ts';
import type { AgentResume } from './resume-phase.ts';
import { openPhaseEgress, phaseGrants, type PhaseEgress } from './phase-egress.ts';

/**
 * The agent phase ends at the latest this long after the ceiling. It covers the engine calls before
 * the agent's own clock starts (its input copied in, the exec created) and, past the ceiling, TERM and
 * KILL of its process tree with 2 s of grace each, on a loaded engine. Only an engine that answers
 * slower than that reaches it, and then the attempt is an infrastructure failure, not a graded timeout.
 */
export const AGENT_STOP_GRACE_MS = 15_000;

/** What the agent phase uses of the worker's clients and stores. */
export type AgentDeps = Pick<EpisodeDeps, 'checkpoints' | 'log' | 'outputCapBytes' | 'docker' | 'callTimeoutMs' | 'evidence' | 'network'>;

export async function runAgent(
  attempt: EpisodeAttempt,
  deps: AgentDeps,
  made: Pick<SetUpResult, 'archive' | 'runtime' | 'proxy' | 'services' | 'runFolder' | 'workspaceIn'>,
  session: SandboxSession,
  trail: Pick<AttemptTrail, 'snapshots' | 'agentRun' | 'timings'>,
  resume: AgentResume | undefined,
): Promise<AgentRun> {
  const { job } = attempt;
  const { task } = job;
  const ceilingMs = Math.max(0, agentCeilingSec(task) * 1000 - (resume?.agentMs ?? 0));
  const deadline = new Deadline('agent', ceilingMs + AGENT_STOP_GRACE_MS, attempt.signal);
  const agentStarted = performance.now();
  const onCheckpoint = (cp: Omit<Extract<AgentEvent, { type: 'checkpoint' }>, 'type'>) => {
    // Agent time as the worker measured it (earlier attempts plus this one), not as the sandbox says:
    // it is what a resumed attempt's ceiling is cut by.
    const agentMs = Math.round((resume?.agentMs ?? 0) + performance.now() - agentStarted);
    const offer = { ...cp, agentMs, episodeId: job.episodeId, createdAt: new Date().toISOString() };
    // Whatever the sandbox prints, a bad checkpoint is dropped and logged, never thrown.
    const handOver = session.getArchive(task.workdir, attempt.signal)
      .then((tar) => deps.checkpoints.sink.offer(offer, tar), () => deps.checkpoints.sink.offer(offer, undefined))
      .catch((err: unknown) => deps.log.warn({ seq: cp.seq, err: String(err) }, 'checkpoint dropped'));
    trail.snapshots.add(handOver);
    void handOver.finally(() => trail.snapshots.delete(handOver));
  };
  // Where the engine cannot cap the sandbox's disk, the agent is watched and stopped past its limit:
  // the engine kills the sandbox at once (no pid needed inside), then the agent's signal aborts.
  // With task services every part is watched (the engine caps none of a sidecar's layer or volume).
  const diskStop = new AbortController();
  const services = made.services;
  const diskWatch = session.diskEnforced && services === undefined ? undefined : watchDisk(session, {
    limitMb: task.limits.diskMb, signal: deadline.signal, log: deps.log,
    ...(services && { measure: (signal: AbortSignal) => largestPartBytes({ docker: deps.docker, log: deps.log, callTimeoutMs: deps.callTimeoutMs }, services, session, signal) }),
    onExceeded: (err) => {
      deps.log.warn({ containerId: session.containerId, err: err.message }, 'disk limit exceeded; stopping the agent');
      void session.kill(deadline.signal)
        .catch((killErr: unknown) => deps.log.warn({ err: String(killErr) }, 'killing the sandbox past its disk limit failed'))
        .finally(() => diskStop.abort(err));
    },
  });
  // The agent's network, when the task asks for one and the ceiling grants it: the egress proxy for
  // this phase only (closed before anything is graded). Without it, the model is the only way out.
  let egress: PhaseEgress | undefined;
  try {
    egress = await deadline.run('starting the agent\'s egress proxy', (signal) => openPhaseEgress({
      phase: 'agent', grant: phaseGrants(task, deps.network)?.agent, settings: deps.network, task, session,
      runtimeMountPath: made.runtime.mountPath, runFolder: made.runFolder,
      evidenceFolder: deps.evidence.folder(job.episodeId, attempt.attempt), episodeId: job.episodeId, log: deps.log, signal,
    }), (late) => void late?.close());
    const networkEnv = egress?.env;
    const run = await deadline.runStoppable('running the agent', (phaseSignal) => createAgent(job.agent).run({
      session, task, archive: made.archive, ceilingMs, outputCapBytes: deps.outputCapBytes,
      signal: AbortSignal.any([phaseSignal, diskStop.signal]),
      runtimeMountPath: made.runtime.mountPath,
      ...(made.proxy && { modelSocket: made.proxy.socketPath }),
      ...(made.proxy?.model !== undefined && { modelName: made.proxy.model }),
      ...(networkEnv && { networkEnv }),
      ...(resume && { resume }),
      ...(made.workspaceIn && { workspaceIn: made.workspaceIn }),
      onEvent: (event) => {
        if (event.type !== 'checkpoint') return;
        const { type: _type, ...cp } = event;
        onCheckpoint(cp);
      },
    }).catch((err: unknown) => {
      // An agent that crashed still leaves its output as evidence.
      const crashed = (err as { agentRun?: AgentRun }).agentRun;
      if (crashed) trail.agentRun = crashed;
      throw err;
    }),
    // Output that arrives after the phase's end is still kept as evidence, if close has not written it yet.
    (late) => (trail.agentRun ??= late));
    // The last poll may predate the agent's last writes: one more measurement before anything is graded.
    const overLimit = diskWatch && (diskWatch.exceeded ?? await deadline.run('measuring the sandbox\'s disk', (signal) => diskWatch.checkNow(signal))
      // A measurement the engine could not give does not cost the agent its grade.
      .catch(() => undefined));
    if (overLimit) {
      // Its output is still kept as evidence; the episode is the agent's failure, not a reward.
      trail.agentRun = run;
      trail.timings.agentMs = run.durationMs;
      throw overLimit;
    }
    return run;
  } catch (err) {
    // Whatever else ended the phase, an agent already past its disk limit failed for that.
    throw diskWatch?.exceeded ?? err;
  } finally {
    diskWatch?.stop();
    await egress?.close().catch((err: unknown) => deps.log.warn({ err: String(err) }, 'closing the agent\'s egress proxy failed'));
    deadline.dispose();
  }
}

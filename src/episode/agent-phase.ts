// The agent phase: the agent works in the sandbox until it finishes or its ceiling passes (the
// episode deadline minus the set-up, verification and close reserves, minus the agent time earlier
// attempts used). Each checkpoint it reports is read from the sandbox and offered to the writer in the
// background: the agent never waits for it.
import { createAgent, type AgentRun } from '../agent/agent.ts';
import type { AgentEvent } from '../agent/reference/agent-events.ts';
import { Deadline } from '../deadlines/deadline.ts';
import { agentCeilingSec } from '../tasks/task-spec.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { AttemptState, EpisodeAttempt, EpisodeDeps } from './episode-attempt.ts';
import type { AgentResume } from './resume-phase.ts';

/**
 * The agent phase ends at the latest this long after the ceiling. It covers the engine calls before
 * the agent's own clock starts (its input copied in, the exec created) and, past the ceiling, TERM and
 * KILL of its process tree with 2 s of grace each, on a loaded engine. Only an engine that answers
 * slower than that reaches it, and then the attempt is an infrastructure failure, not a graded timeout.
 */
export const AGENT_STOP_GRACE_MS = 15_000;

export async function runAgent(
  attempt: EpisodeAttempt,
  deps: EpisodeDeps,
  session: SandboxSession,
  state: AttemptState,
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
    state.snapshots.add(handOver);
    void handOver.finally(() => state.snapshots.delete(handOver));
  };
  try {
    return await deadline.runStoppable('running the agent', (signal) => createAgent(job.agent).run({
      session, task, archive: state.archive!, ceilingMs, outputCapBytes: deps.outputCapBytes, signal,
      runtimeMountPath: state.runtime!.mountPath,
      ...(state.proxy && { modelSocket: state.proxy.socketPath }),
      ...(resume && { resume }),
      onEvent: (event) => {
        if (event.type !== 'checkpoint') return;
        const { type: _type, ...cp } = event;
        onCheckpoint(cp);
      },
    }).catch((err: unknown) => {
      // An agent that crashed still leaves its output as evidence.
      const crashed = (err as { agentRun?: AgentRun }).agentRun;
      if (crashed) state.agentRun = crashed;
      throw err;
    }),
    // Output that arrives after the phase's end is still kept as evidence, if close has not written it yet.
    (late) => (state.agentRun ??= late));
  } finally {
    deadline.dispose();
  }
}

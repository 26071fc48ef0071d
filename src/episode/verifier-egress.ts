// The verifier phase's network (shared or separate verifier): the egress proxy and the forwarder in
// the grader's container, when the task's verifier grant has network (src/egress/). Started just
// before test.sh, after every process of the agent is gone; closed when test.sh ends.
import type { Deadline } from '../deadlines/deadline.ts';
import { openPhaseEgress, phaseGrants, type PhaseEgress } from './phase-egress.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { EpisodeAttempt, EpisodeDeps, SetUpResult } from './episode-attempt.ts';

/** The verifier phase's egress proxy and forwarder in `session` (shared or separate), when its grant has network. */
export async function openVerifierEgress(
  attempt: EpisodeAttempt,
  deps: Pick<EpisodeDeps, 'network' | 'evidence' | 'log'>,
  made: Pick<SetUpResult, 'runtime' | 'runFolder'>,
  session: SandboxSession,
  deadline: Deadline,
): Promise<PhaseEgress | undefined> {
  const { job } = attempt;
  return deadline.run('starting the verifier\'s egress proxy', (signal) => openPhaseEgress({
    phase: 'verifier', grant: phaseGrants(job.task, deps.network)?.verifier, settings: deps.network, task: job.task, session,
    runtimeMountPath: made.runtime.mountPath, runFolder: made.runFolder,
    evidenceFolder: deps.evidence.folder(job.episodeId, attempt.attempt), episodeId: job.episodeId, log: deps.log, signal,
  }), (late) => void late?.close());
}

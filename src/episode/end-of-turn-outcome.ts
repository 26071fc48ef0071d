// What an end-of-turn exec (src/sandbox/end-of-turn/) came to, read the same way for the fleet's own
// tasks (verify-phase.ts) and for Harbor's (harbor-verify.ts): the verifier's run when it ran, else the
// error of the step that stopped it; the reward of the files it left.
import type { Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { keepHarborLogsEarly, keepWorkspaceEarly, type WorkspaceCopyDeps } from '../evidence/workspace-copy.ts';
import type { EndOfTurn, RewardFiles } from '../sandbox/end-of-turn/end-of-turn.ts';
import type { ExecResult, SandboxSession } from '../sandbox/sandbox-session.ts';
import type { AttemptTrail, EpisodeAttempt } from './episode-attempt.ts';
import { readReward, type Reward } from './reward-file.ts';

/** A tar of the workspace is its files plus headers: this much past the snapshot's cap is still taken whole. */
const SNAPSHOT_TAR_SLACK_BYTES = 1024 * 1024;

/** Where the end of the turn stops copying a folder out (the workspace, /logs): the snapshot's cap and a tar's headers. */
export const copyCapBytes = (deps: Pick<WorkspaceCopyDeps, 'snapshotLimits'>): number => deps.snapshotLimits.maxBytes + SNAPSHOT_TAR_SLACK_BYTES;

/** The copies `end` brought out (the workspace as the agent left it, /logs after the verifier), kept as evidence while the episode goes on; close reads them from the trail. */
export function keepCopies(deps: WorkspaceCopyDeps, attempt: EpisodeAttempt, trail: Pick<AttemptTrail, 'workspaceCopy' | 'logsCopy'>, end: EndOfTurn): void {
  const of = { episodeId: attempt.job.episodeId, attempt: attempt.attempt };
  if ('workspaceTar' in end && end.workspaceTar !== undefined) trail.workspaceCopy = keepWorkspaceEarly(deps, of, end.workspaceTar);
  if (end.outcome === 'verified' && end.logsTar !== undefined) trail.logsCopy = keepHarborLogsEarly(deps, of, end.logsTar);
}

/**
 * The agent's failure when `err` (from writing into the sandbox) is its engine-enforced disk quota
 * being full: "disk quota exceeded" (btrfs qgroups) always; "no space left on device" (xfs project
 * quotas, but also the engine's whole disk) only when the layer measures at least 90% of the limit.
 */
async function diskFullByAgent(session: SandboxSession, diskMb: number, err: unknown, signal: AbortSignal): Promise<FleetError | undefined> {
  if (!session.diskEnforced) return undefined;
  const message = err instanceof Error ? err.message : String(err);
  // The engine says it in words; node inside the sandbox (the end-of-turn program) knows EDQUOT by its number only.
  const quota = /disk quota exceeded|\bEDQUOT\b|system error -122\b/i.test(message);
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

/**
 * The verifier's run of `end`. An end that never reached the verifier is the fleet's step failing
 * (`docker_error`, retried), or the agent's full disk keeping the tests out; a sandbox that stopped
 * under the verifier without an OOM kill is `sandbox_lost` (under gVisor its runtime was seen to lose
 * it: exit 2, "shim disconnected", the exec ending with no code or runsc's own 128), never a grade.
 * Only such an ending costs an inspect.
 */
export async function verifiedRun(end: EndOfTurn, session: SandboxSession, deadline: Deadline, diskMb: number): Promise<ExecResult> {
  if (end.outcome === 'tests-failed') {
    const err = new Error(`${end.code ?? ''} ${end.why}`);
    throw await diskFullByAgent(session, diskMb, err, deadline.signal)
      ?? new FleetError('docker_error', `copying the tests into /tests failed: ${end.why}`);
  }
  if (end.outcome === 'failed') throw new FleetError('docker_error', `the end of the agent's turn failed before the verifier: ${end.why}`);
  if (end.outcome !== 'verified') throw new FleetError('docker_error', `the end of the agent's turn did not reach the verifier (${end.outcome})`);
  const { verifyRun } = end;
  const endedOddly = !verifyRun.timedOut && (verifyRun.exitCode === null || verifyRun.exitCode >= 128);
  const stopped = verifyRun.sandboxStopped === true
    || (endedOddly && (await deadline.run('checking the sandbox', (signal) => session.state(signal)).then((s) => !s.running, () => false)));
  if (stopped && session.oomKilledSoFar() !== true) {
    throw new FleetError('sandbox_lost', 'the sandbox stopped under the verifier (not by an OOM kill): the engine or its runtime ended it');
  }
  return verifyRun;
}

/** The reward of the files the verifier left (reward.json first; one that is not a regular file is refused). */
export function rewardOfFiles(files: RewardFiles | undefined): Reward {
  if (files?.notRegular !== undefined) throw new FleetError('reward_file_invalid', `the verifier's ${files.notRegular} is not a regular file`);
  return readReward({ json: files?.json, txt: files?.txt });
}

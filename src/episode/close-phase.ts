// Close, bounded by the close reserve in total, whatever Redis, the engine or the disk do: mark the
// episode closing (a cancel from now on is refused), keep the evidence (outputs, container state,
// workspace snapshot and diff), then ask the environment's lease to end it (hand-over to the cleanup
// queue, else direct removal, then the run folder). It reads only the attempt's trail: what the phases
// opened and left, however far they got. What close cannot finish in time goes on in the background:
// the hand-over completes when Redis answers again, the sandbox is also removed directly, and the
// cleanup queue and the reaper finish whatever is left.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { Deadline, untilAborted } from '../deadlines/deadline.ts';
import type { ExtractReport } from '../evidence/safe-extract.ts';
import { TRAJECTORY_FILE, buildTrajectory } from '../evidence/trajectory.ts';
import { writeFileAtomic } from '../files/atomic-write.ts';
import type { ModelCallRecord } from '../model/call-evidence.ts';
import { MODEL_CALLS_FILE } from '../model/model-proxy.ts';
import { diffWorkspace } from '../evidence/workspace-diff.ts';
import { serviceLogs } from '../sandbox/task-services.ts';
import { keepHarborLogs, keepWorkspace, workspaceFolder } from '../evidence/workspace-copy.ts';
import type { AttemptTrail, EpisodeAttempt, EpisodeDeps } from './episode-attempt.ts';

/** What close uses of the worker's clients and stores (the sandbox's end is its lease's). */
export type CloseDeps = Pick<EpisodeDeps, 'control' | 'evidence' | 'log' | 'checkpoints' | 'publisher' | 'outputCapBytes' | 'snapshotLimits' | 'docker' | 'callTimeoutMs'>;

export interface Closed {
  /** A cancel was flagged before close began: the episode ends cancelled. */
  cancelled: boolean;
  /** Whether the kernel OOM-killed the sandbox, when known. */
  oomKilled?: boolean;
}

/**
 * Slices of the close reserve: marking the episode closing, handing the sandbox over, the result file,
 * and, out of the evidence's share, the diff and evidence.json after the workspace is read.
 */
const BEGIN_MS = 2_000;
const HAND_OVER_MS = 2_000;
const AFTER_READ_MS = 3_000;
export const RESULT_WRITE_MS = 500;

/** Starts the close deadline: not a child of the episode's signal, since a cancel never interrupts close. */
export function closeDeadline(attempt: EpisodeAttempt): Deadline {
  return new Deadline('close', attempt.job.task.reserves.closeSec * 1000);
}

/** Never throws; returns when done or when the close reserve (less the result's slice) is spent. */
export async function closeEpisode(attempt: EpisodeAttempt, deps: CloseDeps, trail: AttemptTrail, deadline: Deadline, alreadyStopped: boolean): Promise<Closed> {
  const { job } = attempt;
  const { log } = deps;
  const { lease } = trail;
  const budgetMs = deadline.budgetMs;
  const closed: Closed = { cancelled: false };

  // A cancel flagged before this point wins; from here on a cancel is refused (the caller is told).
  const begin = await untilAborted(deps.control.beginClose(job.episodeId), deadline.within(Math.min(BEGIN_MS, budgetMs / 5), 'marking the episode closing'))
    .catch((err: unknown) => {
      log.warn({ err: String(err) }, 'could not mark the episode closing');
      return 'closing' as const;
    });
  if (!alreadyStopped && begin === 'cancelled') closed.cancelled = true;

  // Evidence gets what is left but the hand-over's and the result's slices.
  const handOverMs = Math.min(HAND_OVER_MS, budgetMs / 4);
  const evidenceMs = deadline.remainingMs - handOverMs - RESULT_WRITE_MS;
  const collectSignal = deadline.within(evidenceMs, 'keeping evidence');
  // The engine's copy of the workspace stops being read in time to diff and write what it gave.
  const readSignal = deadline.within(evidenceMs - Math.min(AFTER_READ_MS, budgetMs / 5), 'reading the workspace');
  const collecting = collectEvidence(attempt, deps, trail, { signal: collectSignal, readSignal }, closed);
  await untilAborted(collecting, collectSignal).catch((err: unknown) => {
    if (collectSignal.aborted) log.warn({ budgetMs }, 'evidence collection passed its share of the close reserve; kept what it had');
    else log.warn({ err: String(err) }, 'collecting evidence failed');
  });
  // The OOM state is read (or its time is up): the engine's event stream for this sandbox is closed.
  lease.stopWatching();
  await lease.end(deadline.within(deadline.remainingMs - RESULT_WRITE_MS, 'handing the sandbox over'));
  return closed;
}

async function collectEvidence(
  attempt: EpisodeAttempt,
  deps: CloseDeps,
  trail: AttemptTrail,
  { signal, readSignal }: { signal: AbortSignal; readSignal: AbortSignal },
  closed: Closed,
): Promise<void> {
  const { job } = attempt;
  // The task as set-up resolved it (a Harbor task's workdir may be its image's).
  const task = trail.setUp.task ?? job.task;
  const { evidence, log } = deps;
  const { proxy, archive } = trail.setUp;
  const { session } = trail.lease;
  await proxy?.close().catch((err: unknown) => log.warn({ err: String(err) }, 'closing the model proxy failed'));
  // The proxy's evidence is complete once it is closed: the trajectory is read from it.
  const trajectory = proxy && writeTrajectory(attempt, deps).catch((err: unknown) => log.warn({ err: String(err) }, 'trajectory not written'));
  // Checkpoints still being handed over read the sandbox's workspace: let them finish first.
  await Promise.all([...trail.snapshots]);
  await deps.checkpoints.sink.flush(job.episodeId, signal).catch((err: unknown) => log.warn({ err: String(err) }, 'checkpoint hand-over unfinished at close'));
  await Promise.all([
    trajectory,
    trail.agentRun && evidence.writeOutput(job.episodeId, attempt.attempt, 'agent', trail.agentRun),
    trail.verifyRun && evidence.writeOutput(job.episodeId, attempt.attempt, 'verifier', trail.verifyRun),
  ]);
  if (session === undefined) return publish(attempt, deps, signal);
  // The engine's events count every OOM kill in the sandbox: no inspect needed unless they are not watched.
  closed.oomKilled = session.oomKilledSoFar() ?? await session.state(signal).then((s) => s.oomKilled, () => undefined);
  // The sweep's copy when it took one (kept while the verifier ran); else the engine's, now (after the
  // verifier, when it ran).
  const early = trail.workspaceCopy && await untilAborted(trail.workspaceCopy, signal);
  const takenAt = early ? 'agent-stopped' : 'close';
  let extraction: ExtractReport;
  if (early) {
    extraction = early;
  } else {
    // A Harbor task working in / keeps /logs as its workspace (the whole file system is not a workspace).
    // A workspace the engine cannot hand over, or that cannot be kept (names deeper than a path can
    // hold), is recorded as such: the rest of the evidence (/logs, evidence.json) is still kept.
    extraction = await session.getArchive(task.harbor && task.workdir === '/' ? '/logs' : task.workdir, signal).then((tar) => {
      signal.addEventListener('abort', () => tar.destroy(), { once: true });
      return keepWorkspace(deps, { episodeId: job.episodeId, attempt: attempt.attempt }, tar, readSignal);
    }).catch((err: unknown) => {
      if (signal.aborted) throw err;
      log.warn({ err: String(err) }, 'the workspace could not be kept');
      return { files: [], skipped: [{ path: '.', reason: `not kept: ${String(err).slice(0, 300)}` }], bytesWritten: 0, truncated: true };
    });
  }
  // A task graded by a reward file keeps /logs too (its reward files and whatever the verifier wrote
  // there): the end of the turn's copy when it took one (kept while close began), else the engine's.
  let logsKept: ExtractReport | undefined;
  if (task.harbor || task.verify.reward === 'file') {
    logsKept = trail.logsCopy && await untilAborted(trail.logsCopy, signal);
    logsKept ??= await session.getArchive('/logs', signal).then((logs) => {
      signal.addEventListener('abort', () => logs.destroy(), { once: true });
      return keepHarborLogs(deps, { episodeId: job.episodeId, attempt: attempt.attempt }, logs, readSignal);
    }).catch((err: unknown) => {
      if (signal.aborted) throw err;
      log.warn({ err: String(err) }, 'the Harbor task\'s /logs not kept');
      return undefined;
    });
  }
  // Task services: the end of each sidecar's output, as service-<name>.log.
  const services = session.spec.services;
  if (services) {
    await serviceLogs(deps.docker, services.key, deps.outputCapBytes, signal, deps.callTimeoutMs)
      .then((logs) => Promise.all([...logs].map(([name, text]) => evidence.writeText(job.episodeId, attempt.attempt, `service-${name}.log`, text.toString('utf8')))))
      .catch((err: unknown) => log.warn({ err: String(err) }, 'the task services\' output not kept'));
  }
  const snapshotDir = workspaceFolder(deps, { episodeId: job.episodeId, attempt: attempt.attempt });
  const changes = await diffWorkspace(archive?.files('workspace') ?? new Map(), snapshotDir, extraction, deps.snapshotLimits.maxFileBytes);
  await Promise.all([
    evidence.writeText(job.episodeId, attempt.attempt, 'workspace.diff', changes.diff),
    evidence.writeJson(job.episodeId, attempt.attempt, 'evidence', {
      outputCapBytes: deps.outputCapBytes,
      agent: trail.agentRun && { stdout: capInfo(trail.agentRun.stdout), stderr: capInfo(trail.agentRun.stderr) },
      verifier: trail.verifyRun && { stdout: capInfo(trail.verifyRun.stdout), stderr: capInfo(trail.verifyRun.stderr) },
      workspace: { takenAt, added: changes.added, removed: changes.removed, modified: changes.modified, extraction: { ...extraction, files: extraction.files.length } },
      // What of /logs was kept (a cap reached, an entry refused: said here, not only in the worker's log).
      ...(logsKept && { logs: { files: logsKept.files.length, bytesWritten: logsKept.bytesWritten, truncated: logsKept.truncated, skipped: logsKept.skipped.slice(0, 50) } }),
      oomKilled: closed.oomKilled,
      // What ran beside a Harbor task's grader when the agent's processes were kept (pid, uid, command).
      ...(trail.grading?.beside && { besideGrader: trail.grading.beside }),
    }),
  ]);
  await publish(attempt, deps, signal);
}

/** The attempt's evidence into the artifact store, in what is left of its slice; else it waits in the outbox. */
async function publish(attempt: EpisodeAttempt, deps: Pick<CloseDeps, 'publisher' | 'evidence' | 'log'>, signal: AbortSignal): Promise<void> {
  await deps.publisher.publishPath(deps.evidence.folder(attempt.job.episodeId, attempt.attempt), signal).catch((err: unknown) =>
    deps.log.warn({ err: String(err) }, 'evidence not yet in the artifact store; the outbox keeps it for later'));
}

async function writeTrajectory(attempt: EpisodeAttempt, deps: Pick<CloseDeps, 'evidence'>): Promise<void> {
  const { job } = attempt;
  const folder = deps.evidence.folder(job.episodeId, attempt.attempt);
  const text = await readFile(path.join(folder, MODEL_CALLS_FILE), 'utf8').catch(() => '');
  // A line cut short (the disk filled) is left out, not the trajectory.
  const records = text.split('\n').flatMap((line) => {
    try {
      return line === '' ? [] : [JSON.parse(line) as ModelCallRecord];
    } catch {
      return [];
    }
  });
  const trajectory = buildTrajectory(records, { episodeId: job.episodeId, taskId: job.task.id, attempt: attempt.attempt });
  await writeFileAtomic(path.join(folder, TRAJECTORY_FILE), `${JSON.stringify(trajectory)}\n`);
}

const capInfo = (o: { totalBytes: number; truncated: boolean; capBytes: number }) => ({ totalBytes: o.totalBytes, truncated: o.truncated, capBytes: o.capBytes });

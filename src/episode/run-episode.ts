// One episode attempt, start to finish: seed ONE sandbox session, copy the workspace in, run the agent
// under its ceiling, copy the hidden tests in and verify, then a bounded close: evidence first, then
// the sandbox is handed to the cleanup queue. Every failure becomes a result with a kind, or a retry.
import { createHash } from 'node:crypto';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import type Docker from 'dockerode';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { EpisodeJob, EpisodeResult } from '../../queues/episodes/contract.ts';
import { createAgent, type AgentRun } from '../agent/agent.ts';
import type { AgentInput } from '../agent/reference/agent-input.ts';

type AgentResume = NonNullable<AgentInput['resume']>;
import { stopOf, type StopReason } from '../errors/episode-stop.ts';
import { FleetError, toFleetError } from '../errors/fleet-error.ts';
import type { EvidenceStore } from '../evidence/evidence-store.ts';
import { extractSafely, type ExtractLimits } from '../evidence/safe-extract.ts';
import { diffWorkspace } from '../evidence/workspace-diff.ts';
import { SANDBOX_USER, SandboxSession, removeContainer, type ExecResult } from '../sandbox/sandbox-session.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import { getTaskArchive } from '../tasks/task-store.ts';
import { agentCeilingSec } from '../tasks/task-spec.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy, type ModelProxy } from '../model/model-proxy.ts';
import type { RuntimeGeneration } from '../runtime/prepare-runtime.ts';
import type { CheckpointSink } from '../checkpoints/checkpoint-sink.ts';
import type { CheckpointStore } from '../checkpoints/checkpoint-store.ts';
import type { EpisodeControl } from './episode-control.ts';

/** Where the hidden tests are copied for verification, after the agent stopped. */
export const TESTS_DIR = '/tests';
const ROOT_OWNER = { uid: 0, gid: 0 } as const;

export interface EpisodeDeps {
  docker: Docker;
  redis: Redis;
  prefix: string;
  log: Logger;
  workerId: string;
  evidence: EvidenceStore;
  control: EpisodeControl;
  /** Deadline of each Docker API call. */
  callTimeoutMs: number;
  outputCapBytes: number;
  /** Caps of the workspace snapshot taken at close. */
  snapshotLimits: ExtractLimits;
  /** Hand a sandbox to the cleanup queue. */
  scheduleCleanup(episodeId: string, containerId: string): Promise<void>;
  /** The runtime generation every sandbox mounts read-only (installed once per engine, then warm). */
  prepareRuntime(signal: AbortSignal): Promise<RuntimeGeneration>;
  /** Holds per-episode folders (the model proxy's socket), bind-mounted at the same path. */
  dataDir: string;
  /** The model endpoint behind every episode's proxy; unset, agents that need a model fail (kind model). */
  model: ModelSettings | undefined;
  /** Where the agent's checkpoints go (never awaited by the agent) and where a retry finds the latest. */
  checkpoints: { sink: CheckpointSink; store: CheckpointStore };
}

export interface ModelSettings {
  baseUrl: string;
  apiKey?: string | undefined;
  /** Forces the model name of every request. */
  name?: string | undefined;
  maxCalls: number;
  maxTokens: number;
  requestTimeoutMs: number;
  upstreamRetries: number;
}

export interface EpisodeAttempt {
  job: EpisodeJob;
  /** 1-based: how many times this episode was started, this time included. */
  attempt: number;
  /** Aborted with an EpisodeStop to cancel the episode or hand it back (drain). */
  signal: AbortSignal;
}

export interface EpisodeOutcome {
  result: EpisodeResult;
  /** The failure may go away on another attempt (infrastructure, model). */
  retry: boolean;
  /** The worker is draining: the episode goes back to the queue, this attempt records no result. */
  handBack: boolean;
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

/** Redis steps of close may not wait longer than this (the worker's connection retries forever). */
const REDIS_STEP_MS = 5_000;

/** `work`, or a rejection after `ms` (work goes on in the background). */
function within<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took longer than ${ms} ms`)), ms);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}

const summary = (run: AgentRun | ExecResult) => ({ exitCode: run.exitCode, timedOut: run.timedOut, durationMs: run.durationMs });

interface Attempt {
  /** Checkpoint snapshots still being read from the sandbox; close waits for them. */
  snapshots: Set<Promise<void>>;
  /** The checkpoint this attempt resumed from. */
  resumedFrom?: number;
  archive?: TaskArchive;
  runtime?: RuntimeGeneration;
  proxy?: ModelProxy;
  containerId?: string;
  session?: SandboxSession;
  agentRun?: AgentRun;
  verifyRun?: ExecResult;
  imageId?: string;
}

type Graded = { status: EpisodeResult['status']; reward: number | null; error?: FleetError; stop?: StopReason };

export async function runEpisode(attempt: EpisodeAttempt, deps: EpisodeDeps): Promise<EpisodeOutcome> {
  const { job, signal } = attempt;
  const { task } = job;
  const log = deps.log.child({ episodeId: job.episodeId, attempt: attempt.attempt });
  const startedAt = new Date();
  const t0 = performance.now();
  const since = (t: number) => Math.round(performance.now() - t);
  const timings: EpisodeResult['timings'] = { totalMs: 0 };
  const state: Attempt = { snapshots: new Set() };

  let graded: Graded;
  try {
    graded = await setUpRunVerify(attempt, deps, state, timings, log);
  } catch (err) {
    const stop = stopOf(signal);
    if (stop) {
      graded = { status: 'cancelled', reward: null, stop: stop.reason };
    } else {
      const error = toFleetError(err);
      graded = { status: 'error', reward: null, error };
      log.warn({ code: error.code, kind: error.outcome.kind, err: error.message }, 'episode attempt failed');
    }
  }

  // Close. From here on a cancel is refused (the caller is told the episode is closing), unless it
  // was flagged first, in which case the episode ends cancelled.
  const tClose = performance.now();
  const begin = within(deps.control.beginClose(job.episodeId), REDIS_STEP_MS, 'marking the episode closing');
  if (graded.stop === undefined && (await begin.catch(() => 'closing')) === 'cancelled') {
    graded = { status: 'cancelled', reward: null, stop: 'cancelled' };
  }
  const oomKilled = await closeEpisode(attempt, deps, state, log);
  timings.closeMs = since(tClose);
  timings.totalMs = since(t0);

  const { error } = graded;
  const result: EpisodeResult = {
    episodeId: job.episodeId,
    batchId: job.batchId,
    taskId: task.id,
    sample: job.sample,
    status: graded.status,
    ...(error && { error: { kind: error.outcome.kind, code: error.code, message: error.message } }),
    reward: graded.reward,
    attempts: attempt.attempt,
    workerId: deps.workerId,
    timings,
    provenance: { taskDigest: job.taskDigest, image: task.image, ...(state.imageId && { imageId: state.imageId }), agent: job.agent },
    ...(state.runtime && { runtime: { generationId: state.runtime.generationId, warm: state.runtime.warm, prepareMs: state.runtime.prepareMs } }),
    ...(state.agentRun && { agent: summary(state.agentRun) }),
    ...(state.agentRun?.usage && { usage: state.agentRun.usage }),
    ...(state.resumedFrom !== undefined && { resumedFrom: state.resumedFrom }),
    ...(state.verifyRun && { verifier: summary(state.verifyRun) }),
    ...(oomKilled !== undefined && { oomKilled }),
    startedAt: startedAt.toISOString(),
    endedAt: new Date().toISOString(),
  };
  await deps.evidence.writeJson(job.episodeId, attempt.attempt, 'result', result).catch(() => undefined);
  return {
    result,
    retry: error?.outcome.retry ?? false,
    handBack: graded.stop === 'drain',
    ...(error && { error }),
  };
}

/** Set-up, agent, verification. Throws on failure; the signal's EpisodeStop when stopped from outside. */
async function setUpRunVerify(attempt: EpisodeAttempt, deps: EpisodeDeps, state: Attempt, timings: EpisodeResult['timings'], log: Logger): Promise<Graded> {
  const { job, signal } = attempt;
  const { task } = job;
  const since = (t: number) => Math.round(performance.now() - t);

  // Set-up: fetch the task, seed the one sandbox of this episode, copy the workspace in.
  const tSetup = performance.now();
  const setupSignal = phaseSignal(signal, task.reserves.setupSec * 1000, () =>
    new FleetError('docker_timeout', `set-up passed its reserve of ${task.reserves.setupSec}s`));
  const archive = await getTaskArchive(deps.redis, deps.prefix, job.taskDigest);
  state.archive = archive;
  const runtime = await deps.prepareRuntime(setupSignal);
  state.runtime = runtime;
  const needsModel = job.agent.kind === 'llm';
  if (needsModel) state.proxy = await startEpisodeProxy(attempt, deps, log);
  const session = await SandboxSession.open(
    { docker: deps.docker, log, callTimeoutMs: deps.callTimeoutMs },
    {
      image: task.image,
      workdir: task.workdir,
      limits: task.limits,
      owner: { fleet: deps.prefix, episodeId: job.episodeId, batchId: job.batchId, workerId: deps.workerId, attempt: attempt.attempt },
      mounts: [runtime.mount],
      bindFolders: state.proxy ? [path.dirname(state.proxy.socketPath)] : [],
    },
    (id) => {
      state.containerId = id;
    },
    setupSignal,
  );
  state.session = session;
  state.imageId = session.imageId;
  await session.putArchive(await archive.partAsTar('workspace', task.workdir, SANDBOX_USER), '/', setupSignal);
  timings.setupMs = since(tSetup);
  log.info({ containerId: state.containerId, setupMs: timings.setupMs, runtime: runtime.generationId.slice(0, 12), warm: runtime.warm }, 'sandbox ready');

  // Resume: a retried llm episode continues from its latest durable checkpoint, workspace included.
  const resume = job.agent.kind === 'llm' ? await resumePoint(attempt, deps, session, state, log) : undefined;

  // The agent, under its ceiling: the deadline minus the set-up, verification and close reserves,
  // minus the agent time earlier attempts already used.
  const ceilingMs = Math.max(0, agentCeilingSec(task) * 1000 - (resume?.agentMs ?? 0));
  const agentStarted = performance.now();
  const agentRun = await createAgent(job.agent).run({
    session, task, archive, ceilingMs, outputCapBytes: deps.outputCapBytes, signal,
    runtimeMountPath: runtime.mountPath,
    ...(state.proxy && { modelSocket: state.proxy.socketPath }),
    ...(resume && { resume }),
    onEvent: (event) => {
      if (event.type !== 'checkpoint') return;
      // The agent goes on at once: the snapshot is read and handed to the writer in the background.
      // Whatever the sandbox prints, a bad checkpoint is dropped and logged, never thrown.
      const { type: _type, ...cp } = event;
      // Agent time as the worker measured it (earlier attempts plus this one), not as the sandbox says:
      // it is what a resumed attempt's ceiling is cut by.
      const agentMs = Math.round((resume?.agentMs ?? 0) + performance.now() - agentStarted);
      const offer = { ...cp, agentMs, episodeId: job.episodeId, createdAt: new Date().toISOString() };
      const handOver = session.getArchive(task.workdir, signal)
        .then((tar) => deps.checkpoints.sink.offer(offer, tar), () => deps.checkpoints.sink.offer(offer, undefined))
        .catch((err: unknown) => log.warn({ seq: cp.seq, err: String(err) }, 'checkpoint dropped'));
      state.snapshots.add(handOver);
      void handOver.finally(() => state.snapshots.delete(handOver));
    },
  }).catch((err: unknown) => {
    // An agent that crashed still leaves its output as evidence.
    const crashed = (err as { agentRun?: AgentRun }).agentRun;
    if (crashed) state.agentRun = crashed;
    throw err;
  });
  state.agentRun = agentRun;
  // Nothing the agent started may outlive it: a process left behind could rewrite the tests once they
  // arrive. And the model is for the agent only: the verifier runs with the proxy gone.
  await session.killAll();
  await state.proxy?.close();
  timings.agentMs = agentRun.durationMs;
  log.info({ exitCode: agentRun.exitCode, timedOut: agentRun.timedOut, agentMs: agentRun.durationMs }, 'agent stopped');
  if (signal.aborted) throw signal.reason;

  // Verification: the hidden tests exist in the sandbox only from now on.
  const tVerify = performance.now();
  // Owned by root (read-only for the sandbox user, who runs the verifier): the tests cannot be edited.
  await session.putArchive(await archive.partAsTar('tests', TESTS_DIR, ROOT_OWNER), '/', signal);
  const verifyRun = await session.exec(task.verify.command, { timeoutMs: task.verify.timeoutSec * 1000, capBytes: deps.outputCapBytes, signal });
  state.verifyRun = verifyRun;
  timings.verifyMs = since(tVerify);
  if (signal.aborted) throw signal.reason;
  if (verifyRun.timedOut) throw new FleetError('verifier_timeout', `verifier passed its timeout of ${task.verify.timeoutSec}s`);
  if (verifyRun.exitCode !== 0 && verifyRun.exitCode !== 1) {
    throw new FleetError('verifier_crashed', `verifier exited with ${verifyRun.exitCode} (0 passes, 1 fails, anything else is a broken verifier)`);
  }
  const reward = verifyRun.exitCode === 0 ? 1 : 0;
  return { status: agentRun.timedOut ? 'timeout' : reward === 1 ? 'passed' : 'failed', reward };
}

/**
 * Bounded close: evidence first (outputs, container state, workspace snapshot and diff), all within
 * the close reserve; then the sandbox goes to the cleanup queue, which finishes whatever close could
 * not. Never throws. Returns whether the sandbox was OOM-killed, when known.
 */
async function closeEpisode(attempt: EpisodeAttempt, deps: EpisodeDeps, state: Attempt, log: Logger): Promise<boolean | undefined> {
  const { job } = attempt;
  const { task } = job;
  const { evidence } = deps;
  // Keep a little of the reserve for handing the sandbox over.
  const budgetMs = Math.max(1_000, task.reserves.closeSec * 1000 - 2_000);
  const closeSignal = AbortSignal.timeout(budgetMs);
  let oomKilled: boolean | undefined;

  const collect = async () => {
    // Checkpoints still being handed over read the sandbox's workspace: let them finish first.
    await Promise.all([...state.snapshots]);
    await deps.checkpoints.sink.flush(job.episodeId, closeSignal).catch((err: unknown) => log.warn({ err: String(err) }, 'checkpoint hand-over unfinished at close'));
    await Promise.all([
      state.agentRun && evidence.writeOutput(job.episodeId, attempt.attempt, 'agent', state.agentRun),
      state.verifyRun && evidence.writeOutput(job.episodeId, attempt.attempt, 'verifier', state.verifyRun),
    ]);
    if (state.session === undefined) return;
    oomKilled = await state.session.state(closeSignal).then((s) => s.oomKilled, () => undefined);
    const folder = evidence.folder(job.episodeId, attempt.attempt);
    const snapshotDir = path.join(folder, 'workspace');
    const tar = (await state.session.getArchive(task.workdir, closeSignal)) as Readable;
    closeSignal.addEventListener('abort', () => tar.destroy(), { once: true });
    const extraction = await extractSafely(tar, snapshotDir, { ...deps.snapshotLimits, strip: 1 });
    const changes = await diffWorkspace(state.archive?.files('workspace') ?? new Map(), snapshotDir, extraction, deps.snapshotLimits.maxFileBytes);
    await Promise.all([
      evidence.writeText(job.episodeId, attempt.attempt, 'workspace.diff', changes.diff),
      evidence.writeJson(job.episodeId, attempt.attempt, 'evidence', {
        outputCapBytes: deps.outputCapBytes,
        agent: state.agentRun && { stdout: capInfo(state.agentRun.stdout), stderr: capInfo(state.agentRun.stderr) },
        verifier: state.verifyRun && { stdout: capInfo(state.verifyRun.stdout), stderr: capInfo(state.verifyRun.stderr) },
        workspace: { added: changes.added, removed: changes.removed, modified: changes.modified, extraction: { ...extraction, files: extraction.files.length } },
        oomKilled,
      }),
    ]);
  };
  const budget = new Promise<'budget'>((resolve) => closeSignal.addEventListener('abort', () => resolve('budget'), { once: true }));
  await state.proxy?.close().catch((err: unknown) => log.warn({ err: String(err) }, 'closing the model proxy failed'));
  const collected = await Promise.race([collect().then(() => 'done' as const, (err: unknown) => {
    log.warn({ err: String(err) }, 'collecting evidence failed');
    return 'failed' as const;
  }), budget]);
  if (collected === 'budget') log.warn({ budgetMs }, 'evidence collection passed the close reserve; kept what it had');

  if (state.containerId !== undefined) {
    const id = state.containerId;
    await within(deps.scheduleCleanup(job.episodeId, id), REDIS_STEP_MS, 'handing the sandbox to the cleanup queue').catch(async (err: unknown) => {
      log.warn({ containerId: id, err: String(err) }, 'cleanup queue unavailable; removing the sandbox directly');
      await removeContainer(deps.docker, id, deps.callTimeoutMs).catch((e: unknown) =>
        log.error({ containerId: id, err: String(e) }, 'sandbox not removed; the reaper will find it by its labels'));
    });
  }
  // Last: the engine resolves the sandbox's bind mounts for every archive call, so the proxy's
  // (now empty) folder stays until nothing more is read from the sandbox.
  if (state.proxy) await rm(path.dirname(state.proxy.socketPath), { recursive: true, force: true }).catch(() => undefined);
  return oomKilled;
}

const capInfo = (o: { totalBytes: number; truncated: boolean; capBytes: number }) => ({ totalBytes: o.totalBytes, truncated: o.truncated, capBytes: o.capBytes });

/** The episode's model proxy: the sandbox's one way out, to the configured endpoint only. */
async function startEpisodeProxy(attempt: EpisodeAttempt, deps: EpisodeDeps, log: Logger): Promise<ModelProxy> {
  const { job } = attempt;
  if (deps.model === undefined) {
    throw new FleetError('model_error', `agent ${job.agent.kind} needs a model, and MODEL_BASE_URL is not set on worker ${deps.workerId}`);
  }
  // A short folder name: a Unix socket path must stay under 108 bytes.
  const folderId = createHash('sha256').update(`${job.episodeId}/${attempt.attempt}`).digest('hex').slice(0, 16);
  return startModelProxy({
    socketPath: modelSocketPath(deps.dataDir, folderId),
    upstreamBaseUrl: deps.model.baseUrl,
    apiKey: deps.model.apiKey,
    model: deps.model.name,
    budget: { maxCalls: deps.model.maxCalls, maxTokens: deps.model.maxTokens },
    evidenceFile: path.join(deps.evidence.folder(job.episodeId, attempt.attempt), MODEL_CALLS_FILE),
    episodeId: job.episodeId,
    taskId: job.task.id,
    log,
    requestTimeoutMs: deps.model.requestTimeoutMs,
    retry: { retries: deps.model.upstreamRetries },
  });
}

/**
 * The newest durable checkpoint whose workspace was captured, restored into the sandbox; undefined
 * when there is none (a conversation without its workspace would remember edits that are not there).
 */
async function resumePoint(attempt: EpisodeAttempt, deps: EpisodeDeps, session: SandboxSession, state: Attempt, log: Logger): Promise<AgentResume | undefined> {
  const { job } = attempt;
  const { store } = deps.checkpoints;
  const seqs = (await store.seqs(job.episodeId)).sort((a, b) => b - a);
  for (const seq of seqs) {
    const stored = await store.read(job.episodeId, seq);
    if (stored?.workspaceTar === undefined) {
      if (stored) log.info({ seq, workspace: stored.checkpoint.workspace }, 'checkpoint without its workspace: not resumed from');
      continue;
    }
    const { checkpoint } = stored;
    // The tar holds the workdir under its base name (what getArchive gave): unpack it in the parent.
    await session.putArchive(stored.workspaceTar.open(), path.posix.dirname(job.task.workdir), attempt.signal);
    state.resumedFrom = checkpoint.seq;
    log.info({ seq: checkpoint.seq, turn: checkpoint.turn, agentMs: checkpoint.agentMs }, 'resuming from checkpoint');
    return { turn: checkpoint.turn, messages: checkpoint.messages, usage: checkpoint.usage, agentMs: checkpoint.agentMs };
  }
  return undefined;
}

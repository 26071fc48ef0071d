// The composition root of a worker process: builds its Redis connections, queues and stores, and wires
// the processors of episodes (the main work), cleanup (sandbox removal and the scheduled reaper),
// checkpoints (the background writer) and batches (the summary when a batch ends); plus its lease and
// its ear for cancel requests. close() drains: no new jobs, running episodes get the drain timeout,
// then are handed back to the queue; every connection it opened is released. Every step of close() is
// bounded by one deadline (drain timeout plus a grace), whatever Redis does: past it, connections are
// cut and the caller is told what could not be handed back.
import { Queue, Worker } from 'bullmq';
import type Docker from 'dockerode';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { BATCHES_QUEUE } from '../results/batch-job.ts';
import { batchProcessor } from '../../queues/batches/processor.ts';
import { CLEANUP_QUEUE } from '../cleanup/cleanup-job.ts';
import { cleanupHandOver } from '../cleanup/cleanup-hand-over.ts';
import { scheduleReaper } from '../cleanup/reaper-schedule.ts';
import { cleanupProcessor } from '../../queues/cleanup/processor.ts';
import { EPISODES_QUEUE, episodeBackoffMs } from '../episode/episode-job.ts';
import { CHECKPOINTS_QUEUE } from '../checkpoints/checkpoint-job.ts';
import { episodeFailedListener, episodeProcessor, type EpisodeProcessorDeps } from '../../queues/episodes/processor.ts';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { sandboxPrograms } from '../agent/sandbox-programs.ts';
import { CheckpointSink } from '../checkpoints/checkpoint-sink.ts';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { FolderStore } from '../artifacts/folder-store.ts';
import { checkpointStorage } from '../checkpoints/open-checkpoint-storage.ts';
import { EvidencePublisher } from '../evidence/publish-evidence.ts';
import { OUTBOX_INTERVAL_MS, startOutbox } from '../evidence/outbox-loop.ts';
import { DEFAULT_RETRY_BUDGETS, type RetryBudgets } from '../errors/retry-budgets.ts';
import { settingsEndpoints, type ModelSettings, type WorkerModels } from '../episode/episode-attempt.ts';
import { endpointLimiter } from '../model/fleet-limits.ts';
import { PolicyStamper } from '../model/policy-versions.ts';
import { runtimePreparer } from '../runtime/runtime-preparer.ts';
import { EpisodeControl } from '../episode/episode-control.ts';
import { RunningEpisodes } from '../episode/running-episodes.ts';
import { EvidenceStore } from '../evidence/evidence-store.ts';
import type { ExtractLimits } from '../evidence/safe-extract.ts';
import { ResultsStore } from '../results/results-store.ts';
import { untilAborted } from '../deadlines/deadline.ts';
import { RedisOutageLog } from '../redis/outage-log.ts';
import { startAdmission, type AdmissionOptions, type AdmissionRunner } from './admission.ts';
import { startHostFacts } from './host-facts.ts';
import { ResourceBudget, type BudgetLimits } from '../episode/resource-budget.ts';
import { startLease } from '../cleanup/worker-lease.ts';
import { SandboxPool } from '../sandbox/sandbox-pool.ts';
import { UpcomingTasks } from './upcoming-tasks.ts';
import { resolveSandboxRuntime } from '../sandbox/sandbox-runtime.ts';
import { startCheckpointWriter } from './checkpoint-writer.ts';
import { startPruneSchedule, type PruneSchedule } from '../environments/prune-schedule.ts';
import { prepareQueueName } from '../environments/prepare-job.ts';
import { prepareProcessor } from '../../queues/prepare/processor.ts';
import { engineId } from '../sandbox/docker-client.ts';
import { DEFAULT_NETWORK, type NetworkSettings } from '../egress/network-grant.ts';

export interface WorkerOptions {
  redisUrl: string;
  prefix: string;
  dataDir: string;
  docker: Docker;
  log: Logger;
  workerId: string;
  /** Episodes at once; with autotune, the most at once (the ceiling of the allowance). */
  concurrency: number;
  /** Warm sandboxes kept ready per kind (src/sandbox/sandbox-pool.ts). @default 0: none */
  sandboxPool?: number;
  /**
   * The engine's runtime every sandbox runs under (FLEET_SANDBOX_RUNTIME, e.g. runsc); start fails with a
   * ConfigError naming the setting when the engine does not list it. @default the engine's default
   */
  sandboxRuntime?: string;
  /** Every phase's network ceiling and the egress proxy's name overrides (FLEET_NETWORK_CEILING, FLEET_EGRESS_HOSTS). @default allowlist, none */
  network?: NetworkSettings;
  /**
   * The registry (host:port, FLEET_REGISTRY) Harbor environments are shared through: built once for
   * the fleet, pushed, and pulled by the other hosts. Unset: each engine builds its own.
   */
  registry?: string;
  /**
   * Admission control (src/worker/admission.ts). With `autotune`, the worker runs between `floor` and
   * `concurrency` episodes at once, as the engine's latency (and the host's load, when a limit is set)
   * allows. Unset, or autotune false: a fixed `concurrency` (the engine's latency is still measured and
   * reported). maxLatencyMs defaults to a tenth of callTimeoutMs.
   */
  admission?: { autotune: boolean } & Omit<AdmissionOptions, 'ceiling'>;
  /**
   * What the environments of the episodes running at once may cost (src/episode/resource-budget.ts):
   * every container of an environment (a task with services has several) counted at its limits. An
   * episode waits, in pick-up order, until its environment fits. @default memory: the host's
   * (os.totalmem()); CPUs: unlimited
   */
  resources?: BudgetLimits;
  callTimeoutMs: number;
  outputCapBytes: number;
  /** @default 15000 */
  leaseTtlMs?: number;
  /** @default 30000 */
  reaperIntervalMs?: number;
  /** BullMQ lock duration; the stalled-job check runs at the same interval. @default 30000 */
  lockDurationMs?: number;
  /** @default 30000 */
  drainTimeoutMs?: number;
  /**
   * After the drain timeout, how long close() may still take to hand episodes back and release its
   * connections before it cuts them. @default CLOSE_GRACE_MS
   */
  closeGraceMs?: number;
  /** @default DEFAULT_RETRY_BUDGETS */
  retryBudgets?: RetryBudgets;
  /** @default 16 MiB total, 4 MiB per file, 2000 files */
  snapshotLimits?: ExtractLimits;
  /** The model endpoints behind the episodes' proxies; unset, llm episodes fail with kind model. */
  model?: ModelSettings;
  /** Runtime generations no sandbox used for this long are removed by the reaper. @default 7 days */
  runtimeMaxIdleMs?: number;
  /** Where the patched node of the runtime is cached, for many data folders (FLEET_RUNTIME_CACHE). @default <dataDir>/runtime-src */
  runtimeCacheDir?: string;
  /**
   * Runtime volumes are named after this instead of the prefix, shared by every fleet naming it
   * (FLEET_RUNTIME_SCOPE; see RuntimeDeps.volumeScope). The reaper removes only the prefix's own.
   * @default the prefix: one volume per fleet
   */
  runtimeVolumeScope?: string;
  /** Checkpoints kept per episode by this process's checkpoint writer. @default 5 */
  checkpointKeep?: number;
  /** Where checkpoints and evidence go for every host to read (FLEET_ARTIFACTS). @default the data folder */
  artifacts?: ArtifactStore;
  /** A checkpoint's workspace snapshot above this is not captured (the checkpoint says why). @default 8 MiB */
  checkpointWorkspaceCapBytes?: number;
  /** A staged checkpoint no writer took expires after this long. @default 24 h */
  checkpointStagedTtlMs?: number;
  /**
   * How often the background publisher copies evidence left in the outbox (the store was down or slow
   * at close) into the artifact store; tests pass a short one. @default 30000
   */
  outboxIntervalMs?: number;
  /**
   * The built environment images of this worker's engine held to a disk budget, least recently used
   * removed first, every `everyMs` (0: never), by one worker of the engine per interval. @default 50 GiB, every 10 min, 10 min idle
   */
  envPrune?: { budgetBytes: number; everyMs: number; minIdleMs: number };
}

export interface CloseOutcome {
  /** Every step finished before the deadline (false: connections were cut; Redis did not answer). */
  clean: boolean;
  /** Episodes still running at the deadline: not handed back, their jobs return by stall detection. */
  notHandedBack: number;
  /** The close steps the deadline cut short. */
  cutShort: string[];
}

export interface WorkerHandle {
  workerId: string;
  running: RunningEpisodes;
  /** The admission controller: the allowance, the engine's latency as measured. */
  admission: AdmissionRunner;
  /** What the running episodes' environments cost, against the worker's budget. */
  budget: ResourceBudget;
  /** The episodes Worker's concurrency now (BullMQ's own setting, which the allowance drives). */
  concurrency(): number;
  /** The schedule holding this engine's built environment images to their disk budget. */
  envPrune: PruneSchedule;
  /**
   * Stop taking jobs; running episodes get the drain timeout, then go back to the queue. Settles within
   * drainTimeoutMs + closeGraceMs whatever Redis does: an episode whose stop and close take longer is
   * not handed back (its job returns by stall detection, which counts against its infra budget).
   */
  close(): Promise<CloseOutcome>;
}

/** Time close() may take past the drain timeout before it cuts its connections. */
export const CLOSE_GRACE_MS = 5_000;

export const DEFAULT_SNAPSHOT_LIMITS: ExtractLimits = { maxBytes: 16 * 1024 * 1024, maxFileBytes: 4 * 1024 * 1024, maxFiles: 2_000 };

export async function startWorker(opts: WorkerOptions): Promise<WorkerHandle> {
  const { prefix, log, workerId, docker } = opts;
  const lockDuration = opts.lockDurationMs ?? 30_000;
  const leaseTtlMs = opts.leaseTtlMs ?? 15_000;
  const reaperIntervalMs = opts.reaperIntervalMs ?? 30_000;
  const drainTimeoutMs = opts.drainTimeoutMs ?? 30_000;
  const closeGraceMs = opts.closeGraceMs ?? CLOSE_GRACE_MS;
  const snapshotLimits = opts.snapshotLimits ?? DEFAULT_SNAPSHOT_LIMITS;
  // Before anything connects: a runtime the engine does not know would fail every sandbox.
  const sandboxRuntime = opts.sandboxRuntime === undefined
    ? undefined
    : await resolveSandboxRuntime(docker, opts.sandboxRuntime, { timeoutMs: opts.callTimeoutMs });
  if (sandboxRuntime) log.info({ sandboxRuntime }, 'sandboxes run under the engine runtime');

  const connection = new Redis(opts.redisUrl, { maxRetriesPerRequest: null, connectionName: `rf-worker-${workerId}` });
  // disableClientInfo: ioredis 5.8.2+ may send CLIENT SETINFO and INFO after SUBSCRIBE on (re)connect, which
  // Redis refuses in subscriber mode ("only subscriber commands may be used"; ioredis #2037).
  const subscriber = connection.duplicate({ connectionName: `rf-worker-${workerId}-cancel`, disableClientInfo: true });
  // Queues built on `connection` relay its errors: they count toward its outage. BullMQ Workers
  // duplicate it for their blocking reads, so each Worker is a source of its own.
  const outages = new RedisOutageLog(log);
  outages.watchClient(connection, 'connection');
  outages.watchClient(subscriber, 'cancel-subscriber');

  const results = new ResultsStore(connection, prefix, opts.dataDir);
  // Every generation carries the bundled sandbox programs (the reference agent, the model forwarder).
  const runtime = runtimePreparer({ docker, redis: connection, prefix, log, dataDir: opts.dataDir, callTimeoutMs: opts.callTimeoutMs, extraFiles: sandboxPrograms,
    ...(opts.runtimeCacheDir !== undefined && { runtimeCacheDir: opts.runtimeCacheDir }),
    ...(opts.runtimeVolumeScope !== undefined && { volumeScope: opts.runtimeVolumeScope }),
  });
  // Warm the runtime generation now, so the first episodes do not pay its install in their set-up.
  const warmUp = runtime.prepare().then(() => undefined, (err: unknown) => log.warn({ err: String(err) }, 'runtime generation not prepared at start; episodes will try again'));
  const checkpointsQueue = new Queue(CHECKPOINTS_QUEUE, { connection, prefix });
  checkpointsQueue.on('error', outages.listener('connection', 'checkpoints queue error'));
  const checkpointSink = new CheckpointSink({
    connection, queue: checkpointsQueue, prefix, log,
    ...(opts.checkpointWorkspaceCapBytes !== undefined && { workspaceCapBytes: opts.checkpointWorkspaceCapBytes }),
    ...(opts.checkpointStagedTtlMs !== undefined && { stagedTtlMs: opts.checkpointStagedTtlMs }),
  });
  const artifacts = opts.artifacts ?? new FolderStore(opts.dataDir);
  const checkpointStore = checkpointStorage(artifacts, connection, prefix, { keep: opts.checkpointKeep ?? 5 });
  const evidence = new EvidenceStore(opts.dataDir);
  // Evidence that could not be published at close (the store down or slow) goes from the outbox later.
  const publisher = new EvidencePublisher(artifacts, opts.dataDir, log);
  const stopOutbox = startOutbox(publisher, opts.outboxIntervalMs ?? OUTBOX_INTERVAL_MS, log);
  const control = new EpisodeControl(connection, prefix);
  const running = new RunningEpisodes();
  const lease = await startLease(connection, prefix, workerId, leaseTtlMs, log);
  const admission = startAdmission({
    ...opts.admission,
    autotune: opts.admission?.autotune ?? false,
    ceiling: opts.concurrency,
    maxLatencyMs: opts.admission?.maxLatencyMs ?? Math.max(1, Math.round(opts.callTimeoutMs / 10)),
    inUse: () => running.size,
    log,
  });

  // Cancel requests reach whichever worker runs the episode.
  await subscriber.subscribe(control.channel);
  subscriber.on('message', (_channel: string, episodeId: string) => {
    if (running.stop(episodeId, 'cancelled')) log.info({ episodeId }, 'episode cancelled');
  });

  const cleanupQueue = new Queue(CLEANUP_QUEUE, { connection, prefix });
  cleanupQueue.on('error', outages.listener('connection', 'cleanup queue error'));
  await scheduleReaper(cleanupQueue, reaperIntervalMs);

  const workerOpts = { connection, prefix, name: workerId, lockDuration, stalledInterval: lockDuration };
  // No warm pool under gVisor: warm runsc sandboxes were seen dying or going missing under the full
  // suite's load (never alone), so each episode creates its own there until that is understood.
  const poolSize = sandboxRuntime?.gvisor ? 0 : opts.sandboxPool ?? 0;
  if (poolSize !== (opts.sandboxPool ?? 0)) log.warn({ requested: opts.sandboxPool }, 'the warm sandbox pool is off under gVisor (FLEET_SANDBOX_RUNTIME=runsc)');
  const pool = new SandboxPool({
    docker, log, callTimeoutMs: opts.callTimeoutMs, redis: connection, prefix, workerId,
    size: poolSize, runDir: path.join(opts.dataDir, 'run'), runtime: sandboxRuntime,
  });
  // With a pool, which tasks wait: sandboxes seeded with a task's workspace while more of it are coming.
  const episodesQueue = poolSize > 0 ? new Queue(EPISODES_QUEUE, { connection, prefix }) : undefined;
  episodesQueue?.on('error', outages.listener('connection', 'episodes queue error'));
  const upcoming = episodesQueue && new UpcomingTasks(episodesQueue, log);
  // The Worker of this engine's prepare queue, once the engine's id is known (below).
  let prepare: Worker | undefined;
  const budget = new ResourceBudget({ memoryMb: opts.resources?.memoryMb ?? Math.floor(os.totalmem() / 2 ** 20), cpus: opts.resources?.cpus });
  // Its facts tell the dashboard what runs here, in which phase, within a moment of a change.
  // One limiter per worker and endpoint: its state is in Redis (keyed by the endpoint's name), shared with every other worker.
  const models: WorkerModels | undefined = (() => {
    const settings = opts.model;
    if (settings === undefined) return undefined;
    const endpoints = settingsEndpoints(settings);
    if (endpoints.length === 0) return undefined;
    return {
      maxCalls: settings.maxCalls, maxTokens: settings.maxTokens, requestTimeoutMs: settings.requestTimeoutMs, upstreamRetries: settings.upstreamRetries,
      endpoints: new Map(endpoints.map((e) => [e.name, {
        ...e, limiter: endpointLimiter(e.baseUrl, e.limits, settings.requestTimeoutMs, { redis: connection, prefix, log }, e.name),
      }])),
    };
  })();
  const hostFacts = startHostFacts({
    modelEndpoints: [...(models?.endpoints.keys() ?? [])],
    redis: connection, prefix, docker, workerId, concurrency: opts.concurrency, dataDir: opts.dataDir,
    ttlMs: leaseTtlMs, callTimeoutMs: opts.callTimeoutMs, runtimeGeneration: runtime.generation, log,
    running: () => running.list(), poolReady: () => pool.readyCount, admission: () => admission.snapshot(), budget: () => budget.snapshot(),
    prepareQueue: () => prepare?.name,
  });
  running.onChange(hostFacts.touch);
  const episodeDeps: EpisodeProcessorDeps = {
    budget,
    docker,
    redis: connection,
    prefix,
    log,
    workerId,
    evidence,
    results,
    control,
    running,
    retryBudgets: opts.retryBudgets ?? DEFAULT_RETRY_BUDGETS,
    callTimeoutMs: opts.callTimeoutMs,
    outputCapBytes: opts.outputCapBytes,
    snapshotLimits,
    dataDir: opts.dataDir,
    publisher,
    // One limiter per worker and endpoint: its state is in Redis, shared with every other worker.
    model: models,
    checkpoints: { sink: checkpointSink, store: checkpointStore },
    // Every model call is stamped with its endpoint's policy version, read in Redis at its start.
    policy: new PolicyStamper(connection, prefix, log),
    prepareRuntime: runtime.prepare,
    pool,
    upcoming,
    sandboxRuntime,
    network: opts.network ?? DEFAULT_NETWORK,
    registry: opts.registry,
    scheduleCleanup: cleanupHandOver(cleanupQueue, docker, opts.callTimeoutMs),
  };
  // A stall (the worker running the attempt died) is an infrastructure failure: BullMQ may hand the
  // job back as often as the infra budget allows (its default, 1, ended episodes after two kills), and
  // the processor counts stalls and infra failures together against that one budget.
  const maxStalledCount = episodeDeps.retryBudgets.infra ?? 0;
  const episodes = new Worker(
    EPISODES_QUEUE,
    episodeProcessor(episodeDeps),
    { ...workerOpts, concurrency: admission.allowance, maxStalledCount, settings: { backoffStrategy: episodeBackoffMs } },
  );
  admission.attach(episodes);
  const cleanup = new Worker(
    CLEANUP_QUEUE,
    cleanupProcessor({
      docker, redis: connection, prefix, results, evidence, publisher, log, callTimeoutMs: opts.callTimeoutMs, salvageLimits: snapshotLimits, reapMinAgeMs: 0,
      confirmDeadAfterMs: leaseTtlMs,
      runtimeMaxIdleMs: opts.runtimeMaxIdleMs ?? 7 * 24 * 3600 * 1000,
    }),
    { ...workerOpts, concurrency: 4 },
  );
  const batches = new Worker(BATCHES_QUEUE, batchProcessor(results), { ...workerOpts, concurrency: 2 });
  const checkpoints = startCheckpointWriter({
    connection, prefix, dataDir: opts.dataDir, log, name: workerId, lockDurationMs: lockDuration, keep: opts.checkpointKeep, artifacts,
    onError: outages.listener(`${CHECKPOINTS_QUEUE}-worker`, 'worker error', 'error'),
  });

  // Built environment images are pruned per engine: each worker's timer, one run per engine and interval.
  const envPrune = startPruneSchedule({
    docker, redis: connection, prefix, log, callTimeoutMs: opts.callTimeoutMs,
    budgetBytes: opts.envPrune?.budgetBytes ?? 50 * 2 ** 30, everyMs: opts.envPrune?.everyMs ?? 600_000, minIdleMs: opts.envPrune?.minIdleMs ?? 600_000,
  });
  // `rollout-fleet prepare` addresses each engine's queue: this worker takes its engine's, once it
  // knows the engine's id (an engine down at start is asked again every few seconds).
  const prepareStop = new AbortController();
  void (async () => {
    while (!prepareStop.signal.aborted) {
      try {
        const engine = await engineId(docker, { timeoutMs: opts.callTimeoutMs, signal: prepareStop.signal });
        if (prepareStop.signal.aborted) return;
        prepare = new Worker(prepareQueueName(engine), prepareProcessor({ docker, redis: connection, prefix, log, workerId, callTimeoutMs: opts.callTimeoutMs, registry: opts.registry }), { ...workerOpts, concurrency: 2 });
        prepare.on('error', outages.listener('prepare-worker', 'worker error', 'error'));
        hostFacts.touch(); // prepare finds this host from now on
        return;
      } catch (err) {
        if (prepareStop.signal.aborted) return;
        log.warn({ err: String(err) }, 'engine id unknown: prepare jobs of this host wait');
        await sleep(5_000, undefined, { signal: prepareStop.signal }).catch(() => undefined);
      }
    }
  })();
  for (const w of [episodes, cleanup, batches]) w.on('error', outages.listener(`${w.name}-worker`, 'worker error', 'error'));
  episodes.on('failed', episodeFailedListener(episodeDeps));
  log.info({ workerId, concurrency: opts.concurrency, autotune: admission.autotune, allowance: admission.allowance, budget: budget.limits }, 'worker started');

  return {
    workerId,
    running,
    admission,
    budget,
    concurrency: () => episodes.concurrency,
    envPrune,
    async close() {
      // One deadline for the whole close: a Redis that does not answer (down, or back without our
      // keys) must not keep a stopping worker alive, so every step is raced against it.
      const deadline = AbortSignal.timeout(drainTimeoutMs + closeGraceMs);
      const cutShort: string[] = [];
      const step = async (name: string, work: () => Promise<unknown>): Promise<void> => {
        if (deadline.aborted) {
          cutShort.push(name);
          return;
        }
        await untilAborted(work(), deadline).catch((err: unknown) => {
          if (deadline.aborted) cutShort.push(name);
          else log.warn({ step: name, err: String(err) }, 'close step failed');
        });
      };
      // Stop fetching; give running episodes the drain timeout, then hand them back to the queue.
      const timer = setTimeout(() => {
        const n = running.stopAll('drain');
        if (n > 0) log.info({ episodes: n }, 'drain timeout: handing running episodes back to the queue');
      }, drainTimeoutMs);
      await step('episodes worker', () => episodes.close());
      clearTimeout(timer);
      admission.stop();
      // Counted before the connections go: an episode still here could not be handed back.
      const notHandedBack = running.size;
      // The pool's warm sandboxes go with the worker (none is claimed any more).
      await step('sandbox pool', () => pool.drain());
      await step('runtime warm-up', () => warmUp);
      await step('checkpoint sink', () => checkpointSink.close());
      prepareStop.abort();
      await step('workers', () => Promise.all([cleanup.close(), checkpoints.close(), batches.close(), envPrune.stop(), prepare?.close()]));
      stopOutbox();
      await step('lease', () => Promise.all([lease.stop(), hostFacts.stop()]));
      await step('queues', () => Promise.all([cleanupQueue.close(), checkpointsQueue.close(), episodesQueue?.close()]));
      await step('connections', () => Promise.all([subscriber, connection].map((c) => c.quit().catch(() => c.disconnect()))));
      if (cutShort.length > 0) {
        // Cut what is left: no reconnecting, no queued commands keeping the process alive.
        for (const w of [episodes, cleanup, checkpoints, batches, ...(prepare ? [prepare] : [])]) void w.close(true).catch(() => undefined);
        subscriber.disconnect();
        connection.disconnect();
        log.warn({ workerId, cutShort, notHandedBack, outages: outages.outages() }, 'close deadline passed: connections cut');
      }
      log.info({ workerId }, 'worker stopped');
      return { clean: cutShort.length === 0, notHandedBack, cutShort };
    },
  };
}

// What one episode attempt is given (its job, its signal, the worker's clients and stores), what its
// phases return to the next one (set-up's makings, a grade), and the trail close reads whatever threw.
import type Docker from 'dockerode';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { EpisodeJob, EpisodeResult } from './episode-job.ts';
import type { AgentRun } from '../agent/agent.ts';
import type { Deadline } from '../deadlines/deadline.ts';
import type { CheckpointSink } from '../checkpoints/checkpoint-sink.ts';
import type { CheckpointStorage } from '../checkpoints/checkpoint-storage.ts';
import type { EvidencePublisher } from '../evidence/publish-evidence.ts';
import type { FleetError } from '../errors/fleet-error.ts';
import type { StopReason } from '../errors/episode-stop.ts';
import type { EvidenceStore } from '../evidence/evidence-store.ts';
import type { ExtractLimits, ExtractReport } from '../evidence/safe-extract.ts';
import type { EndpointLimiter } from '../model/endpoint-limiter.ts';
import type { FleetLimits } from '../model/fleet-limits.ts';
import { DEFAULT_ENDPOINT, type ModelEndpoint } from '../config/model-endpoints.ts';
import type { ModelProxy } from '../model/model-proxy.ts';
import type { PolicyStamper } from '../model/policy-versions.ts';
import type { RuntimeGeneration } from '../runtime/prepare-runtime.ts';
import type { SandboxPool, TaskLookahead } from '../sandbox/sandbox-pool.ts';
import type { ExecResult, SandboxSession } from '../sandbox/sandbox-session.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import type { EnvironmentLease } from '../sandbox/environment-lease.ts';
import type { ServiceNetwork } from '../sandbox/task-services.ts';
import type { EpisodeControl } from './episode-control.ts';
import type { EpisodePhase } from './running-episodes.ts';
import type { TaskImage } from '../environments/task-environment.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import type { SandboxRuntime } from '../sandbox/sandbox-runtime.ts';
import type { NetworkSettings } from '../egress/network-grant.ts';
import type { BesideProcess } from '../sandbox/end-of-turn/end-of-turn.ts';

export interface EpisodeDeps {
  docker: Docker;
  redis: Redis;
  prefix: string;
  log: Logger;
  workerId: string;
  evidence: EvidenceStore;
  control: EpisodeControl;
  /** Deadline of each Docker API call (a phase's deadline may cut it shorter). */
  callTimeoutMs: number;
  outputCapBytes: number;
  /** Caps of the workspace snapshot kept as evidence. */
  snapshotLimits: ExtractLimits;
  /** Hand a sandbox to the cleanup queue. */
  scheduleCleanup(episodeId: string, containerId: string, environment?: string): Promise<void>;
  /** The runtime generation every sandbox mounts read-only (installed once per engine, then warm). */
  prepareRuntime(signal: AbortSignal): Promise<RuntimeGeneration>;
  /** Holds per-episode folders (the model proxy's socket), bind-mounted at the same path. */
  dataDir: string;
  /** The model endpoints behind the episodes' proxies; unset (or lacking a batch's), agents that need one fail (kind model). */
  model: WorkerModels | undefined;
  /** Where the agent's checkpoints go (never awaited by the agent) and where a retry finds the latest. */
  checkpoints: { sink: CheckpointSink; store: CheckpointStorage };
  /** Copies each attempt's evidence into the artifact store every host reads. */
  publisher: EvidencePublisher;
  /** Warm sandboxes set-up claims before creating one. @default none */
  pool?: SandboxPool;
  /** Which tasks wait in the queue: the pool seeds sandboxes with the workspace of those coming again. @default none: no seeded sandboxes */
  upcoming?: TaskLookahead | undefined;
  /** The engine's runtime every sandbox runs under (FLEET_SANDBOX_RUNTIME). @default the engine's default */
  sandboxRuntime?: SandboxRuntime | undefined;
  /** Stamps every model call with its endpoint's policy version (src/model/policy-versions.ts). @default none: calls are not stamped */
  policy?: PolicyStamper | undefined;
  /** The network ceiling of every phase and the egress proxy's name overrides. @default DEFAULT_NETWORK (src/egress/network-grant.ts) */
  network?: NetworkSettings | undefined;
  /** FLEET_REGISTRY: environments built once for the fleet and pulled by the other hosts. @default none: each engine builds its own */
  registry?: string | undefined;
}

/** The worker's model settings as given to startWorker: its endpoints, and what every episode's proxy shares. */
export interface ModelSettings {
  /** The `default` endpoint's base URL (MODEL_BASE_URL); unset when the worker has only the table's endpoints. */
  baseUrl?: string | undefined;
  /** The `default` endpoint's key. */
  apiKey?: string | undefined;
  /** Forces the model name of every request to the `default` endpoint (MODEL_NAME). */
  name?: string | undefined;
  /** The `default` endpoint's fleet-wide limits (MODEL_MAX_CONCURRENT, MODEL_REQUESTS_PER_MINUTE, MODEL_TOKENS_PER_MINUTE). */
  limits?: FleetLimits;
  /** The endpoints of the table (FLEET_MODEL_ENDPOINTS), beside the `default` one of baseUrl. */
  endpoints?: readonly ModelEndpoint[];
  maxCalls: number;
  maxTokens: number;
  requestTimeoutMs: number;
  upstreamRetries: number;
}

/** An endpoint as the episodes of a worker use it: with its fleet-wide limiter (state in Redis). */
export interface WorkerEndpoint extends ModelEndpoint {
  limiter: EndpointLimiter;
}

/** The worker's endpoints by name, and the budgets every episode's proxy gets. */
export interface WorkerModels {
  endpoints: ReadonlyMap<string, WorkerEndpoint>;
  maxCalls: number;
  maxTokens: number;
  requestTimeoutMs: number;
  upstreamRetries: number;
}

/** Every endpoint of `settings`: the `default` one of baseUrl first, then the table's. */
export function settingsEndpoints(settings: ModelSettings): ModelEndpoint[] {
  return [
    ...(settings.baseUrl !== undefined
      ? [{ name: DEFAULT_ENDPOINT, baseUrl: settings.baseUrl, apiKey: settings.apiKey, model: settings.name, limits: settings.limits ?? {} }]
      : []),
    ...(settings.endpoints ?? []),
  ];
}

export interface EpisodeAttempt {
  job: EpisodeJob;
  /** 1-based: how many times this episode was started, this time included. */
  attempt: number;
  /** Aborted with an EpisodeStop to cancel the episode or hand it back (drain). */
  signal: AbortSignal;
  /** The set-up phase's deadline, started by the caller at pick-up; the caller disposes it. */
  setUp: Deadline;
  /** Told when the attempt enters a phase (set-up is from pick-up; build while it waits for its image, then set-up again). */
  onPhase?: (phase: EpisodePhase) => void;
  /** Told when a model call was refused as past the batch's maxStaleness: the caller stops the attempt (stop reason stale). */
  onStale?: () => void;
}

export interface EpisodeOutcome {
  result: EpisodeResult;
  /** The failure may go away on another attempt (infrastructure, model). */
  retry: boolean;
  /** The worker is draining: the episode goes back to the queue, this attempt records no result. */
  handBack: boolean;
  /** The episode grew staler than its batch's maxStaleness: it restarts from scratch (within its bound), this attempt records no result. */
  staleRestart?: boolean;
  error?: FleetError;
}

/** What set-up made: the sandbox's session (its lease ends it), and what the later phases use. */
export interface SetUpResult {
  archive: TaskArchive;
  runtime: RuntimeGeneration;
  session: SandboxSession;
  /** The episode's model proxy, when its agent uses a model. */
  proxy: ModelProxy | undefined;
  /** The image the sandbox runs, as the engine named it (provenance). */
  imageId: string | undefined;
  /** Where the image came from (a Harbor task's may have been built for it). */
  image: TaskImage;
  /** A separate verifier's image (Harbor's separate mode), ready before the agent starts. */
  verifierImage: TaskImage | undefined;
  /** The task services the sandbox joined (their namespace and sidecars), when the task has any. */
  services: ServiceNetwork | undefined;
  /** The host folder bind-mounted into the sandbox when a phase has network: the egress proxy's socket goes there. */
  runFolder?: string | undefined;
  /** The job's task with what the image decided filled in: the image run, the workdir (a Harbor task's may be the image's). */
  task: TaskSpec;
  /** The workspace's tar when it is not in the sandbox yet: the agent's exec takes it in (AgentContext.workspaceIn). */
  workspaceIn?: Buffer | undefined;
}

/**
 * What close must see whatever phase threw, and results that arrive after their phase ended: one per
 * attempt, created by runEpisode; each part is written by the phase that makes it (or by runEpisode
 * from what a phase returned). The sandbox, its container id (from the moment it exists), its run
 * folder and whether it was pooled are the lease's.
 */
export interface AttemptTrail {
  /** The one owner of the sandbox's end. */
  lease: EnvironmentLease;
  /** Set-up's makings as each exists, so close closes the proxy and diffs against the archive even after a failed set-up. */
  setUp: Partial<Omit<SetUpResult, 'session'>>;
  /** Checkpoint snapshots still being read from the sandbox; close waits for them. */
  snapshots: Set<Promise<void>>;
  /** The agent's run: returned, or left by a crashed or over-limit agent, or arrived after its phase ended. */
  agentRun: AgentRun | undefined;
  /** The verifier's run: returned, or arrived after the verification reserve. */
  verifyRun: ExecResult | undefined;
  /** The workspace as the agent left it, copied by the sweep that stopped its processes, being kept as evidence. */
  workspaceCopy: Promise<ExtractReport | undefined> | undefined;
  /** A Harbor task's shared grading: whether the agent's processes ran on beside the grader, and which did. */
  grading?: { agentProcesses: 'kept' | 'stopped'; beside?: { processes: BesideProcess[]; more: number } } | undefined;
  /** A reward-file task's /logs as the verifier left it, copied by the end-of-turn exec, being kept as evidence. */
  logsCopy?: Promise<ExtractReport | undefined> | undefined;
  /** The checkpoint this attempt resumed from. */
  resumedFrom: number | undefined;
  /** Each phase's time, as far as the attempt got. */
  timings: EpisodeResult['timings'];
}

/** How set-up, agent and verification ended, before close. */
export type Graded = { status: EpisodeResult['status']; reward: number | null; metrics?: Record<string, number>; error?: FleetError; stop?: StopReason };

export const msSince = (t: number) => Math.round(performance.now() - t);

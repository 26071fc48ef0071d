// What one episode attempt is given (its job, its signal, the worker's clients and stores) and what
// its phases leave behind for the next phase and for close.
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
import type { ModelProxy } from '../model/model-proxy.ts';
import type { RuntimeGeneration } from '../runtime/prepare-runtime.ts';
import type { SandboxPool } from '../sandbox/sandbox-pool.ts';
import type { ExecResult, SandboxSession } from '../sandbox/sandbox-session.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import type { EpisodeControl } from './episode-control.ts';

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
  scheduleCleanup(episodeId: string, containerId: string): Promise<void>;
  /** The runtime generation every sandbox mounts read-only (installed once per engine, then warm). */
  prepareRuntime(signal: AbortSignal): Promise<RuntimeGeneration>;
  /** Holds per-episode folders (the model proxy's socket), bind-mounted at the same path. */
  dataDir: string;
  /** The model endpoint behind every episode's proxy; unset, agents that need a model fail (kind model). */
  model: ModelSettings | undefined;
  /** Where the agent's checkpoints go (never awaited by the agent) and where a retry finds the latest. */
  checkpoints: { sink: CheckpointSink; store: CheckpointStorage };
  /** Copies each attempt's evidence into the artifact store every host reads. */
  publisher: EvidencePublisher;
  /** Warm sandboxes set-up claims before creating one. @default none */
  pool?: SandboxPool;
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
  /** The endpoint's fleet-wide limits (MODEL_MAX_CONCURRENT, MODEL_REQUESTS_PER_MINUTE, MODEL_TOKENS_PER_MINUTE). */
  limits?: FleetLimits;
  /** Enforces `limits`, shared by every episode of the worker (and, through Redis, of the fleet). */
  limiter?: EndpointLimiter;
}

export interface EpisodeAttempt {
  job: EpisodeJob;
  /** 1-based: how many times this episode was started, this time included. */
  attempt: number;
  /** Aborted with an EpisodeStop to cancel the episode or hand it back (drain). */
  signal: AbortSignal;
  /** The set-up phase's deadline, started by the caller at pick-up; the caller disposes it. */
  setUp: Deadline;
  /** Told when the attempt enters the agent, verify and close phases (set-up is from pick-up). */
  onPhase?: (phase: 'agent' | 'verify' | 'close') => void;
}

export interface EpisodeOutcome {
  result: EpisodeResult;
  /** The failure may go away on another attempt (infrastructure, model). */
  retry: boolean;
  /** The worker is draining: the episode goes back to the queue, this attempt records no result. */
  handBack: boolean;
  error?: FleetError;
}

/** What the phases of one attempt opened and measured; close reads it to keep evidence and clean up. */
export interface AttemptState {
  /** Checkpoint snapshots still being read from the sandbox; close waits for them. */
  snapshots: Set<Promise<void>>;
  /** The checkpoint this attempt resumed from. */
  resumedFrom?: number;
  archive?: TaskArchive;
  runtime?: RuntimeGeneration;
  proxy?: ModelProxy;
  containerId?: string;
  session?: SandboxSession;
  /** The sandbox was a warm one claimed from the worker's pool. */
  pooled?: boolean;
  /** The host folder bind-mounted into the sandbox (the model proxy's socket is there); close removes it. */
  runFolder?: string;
  agentRun?: AgentRun;
  verifyRun?: ExecResult;
  /** The workspace as the agent left it, copied by the sweep that stopped its processes, being kept as evidence. */
  workspaceCopy?: Promise<ExtractReport | undefined>;
  imageId?: string;
  timings: EpisodeResult['timings'];
}

/** How set-up, agent and verification ended, before close. */
export type Graded = { status: EpisodeResult['status']; reward: number | null; error?: FleetError; stop?: StopReason };

export const msSince = (t: number) => Math.round(performance.now() - t);

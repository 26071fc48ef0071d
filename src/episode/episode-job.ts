// The `episodes` queue: one job per episode, job id = episode id (so enqueueing the same batch twice
// adds nothing). Payload and result schemas, and the default job options.
import type { JobsOptions } from 'bullmq';
import { z } from 'zod';
import { EpisodeId } from '../ids/episode-id.ts';
import { FAILURE_KINDS } from '../errors/failure-kind.ts';
import { MAX_RETRIES_PER_KIND } from '../errors/retry-budgets.ts';
import { AgentSpec, ModelOptions } from '../tasks/agent-spec.ts';
import { AgentProcesses, MaxStaleRestarts, MaxStaleness, PassThreshold } from '../tasks/batch-spec.ts';
import { PolicyVersionsSeen } from '../model/policy-versions.ts';
import { TaskSpec } from '../tasks/task-spec.ts';

export const EPISODES_QUEUE = 'episodes';

const id = EpisodeId;

export const EpisodeJob = z.strictObject({
  episodeId: id,
  batchId: id,
  /** 0-based sample index of this task within the batch. */
  sample: z.number().int().min(0),
  task: TaskSpec,
  /** sha256 of the packed task folder in the task store: what exactly this episode ran. */
  taskDigest: z.string().regex(/^[0-9a-f]{64}$/, 'a sha256 in hex'),
  agent: AgentSpec,
  /** The batch's model options: endpoint, model name, sampling, enforce, token capture. */
  model: ModelOptions.optional(),
  /** The batch's pass threshold: a reward at or above it passes. Unset (jobs of batches without one): 1. */
  passThreshold: PassThreshold.optional(),
  /** The batch's maxStaleness: policy versions an episode may span between its first call and its last. Unset: no limit. */
  maxStaleness: MaxStaleness.optional(),
  /** The batch's maxStaleRestarts. Unset: DEFAULT_MAX_STALE_RESTARTS. */
  maxStaleRestarts: MaxStaleRestarts.optional(),
  /** The batch's agentProcesses (Harbor tasks, shared verifier). Unset: DEFAULT_AGENT_PROCESSES. */
  agentProcesses: AgentProcesses.optional(),
  enqueuedAt: z.iso.datetime(),
});
export type EpisodeJob = z.infer<typeof EpisodeJob>;

export const EpisodeStatus = z.enum(['passed', 'failed', 'timeout', 'cancelled', 'error']);
export type EpisodeStatus = z.infer<typeof EpisodeStatus>;

const Captured = z.object({ exitCode: z.number().int().nullable(), timedOut: z.boolean(), durationMs: z.number() });

export const EpisodeResult = z.object({
  episodeId: z.string(),
  batchId: z.string(),
  taskId: z.string(),
  sample: z.number().int(),
  status: EpisodeStatus,
  /** Set when status is error: which kind of failure, with its stable code and message. */
  error: z.object({ kind: z.enum(FAILURE_KINDS), code: z.string(), message: z.string() }).optional(),
  /**
   * The verifier's reward: 1 or 0 from its exit code (the fleet's own tasks by default), any float from
   * a reward file (Harbor tasks, and ours with `verify.reward: file`); null when the episode was not graded.
   * Status passed means reward >= the batch's passThreshold (1 unless set).
   */
  reward: z.number().nullable(),
  /** Every number of the verifier's reward.json by its key (reward.txt gives { reward }); unset for exit-code grading. */
  metrics: z.record(z.string(), z.number()).optional(),
  /** Attempts this episode took, the last included. */
  attempts: z.number().int().min(1),
  workerId: z.string(),
  timings: z.object({
    setupMs: z.number().optional(),
    agentMs: z.number().optional(),
    verifyMs: z.number().optional(),
    closeMs: z.number().optional(),
    totalMs: z.number(),
  }),
  provenance: z.object({
    taskDigest: z.string(),
    image: z.string(),
    imageId: z.string().optional(),
    agent: AgentSpec,
    /** A Harbor task's environment: built by the fleet from environment/ (its content digest), or its docker_image. */
    environment: z.object({ source: z.enum(['built', 'docker_image']), digest: z.string().optional() }).optional(),
    /** The engine's runtime the sandbox ran under (FLEET_SANDBOX_RUNTIME, e.g. runsc); absent: the engine's default. */
    sandboxRuntime: z.string().optional(),
  }),
  /** The network each phase of a Harbor task asked for, and what the fleet applied (capped by the operator). */
  network: z.object({
    agent: z.object({ requested: z.string(), applied: z.string(), allowedHosts: z.array(z.string()).optional() }),
    verifier: z.object({ requested: z.string(), applied: z.string(), allowedHosts: z.array(z.string()).optional() }),
  }).optional(),
  /**
   * A Harbor task graded in the agent's container: whether the agent's processes ran on beside the
   * grader (`kept`, the batch's agentProcesses: keep) or were stopped by a restart, and how many
   * processes ran beside it (evidence.json lists them).
   */
  grading: z.object({ agentProcesses: z.enum(['kept', 'stopped']), beside: z.number().int().min(0).optional() }).optional(),
  agent: Captured.optional(),
  verifier: Captured.optional(),
  /** The runtime generation the sandbox mounted, whether it was already installed, and preparation time. */
  runtime: z.object({ generationId: z.string(), warm: z.boolean(), prepareMs: z.number() }).optional(),
  /**
   * The attempt's sandbox: its container, whether it was a warm one claimed from the worker's pool, and
   * (only when true) whether that one was seeded with the task's workspace before the claim.
   */
  sandbox: z.object({ containerId: z.string(), pooled: z.boolean(), seeded: z.literal(true).optional() }).optional(),
  /** The checkpoint (seq) this attempt resumed from, when an earlier attempt left one. */
  resumedFrom: z.number().int().optional(),
  /**
   * Model tokens the agent used: the llm agent's own count (earlier attempts included), any other
   * agent's as its episode's model proxy counted them (this attempt's calls). Absent without a proxy.
   */
  usage: z.object({ promptTokens: z.number(), completionTokens: z.number(), totalTokens: z.number() }).optional(),
  /** The model endpoint (its name in the workers' table) and model name the episode played; absent when it used none. */
  model: z.object({ endpoint: z.string(), name: z.string().optional() }).optional(),
  /** The kernel killed the sandbox for exceeding its memory limit. */
  oomKilled: z.boolean().optional(),
  /** The endpoint's policy versions the model calls of the result's conversation were stamped with (absent: none was set). */
  policyVersions: PolicyVersionsSeen.optional(),
  /** Times the episode was restarted from scratch for growing staler than its batch's maxStaleness (absent: never). */
  staleRestarts: z.number().int().min(1).optional(),
  startedAt: z.string(),
  endedAt: z.string(),
});
export type EpisodeResult = z.infer<typeof EpisodeResult>;

/** Backoff of retried episodes: 2 s, 4 s, 8 s ... at most a minute. */
export function episodeBackoffMs(attemptsMade: number): number {
  return Math.min(60_000, 2_000 * 2 ** Math.max(0, attemptsMade - 1));
}

/**
 * Retryable failures back off exponentially; BullMQ's attempts is only the ceiling, the processor
 * applies the budget of each kind. Finished jobs are kept 7 days: while a job is kept, enqueueing its
 * batch again adds nothing.
 */
export const episodeJobOptions = {
  attempts: 1 + MAX_RETRIES_PER_KIND * 2,
  backoff: { type: 'custom' },
  removeOnComplete: { age: 7 * 24 * 3600 },
  removeOnFail: { age: 7 * 24 * 3600 },
} as const satisfies JobsOptions;

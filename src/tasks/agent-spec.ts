// Which agent runs an episode. The oracle applies the task's solution/ (to validate tasks, as Harbor
// and Terminal-Bench do); the command agent runs one shell command; the llm agent is the reference
// tool-calling agent, talking to a model through the episode's model proxy.
import { z } from 'zod';

/**
 * A command is one argument of `sh -c`, and Linux caps one argument at 128 KiB (MAX_ARG_STRLEN): the
 * same cap as task-spec.ts's MAX_COMMAND_BYTES (spelled twice because both files must stay leaves
 * for the queue contracts; test/unit/task-limits.test.ts checks they agree).
 */
export const MAX_AGENT_COMMAND_BYTES = 64 * 1024;

export const OracleAgentSpec = z.strictObject({ kind: z.literal('oracle') });
export const CommandAgentSpec = z.strictObject({
  kind: z.literal('command'),
  /** Run with sh -c in the task's workdir, as the sandbox user. */
  command: z
    .string()
    .min(1)
    .superRefine((c, ctx) => {
      const bytes = Buffer.byteLength(c);
      if (bytes > MAX_AGENT_COMMAND_BYTES) ctx.addIssue({ code: 'custom', message: `at most ${MAX_AGENT_COMMAND_BYTES} bytes (got ${bytes} bytes)` });
    }),
  /**
   * Give the command a model at OPENAI_BASE_URL (through the episode's model proxy). true: the worker
   * must have a model endpoint (MODEL_BASE_URL); false: never. @default whether the worker has one
   */
  model: z.boolean().optional(),
});

/** The reference LLM agent: a tool-calling loop in the sandbox, talking to the model through the proxy. */
export const LlmAgentSpec = z.strictObject({
  kind: z.literal('llm'),
  /** Model name sent in requests (the batch's `model.name`, else its endpoint's model or MODEL_NAME, wins). @default "default" */
  model: z.string().min(1).default('default'),
  /** @default 30 */
  maxTurns: z.number().int().min(1).max(1_000).default(30),
  /** The agent never sends a prompt whose estimated tokens plus the output reserve exceed this. @default 32768 */
  contextWindowTokens: z.number().int().min(256).default(32_768),
  /** max_tokens of every call, reserved inside the window. @default 2048 */
  outputReserveTokens: z.number().int().min(16).default(2_048),
  /** Per-call timeout of the bash tool. @default 60 */
  bashTimeoutSec: z.number().positive().max(3_600).default(60),
}).superRefine((spec, ctx) => {
  // A window the output reserve fills leaves no room for a prompt: the agent could never call the model.
  if (spec.outputReserveTokens >= spec.contextWindowTokens) {
    ctx.addIssue({
      code: 'custom',
      path: ['outputReserveTokens'],
      message: `must be less than contextWindowTokens (${spec.contextWindowTokens}), which must also hold the prompt`,
    });
  }
});
export type LlmAgentSpec = z.infer<typeof LlmAgentSpec>;

/**
 * An endpoint's name as a batch names it (the worker's table, FLEET_MODEL_ENDPOINTS): the same rule as
 * src/config/model-endpoints.ts's EndpointName (spelled twice: this file is a leaf of the queue contracts).
 */
export const BatchEndpointName = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'an endpoint name: letters, digits, ., - and _ (at most 64, not starting with . - or _)');

const finite = z.number().refine(Number.isFinite, 'a finite number');

/**
 * Sampling parameters of a batch's model calls, in the OpenAI (and vLLM) request's own names. The
 * proxy fills each into a call that omits it; with `enforce`, it overwrites what the agent sent.
 */
export const SamplingOptions = z.strictObject({
  temperature: finite.min(0).max(2).optional(),
  top_p: finite.gt(0).max(1).optional(),
  top_k: z.number().int().min(-1).optional(),
  min_p: finite.min(0).max(1).optional(),
  max_tokens: z.number().int().positive().optional(),
  max_completion_tokens: z.number().int().positive().optional(),
  seed: z.number().int().optional(),
  stop: z.union([z.string(), z.array(z.string()).max(16)]).optional(),
  presence_penalty: finite.min(-2).max(2).optional(),
  frequency_penalty: finite.min(-2).max(2).optional(),
  repetition_penalty: finite.gt(0).optional(),
  logprobs: z.boolean().optional(),
  top_logprobs: z.number().int().min(0).max(20).optional(),
});
export type SamplingOptions = z.infer<typeof SamplingOptions>;

/** What a batch asks of its episodes' model calls. */
export const ModelOptions = z.strictObject({
  /** Which endpoint of the workers' table the batch plays (FLEET_MODEL_ENDPOINTS). @default "default" */
  endpoint: BatchEndpointName.optional(),
  /**
   * The model's name: told to the sandbox (OPENAI_MODEL), put in calls that name none, and in every
   * call when the endpoint forces its model or the batch says `enforce`. @default the endpoint's model
   */
  name: z.string().min(1).max(256).optional(),
  /** Defaults of every call's sampling parameters (overwriting the agent's with `enforce`). */
  sampling: SamplingOptions.optional(),
  /** true: `sampling` and `name` overwrite what the agent sends (trainers that must control sampling). @default false */
  enforce: z.boolean().optional(),
  /**
   * `tokens`: ask the endpoint for token ids and logprobs (vLLM's request fields) in every chat call,
   * kept per call in the evidence for training. Only for endpoints that accept those fields.
   * @default the endpoint's capture default, else none
   */
  capture: z.enum(['none', 'tokens']).optional(),
});
export type ModelOptions = z.infer<typeof ModelOptions>;

/** Whether an episode of `agent` runs a model proxy, on a worker that has a model endpoint or not. */
export function agentUsesModel(agent: AgentSpec, workerHasModel: boolean): boolean {
  if (agent.kind === 'llm') return true;
  if (agent.kind === 'command') return agent.model ?? workerHasModel;
  return false;
}

export const AgentSpec = z.discriminatedUnion('kind', [OracleAgentSpec, CommandAgentSpec, LlmAgentSpec]);
export type AgentSpec = z.infer<typeof AgentSpec>;

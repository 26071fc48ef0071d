// Which agent runs an episode. The oracle applies the task's solution/ (to validate tasks, as Harbor
// and Terminal-Bench do); the command agent runs one shell command; the llm agent is the reference
// tool-calling agent, talking to a model through the episode's model proxy.
import { z } from 'zod';

export const OracleAgentSpec = z.strictObject({ kind: z.literal('oracle') });
export const CommandAgentSpec = z.strictObject({
  kind: z.literal('command'),
  /** Run with sh -c in the task's workdir, as the sandbox user. */
  command: z.string().min(1),
});

/** The reference LLM agent: a tool-calling loop in the sandbox, talking to the model through the proxy. */
export const LlmAgentSpec = z.strictObject({
  kind: z.literal('llm'),
  /** Model name sent in requests (MODEL_NAME on the worker overrides it). @default "default" */
  model: z.string().min(1).default('default'),
  /** @default 30 */
  maxTurns: z.number().int().min(1).max(1_000).default(30),
  /** The agent never sends a prompt whose estimated tokens plus the output reserve exceed this. @default 32768 */
  contextWindowTokens: z.number().int().min(256).default(32_768),
  /** max_tokens of every call, reserved inside the window. @default 2048 */
  outputReserveTokens: z.number().int().min(16).default(2_048),
  /** Per-call timeout of the bash tool. @default 60 */
  bashTimeoutSec: z.number().positive().max(3_600).default(60),
});
export type LlmAgentSpec = z.infer<typeof LlmAgentSpec>;

export const AgentSpec = z.discriminatedUnion('kind', [OracleAgentSpec, CommandAgentSpec, LlmAgentSpec]);
export type AgentSpec = z.infer<typeof AgentSpec>;

// What the worker hands the reference agent: written as JSON into the sandbox before the agent starts.
// Holds no secret: the model is reached through the proxy's socket, which adds the key outside.
import { z } from 'zod';

export const AGENT_INPUT_PATH = '/tmp/rollout-agent/input.json';

export const AgentInput = z.object({
  instruction: z.string(),
  workdir: z.string(),
  /** The model proxy's Unix socket, bind-mounted at the same path inside and out. */
  modelSocket: z.string(),
  model: z.string(),
  maxTurns: z.number().int().positive(),
  /** Prompt plus reserved output never exceed this (tokens, estimated at 4 characters each). */
  contextWindowTokens: z.number().int().positive(),
  /** Output tokens reserved (sent as max_tokens) for every call. */
  outputReserveTokens: z.number().int().positive(),
  bashTimeoutSec: z.number().positive(),
  /** Resume: the conversation and counters of the latest durable checkpoint. */
  resume: z
    .object({ turn: z.number().int(), messages: z.array(z.unknown()), usage: z.object({ promptTokens: z.number(), completionTokens: z.number(), totalTokens: z.number() }), agentMs: z.number() })
    .optional(),
});
export type AgentInput = z.infer<typeof AgentInput>;

// Which agent runs an episode. The oracle applies the task's solution/ (to validate tasks, as Harbor
// and Terminal-Bench do); the command agent runs one shell command. The LLM agent joins this union.
import { z } from 'zod';

export const OracleAgentSpec = z.strictObject({ kind: z.literal('oracle') });
export const CommandAgentSpec = z.strictObject({
  kind: z.literal('command'),
  /** Run with sh -c in the task's workdir, as the sandbox user. */
  command: z.string().min(1),
});

export const AgentSpec = z.discriminatedUnion('kind', [OracleAgentSpec, CommandAgentSpec]);
export type AgentSpec = z.infer<typeof AgentSpec>;

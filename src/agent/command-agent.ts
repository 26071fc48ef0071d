// Runs one shell command in the sandbox as the agent: handy for baselines, smoke tests, tasks whose
// "agent" is a script, and agents people bring (a Python loop, a coding CLI). When the episode has a
// model proxy, the model forwarder is started beside it first: any OpenAI-compatible client inside
// finds the model at OPENAI_BASE_URL (a loopback address) with a placeholder key; the real key stays outside.
import { shellQuote } from '../files/shell-quote.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import type { Agent, AgentContext, AgentRun } from './agent-context.ts';
import { MODEL_FORWARDER_PATH } from './sandbox-programs.ts';

/** The loopback port of the model inside every sandbox (each sandbox has its own network namespace). */
export const SANDBOX_MODEL_PORT = 8377;
/** The model forwarder gets this long to listen (node's start on a loaded host). */
const FORWARDER_READY_MS = 15_000;

/** What OPENAI_API_KEY holds inside a sandbox: clients insist on one; it opens nothing. */
export const SANDBOX_API_KEY = 'sk-rollout-fleet-placeholder';

/** What every shell agent sees in its environment: the instruction, never a secret. */
export function agentEnv(task: TaskSpec): Record<string, string> {
  return { TASK_ID: task.id, TASK_INSTRUCTION: task.instruction };
}

/**
 * The model's address (and name, when the episode has one) as OpenAI-compatible clients read them from
 * the environment: OPENAI_MODEL (qwen-code, the OpenAI Agents SDK's examples, many scripts) and
 * OPENAI_MODEL_NAME (litellm-style and others) both hold the name.
 */
export function modelEnv(port = SANDBOX_MODEL_PORT, modelName?: string): Record<string, string> {
  return {
    OPENAI_BASE_URL: `http://127.0.0.1:${port}/v1`,
    OPENAI_API_KEY: SANDBOX_API_KEY,
    ...(modelName !== undefined && { OPENAI_MODEL: modelName, OPENAI_MODEL_NAME: modelName }),
  };
}

export class CommandAgent implements Agent {
  constructor(private readonly command: string) {}

  async run(ctx: AgentContext): Promise<AgentRun> {
    const { modelSocket, runtimeMountPath } = ctx;
    const gateway = modelSocket !== undefined && runtimeMountPath !== undefined;
    if (gateway) {
      // Ready before the agent starts, so its first call finds the port open.
      await ctx.session.startBackground(
        `exec ${runtimeMountPath}/bin/node ${runtimeMountPath}/${MODEL_FORWARDER_PATH} ${shellQuote(modelSocket)} ${SANDBOX_MODEL_PORT}`,
        { timeoutMs: FORWARDER_READY_MS, signal: ctx.signal },
      );
    }
    return ctx.session.exec(this.command, {
      timeoutMs: ctx.ceilingMs,
      capBytes: ctx.outputCapBytes,
      env: { ...agentEnv(ctx.task), ...(gateway && modelEnv(SANDBOX_MODEL_PORT, ctx.modelName)), ...ctx.networkEnv },
      signal: ctx.signal,
    });
  }
}

// Runs one shell command in the sandbox as the agent: handy for baselines, smoke tests, tasks whose
// "agent" is a script, and agents people bring (a Python loop, a coding CLI). When the episode has a
// model proxy, the model forwarder is started beside it first: any OpenAI-compatible client inside
// finds the model at OPENAI_BASE_URL (a loopback address) with a placeholder key; the real key stays outside.
import { randomBytes } from 'node:crypto';
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
    const opts = {
      timeoutMs: ctx.ceilingMs,
      capBytes: ctx.outputCapBytes,
      env: { ...agentEnv(ctx.task), ...(gateway && modelEnv(SANDBOX_MODEL_PORT, ctx.modelName)), ...ctx.networkEnv },
      signal: ctx.signal,
    };
    const workspace = ctx.workspaceIn;
    if (workspace === undefined) return ctx.session.exec(this.command, opts);
    // The workspace comes in on the agent's own exec: nothing of the agent's has run in this sandbox
    // yet, so the image's own tar is as good as the engine's (its modes kept, as the sandbox user).
    const unpacked = await ctx.session.exec(unpackThenRun(workspace.length, this.command, NOT_UNPACKED), { ...opts, stdin: workspace });
    if (!(unpacked.exitCode === NOT_UNPACKED_EXIT && unpacked.stderr.text.includes(NOT_UNPACKED))) return unpacked;
    // No tar or head in the image (or it failed): the agent has not run; the engine puts the workspace.
    await ctx.session.putArchive(workspace, '/', ctx.signal);
    return ctx.session.exec(this.command, opts);
  }
}

/** Said on stderr, with the exit code below, when the workspace could not be unpacked: a nonce the agent never sees. */
const NOT_UNPACKED = `rollout-fleet: workspace not unpacked ${randomBytes(8).toString('hex')}`;
const NOT_UNPACKED_EXIT = 125;

/**
 * Unpack exactly `bytes` of stdin (a tar for "/") with the image's head and tar under umask 0, then
 * become `sh -c command` with stdin closed and the umask the exec had; else say NOT_UNPACKED and exit.
 */
export function unpackThenRun(bytes: number, command: string, marker: string): string {
  return [
    'u=$(umask); umask 0',
    `if command -v head >/dev/null && command -v tar >/dev/null && head -c ${bytes} | tar -xf - -C /; then umask "$u"; exec sh -c ${shellQuote(command)} </dev/null; fi`,
    `echo ${shellQuote(marker)} >&2; exit ${NOT_UNPACKED_EXIT}`,
  ].join('\n');
}

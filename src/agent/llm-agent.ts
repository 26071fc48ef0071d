// The worker's side of the reference LLM agent: writes the agent's input into the sandbox, starts the
// bundled agent with the runtime's node, follows its events on stdout, and turns its ending into an
// agent run (finished, out of turns, out of window or budget: graded) or a failure with a kind.
import { tarBuffer } from '../archive/tar-buffer.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { SANDBOX_USER } from '../sandbox/sandbox-session.ts';
import type { LlmAgentSpec } from '../tasks/agent-spec.ts';
import type { Agent, AgentContext, AgentRun } from './agent-context.ts';
import { REFERENCE_AGENT_PATH } from './sandbox-programs.ts';
import { AgentEventParser, type AgentEvent } from './reference/agent-events.ts';
import { AGENT_INPUT_PATH, type AgentInput } from './reference/agent-input.ts';


async function inputTar(input: AgentInput): Promise<Buffer> {
  const common = { uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid, mtime: new Date(0) };
  const dir = AGENT_INPUT_PATH.slice(1, AGENT_INPUT_PATH.lastIndexOf('/'));
  return tarBuffer((pack) => {
    pack.entry({ ...common, name: `${dir}/`, type: 'directory', mode: 0o700 });
    pack.entry({ ...common, name: AGENT_INPUT_PATH.slice(1), mode: 0o600 }, JSON.stringify(input));
  });
}

export class LlmAgent implements Agent {
  constructor(private readonly spec: LlmAgentSpec) {}

  async run(ctx: AgentContext): Promise<AgentRun> {
    const { runtimeMountPath, modelSocket } = ctx;
    if (runtimeMountPath === undefined || modelSocket === undefined) {
      throw new FleetError('unexpected', 'the llm agent needs the runtime generation and a model proxy');
    }
    const input: AgentInput = {
      instruction: ctx.task.instruction,
      workdir: ctx.task.workdir,
      modelSocket,
      // The batch's (or endpoint's) model when one is named; the spec's own otherwise.
      model: ctx.modelName ?? this.spec.model,
      maxTurns: this.spec.maxTurns,
      contextWindowTokens: this.spec.contextWindowTokens,
      outputReserveTokens: this.spec.outputReserveTokens,
      bashTimeoutSec: this.spec.bashTimeoutSec,
      ...(ctx.resume && { resume: ctx.resume }),
    };
    await ctx.session.putArchive(await inputTar(input), '/', ctx.signal);

    let final: Extract<AgentEvent, { type: 'final' }> | undefined;
    let failure: Extract<AgentEvent, { type: 'error' }> | undefined;
    // Tokens of the whole episode: what earlier attempts used (the resumed checkpoint's) plus this one.
    const usage = { ...(ctx.resume?.usage ?? { promptTokens: 0, completionTokens: 0, totalTokens: 0 }) };
    const parser = new AgentEventParser((event) => {
      if (event.type === 'final') final = event;
      else if (event.type === 'error') failure = event;
      else if (event.type === 'model_call') {
        usage.promptTokens += event.usage.promptTokens;
        usage.completionTokens += event.usage.completionTokens;
        usage.totalTokens += event.usage.totalTokens;
      }
      ctx.onEvent?.(event);
    });
    const node = `${runtimeMountPath}/bin/node`;
    const run = await ctx.session.exec(`exec ${node} ${runtimeMountPath}/${REFERENCE_AGENT_PATH} ${AGENT_INPUT_PATH}`, {
      timeoutMs: ctx.ceilingMs,
      capBytes: ctx.outputCapBytes,
      signal: ctx.signal,
      // Its bash tool's commands inherit the phase's network, if it has one.
      ...(ctx.networkEnv && { env: ctx.networkEnv }),
      onStdout: (chunk) => parser.push(chunk),
    });
    const agentRun: AgentRun = { ...run, usage, ...(final && { finalReason: final.reason }) };
    if (run.timedOut || run.aborted) return agentRun;
    // Its output goes with the failure: the evidence keeps the events (the checkpoints it took) of a model failure too.
    if (failure?.kind === 'model') throw Object.assign(new FleetError('model_error', failure.message), { agentRun });
    if (final === undefined || run.exitCode !== 0) {
      const why = failure?.message ?? `exited with ${run.exitCode} without a final event (${parser.dropped} malformed event lines)`;
      throw Object.assign(new FleetError('agent_crashed', `the agent crashed: ${why}`), { agentRun });
    }
    return agentRun;
  }
}

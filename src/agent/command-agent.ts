// Runs one shell command in the sandbox as the agent: handy for baselines, smoke tests and tasks whose
// "agent" is a script.
import type { Agent, AgentContext, AgentRun } from './agent.ts';
import { agentEnv } from './agent.ts';

export class CommandAgent implements Agent {
  constructor(private readonly command: string) {}

  async run(ctx: AgentContext): Promise<AgentRun> {
    return ctx.session.exec(this.command, {
      timeoutMs: ctx.ceilingMs,
      capBytes: ctx.outputCapBytes,
      env: agentEnv(ctx.task),
      signal: ctx.signal,
    });
  }
}

// Runs one shell command in the sandbox as the agent: handy for baselines, smoke tests and tasks whose
// "agent" is a script.
import type { TaskSpec } from '../tasks/task-spec.ts';
import type { Agent, AgentContext, AgentRun } from './agent-context.ts';

/** What every shell agent sees in its environment: the instruction, never a secret. */
export function agentEnv(task: TaskSpec): Record<string, string> {
  return { TASK_ID: task.id, TASK_INSTRUCTION: task.instruction };
}

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

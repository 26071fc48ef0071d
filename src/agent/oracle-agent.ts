// The oracle agent applies the task's reference solution (solution/solve.sh), as Harbor and
// Terminal-Bench do to validate tasks: a task whose oracle does not pass is broken.
import { FleetError } from '../errors/fleet-error.ts';
import { SANDBOX_USER } from '../sandbox/sandbox-session.ts';
import type { Agent, AgentContext, AgentRun } from './agent-context.ts';
import { CommandAgent } from './command-agent.ts';

export const SOLUTION_DIR = '/solution';

export class OracleAgent implements Agent {
  async run(ctx: AgentContext): Promise<AgentRun> {
    if (!ctx.archive.has('solution') || ctx.archive.readText('solution/solve.sh') === undefined) {
      throw new FleetError('invalid_task', `task ${ctx.task.id} has no solution/solve.sh for the oracle agent`);
    }
    const tar = await ctx.archive.partAsTar('solution', SOLUTION_DIR, SANDBOX_USER);
    await ctx.session.putArchive(tar, '/', ctx.signal);
    return new CommandAgent(`sh ${SOLUTION_DIR}/solve.sh`).run(ctx);
  }
}

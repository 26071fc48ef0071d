// The oracle agent applies the task's reference solution (solution/solve.sh), as Harbor and
// Terminal-Bench do to validate tasks: a task whose oracle does not pass is broken.
import { FleetError } from '../errors/fleet-error.ts';
import { SANDBOX_USER } from '../sandbox/sandbox-session.ts';
import type { Agent, AgentContext, AgentRun } from './agent-context.ts';
import { CommandAgent } from './command-agent.ts';

export const SOLUTION_DIR = '/solution';

export class OracleAgent implements Agent {
  async run(ctx: AgentContext): Promise<AgentRun> {
    const harbor = ctx.task.harbor;
    // A step of a multi-step task has its own solution (steps/<name>/solution/), else the task's.
    const own = harbor?.currentStep === undefined ? undefined : `steps/${harbor.currentStep}/solution`;
    const part = own !== undefined && ctx.archive.readText(`${own}/solve.sh`) !== undefined ? own : 'solution';
    if (!ctx.archive.has(part) || ctx.archive.readText(`${part}/solve.sh`) === undefined) {
      throw new FleetError('invalid_task', `task ${ctx.task.id} has no ${part}/solve.sh for the oracle agent`);
    }
    if (harbor) {
      // As Harbor's oracle (H:agents/oracle.py): /solution owned by root, solve.sh made executable,
      // run from the workdir as the agent's user with [solution].env, its output in /logs/agent.
      // (solve.sh executable in the tar itself: no chmod exec.)
      await ctx.session.putArchive(await ctx.archive.partAsTar(part, SOLUTION_DIR, { uid: 0, gid: 0 }, [], ['solve.sh']), '/', ctx.signal);
      return ctx.session.exec(`(${SOLUTION_DIR}/solve.sh) > /logs/agent/oracle.txt 2>&1`, {
        timeoutMs: ctx.ceilingMs,
        capBytes: ctx.outputCapBytes,
        env: { DEBIAN_FRONTEND: 'noninteractive', ...harbor.solutionEnv, ...ctx.networkEnv },
        signal: ctx.signal,
      });
    }
    const tar = await ctx.archive.partAsTar('solution', SOLUTION_DIR, SANDBOX_USER);
    await ctx.session.putArchive(tar, '/', ctx.signal);
    return new CommandAgent(`sh ${SOLUTION_DIR}/solve.sh`).run(ctx);
  }
}

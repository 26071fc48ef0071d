// The verifier's run under the verification reserve, shared by both graders (exit code and Harbor's
// reward files): its own timeout is the verifier's failure, and so is a reserve that ran out while
// it was being stopped past that timeout; a reserve used up by the steps before it is the fleet's.
import { PhaseTimeout, type Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import type { ExecOptions, ExecResult, SandboxSession } from '../sandbox/sandbox-session.ts';
import type { AttemptTrail } from './episode-attempt.ts';

/** Run `command` as the verifier; its run is in `trail.verifyRun` (also one that arrives after the reserve). */
export async function runVerifier(
  session: SandboxSession,
  deadline: Deadline,
  trail: Pick<AttemptTrail, 'verifyRun'>,
  command: string,
  timeoutSec: number,
  opts: Pick<ExecOptions, 'capBytes' | 'env' | 'user'>,
): Promise<ExecResult> {
  const timeoutMs = timeoutSec * 1000;
  const started = performance.now();
  const verifyRun = await deadline.runStoppable('running the verifier', (signal) => session.exec(command, { ...opts, timeoutMs, signal }),
    // Output that arrives after the reserve is still kept as evidence, if close has not written it yet.
    (late) => (trail.verifyRun ??= late)).catch((err: unknown) => {
    // The reserve ran out while the verifier was being stopped past its own timeout: the verifier's
    // fault (not graded, not retried). Had it run less than its timeout, the steps before it took the
    // reserve: the fleet's fault (retried).
    if (err instanceof PhaseTimeout && performance.now() - started >= timeoutMs) {
      throw new FleetError('verifier_timeout', `verifier passed its timeout of ${timeoutSec}s and was still being stopped at the end of the verification reserve`);
    }
    throw err;
  });
  trail.verifyRun = verifyRun;
  // Stopped from outside (cancel, drain) or by the reserve: not graded.
  deadline.signal.throwIfAborted();
  if (verifyRun.timedOut) throw new FleetError('verifier_timeout', `verifier passed its timeout of ${timeoutSec}s`);
  return verifyRun;
}

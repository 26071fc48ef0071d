// The verifier's run under the verification reserve, shared by both graders (exit code and Harbor's
// reward files) and by the end-of-turn exec that runs it after the sweep: its own timeout is the
// verifier's failure, and so is a reserve that ran out while it was being stopped past that timeout;
// a reserve used up by the steps before it is the fleet's.
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
  let started = performance.now();
  return superviseVerifier(deadline, trail, timeoutSec, () => started, (signal) => {
    started = performance.now();
    return session.exec(command, { ...opts, timeoutMs: timeoutSec * 1000, signal });
  }, (run) => run);
}

/**
 * Run `work`, which runs the verifier (from `startedAt()` on, undefined until it starts) and whose
 * result holds its run (`runOf`), under the verification reserve; the run is kept in the trail.
 */
export async function superviseVerifier<T>(
  deadline: Deadline,
  trail: Pick<AttemptTrail, 'verifyRun'>,
  timeoutSec: number,
  startedAt: () => number | undefined,
  work: (signal: AbortSignal) => Promise<T>,
  runOf: (result: T) => ExecResult | undefined,
): Promise<T> {
  const timeoutMs = timeoutSec * 1000;
  const result = await deadline.runStoppable('running the verifier', work,
    // Output that arrives after the reserve is still kept as evidence, if close has not written it yet.
    (late) => (trail.verifyRun ??= runOf(late))).catch((err: unknown) => {
    // The reserve ran out while the verifier was being stopped past its own timeout: the verifier's
    // fault (not graded, not retried). Had it run less than its timeout, the steps before it took the
    // reserve: the fleet's fault (retried).
    const started = startedAt();
    if (err instanceof PhaseTimeout && started !== undefined && performance.now() - started >= timeoutMs) {
      throw new FleetError('verifier_timeout', `verifier passed its timeout of ${timeoutSec}s and was still being stopped at the end of the verification reserve`);
    }
    throw err;
  });
  const verifyRun = runOf(result);
  if (verifyRun !== undefined) trail.verifyRun = verifyRun;
  // Stopped from outside (cancel, drain) or by the reserve: not graded.
  deadline.signal.throwIfAborted();
  if (verifyRun?.timedOut) throw new FleetError('verifier_timeout', `verifier passed its timeout of ${timeoutSec}s`);
  return result;
}

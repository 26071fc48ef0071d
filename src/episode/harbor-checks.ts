// The steps a Harbor task adds to an episode, in its sandbox: the /logs folders Harbor's tasks write
// to (a tar written before the sandbox starts), the task's healthcheck before the agent, and
// /logs/verifier emptied right before the tests (so a reward file the agent planted never counts).
// The others are one exec each, run as root where it must be (the agent's user may not own /logs),
// bounded by its own timeout.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Deadline } from '../deadlines/deadline.ts';
import { tarBuffer } from '../archive/tar-buffer.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { shellQuote } from '../files/shell-quote.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { HarborRun } from '../tasks/task-spec.ts';

/**
 * /logs/{agent,verifier,artifacts}, writable by whoever the agent runs as (Harbor bind-mounts them from
 * its host): a tar of the four folders, root's, mode 777, written into the sandbox before it starts.
 * Folders the image already has keep their files and get this owner and mode.
 */
export const harborLogsTar: () => Promise<Buffer> = (() => {
  let made: Promise<Buffer> | undefined;
  const dir = (name: string) => ({ name, type: 'directory' as const, mode: 0o777, uid: 0, gid: 0, mtime: new Date(0) });
  return () => (made ??= tarBuffer((pack) => {
    for (const name of ['logs', 'logs/agent', 'logs/verifier', 'logs/artifacts']) pack.entry(dir(name));
  }));
})();

/**
 * /logs/verifier emptied and made again, as root, after the agent's processes are gone: whatever the
 * agent left there (a reward file, a link elsewhere in its place) is removed, not followed.
 */
export const HARBOR_VERIFIER_RESET = 'rm -rf /logs/verifier && mkdir -p /logs/verifier && chmod 777 /logs/verifier';

/**
 * /tests removed whole before the task's tests are copied in: a file the agent left there (a
 * conftest.py, a module the checks import) would otherwise sit beside them and run with them.
 */
export const HARBOR_TESTS_RESET = 'rm -rf /tests';

/**
 * One step as root (workdir /), under `deadline`: a non-zero exit is an engine-side failure of the
 * fleet's own step (`docker_error`, retried), named by `what`.
 */
export async function execAsRoot(session: SandboxSession, deadline: Deadline, what: string, command: string): Promise<void> {
  await deadline.run(what, async (signal) => {
    const run = await session.exec(command, { timeoutMs: 30_000, capBytes: 4096, user: '0', workdir: '/', signal });
    if (run.exitCode !== 0) throw new FleetError('docker_error', `${what} failed (exit ${run.exitCode}): ${run.stderr.text.slice(0, 300)}`);
  });
}

/** A command's own time limit inside the sandbox, so that stopping it never stops the sandbox's other processes. */
function bounded(command: string, timeoutSec: number): string {
  return `timeout -k 2 ${Math.max(1, Math.ceil(timeoutSec))} bash -c ${shellQuote(command)}`;
}

/**
 * Harbor's healthcheck (H:environments/base.py): the command is run until it exits 0; failures
 * during the start period do not count; `retries` failures in a row after it end the episode as
 * `healthcheck_failed`, never a reward. Checks run every interval (every start interval during the
 * start period), each bounded by its timeout.
 */
export async function runHealthcheck(session: SandboxSession, check: NonNullable<HarborRun['healthcheck']>, signal: AbortSignal): Promise<void> {
  const started = performance.now();
  let failures = 0;
  let last = '';
  for (;;) {
    const run = await session.exec(bounded(check.command, check.timeoutSec), { timeoutMs: (check.timeoutSec + 5) * 1000, capBytes: 4096, signal });
    if (run.exitCode === 0) return;
    signal.throwIfAborted();
    last = `exit ${run.exitCode}${run.exitCode === 124 ? ' (past its timeout_sec)' : ''}`;
    const inStartPeriod = performance.now() - started < check.startPeriodSec * 1000;
    if (!inStartPeriod && ++failures >= check.retries) {
      throw new FleetError('healthcheck_failed', `the task's [environment.healthcheck] failed ${failures} times in a row (last: ${last}): its environment did not come up`);
    }
    await sleep((inStartPeriod ? check.startIntervalSec : check.intervalSec) * 1000, undefined, { signal });
  }
}

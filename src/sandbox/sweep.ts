// The sweep: one exec that kills every process of the sandbox user until none is left (a fork bomb
// included) and can then copy the workspace out as a tar; the shell script it runs and how its exit
// code, stdout and stderr are read.
import { posix } from 'node:path';
import { shellQuote } from '../files/shell-quote.ts';
import { execIn, type ExecTarget } from './sandbox-exec.ts';
import { SANDBOX_USER } from './sandbox-user.ts';

/**
 * The sweep, in builtins only (a fork would need a pid the agent may have used up): KILL every process
 * the sandbox user may signal (kill -1 spares the caller), then count what is left of the user's that
 * is not a zombie; again while a fork bomb outruns a pass, at most 20 times. Exit 0 once none is left,
 * 3 when they kept coming. With `copy`, once none is left, the workspace as the agent left it goes to
 * stdout as a tar (entries named as getArchive names them), cut at `capBytes` + 1, and what tar could
 * not read to stderr (the sweep itself is quiet); then the sweep runs again, since `tar` and `head` are
 * found in PATH, which an image may let the sandbox user write to (test/integration/sandbox.test.ts).
 */
export function sweepScript(copy?: { dir: string; capBytes: number }): string {
  const lines = sweepLines();
  if (copy !== undefined) {
    const { dir, base } = { dir: posix.dirname(copy.dir), base: posix.basename(copy.dir) };
    lines.push(`{ tar -C ${shellQuote(dir)} -cf - ${shellQuote(base)} || echo 'tar failed' >&2; } 2>&3 | head -c ${copy.capBytes + 1}`, ...SWEEP);
  }
  lines.push('exit 0');
  return lines.join('\n');
}

/**
 * The sweep, then (once none of the sandbox user's processes is left) `exec` of `argv` in its place:
 * no pid more, stderr back. Exit 3, and `argv` never runs, when processes kept coming.
 */
export function sweepThenExec(argv: readonly string[]): string {
  return [...sweepLines(), 'exec 2>&3 3>&-', `exec ${argv.map(shellQuote).join(' ')}`].join('\n');
}

// Quiet: a process that ends between the glob and its read is not an error.
const sweepLines = () => ['exec 3>&2 2>/dev/null', ...SWEEP];

const SWEEP = [
  'i=0',
  'while [ $i -lt 20 ]; do',
  '  kill -KILL -1',
  '  n=0',
  '  for d in /proc/[0-9]*; do',
  '    [ "${d#/proc/}" = "$$" ] && continue',
  '    uid=; st=',
  '    while read -r k v _; do case "$k" in State:) st=$v;; Uid:) uid=$v;; esac; done < "$d/status"',
  `    [ "$uid" = "${SANDBOX_USER.uid}" ] && [ "$st" != "Z" ] && n=$((n+1))`,
  '  done',
  '  [ $n -eq 0 ] && break',
  '  i=$((i+1))',
  'done',
  '[ $n -eq 0 ] || exit 3',
];
/** How long a sweep (and its copy of the workspace) may take before its exec is stopped. */
const SWEEP_TIMEOUT_MS = 5_000;

/**
 * Run the sweep in `target` (see SandboxSession.sweepProcesses): `swept` when the exec ran and exited 0;
 * `tar` only when the copy was asked for, came whole (within `capBytes`, nothing on stderr) and the
 * sweep after it succeeded too.
 */
export async function sweepIn(target: ExecTarget, signal?: AbortSignal, copy?: { dir: string; capBytes: number }): Promise<{ swept: boolean; tar?: Buffer }> {
  const chunks: Buffer[] = [];
  let bytes = 0;
  const usable = copy !== undefined && copy.dir.startsWith('/') && posix.basename(copy.dir) !== '';
  try {
    const run = await execIn(target, sweepScript(usable ? copy : undefined), {
      timeoutMs: SWEEP_TIMEOUT_MS,
      capBytes: 1024,
      workdir: '/',
      ...(signal && { signal }),
      onStdout: (chunk) => {
        bytes += chunk.length;
        if (bytes <= copy!.capBytes) chunks.push(chunk);
      },
    });
    const swept = run.exitCode === 0;
    const whole = usable && swept && !run.timedOut && run.stderr.totalBytes === 0 && bytes > 0 && bytes <= copy.capBytes;
    return { swept, ...(whole && { tar: Buffer.concat(chunks) }) };
  } catch (err) {
    if (signal?.aborted) throw err;
    return { swept: false };
  }
}

// The sweep: the start of one exec that kills every process of the sandbox user until none is left (a
// fork bomb included), in /bin/sh builtins only (a fork would need a pid the agent may have used up):
// KILL every process the sandbox user may signal (kill -1 spares the caller), then count what is left
// of the user's that is not a zombie; again while a fork bomb outruns a pass, at most 20 times. Then the
// exec becomes the program it was given (end-of-turn/end-of-turn.ts), found by its absolute path.
import { shellQuote } from '../files/shell-quote.ts';
import { SANDBOX_USER } from './sandbox-user.ts';

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

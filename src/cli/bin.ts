#!/usr/bin/env node
// The `rollout-fleet` command. package.json's bin is its compiled form, dist/src/cli/bin.js (built by
// `npm ci` and .ci/setup-host.sh); from the sources, tests run `node --import tsx src/cli/bin.ts`.
import { main } from './main.ts';

// A reader that stopped reading (`results <batch> | head -1`) needs nothing more: end quietly, as the
// command would have if all had fitted in the pipe, not with a stack trace.
process.stdout.on('error', (err: NodeJS.ErrnoException) => {
  if (err.code === 'EPIPE') process.exit(0);
  throw err;
});

// A command that returned is done: exit now, so a client it failed to close (a start-up that failed
// half-way, a reconnecting Redis client) cannot keep the process alive. Not before what it printed is
// out, though: a write to a pipe whose reader is behind (a pager, a program that reads as it goes)
// waits in the stream, and exiting dropped it: `results` of 2,000 episodes printed 101 lines into
// `| (sleep 1; wc -l)`.
const code = await main(process.argv.slice(2));
await Promise.all([process.stdout, process.stderr].map((s) => new Promise<void>((resolve) => s.write('', () => resolve()))));
process.exit(code);

#!/usr/bin/env node
// The `rollout-fleet` command. package.json's bin is its compiled form, dist/src/cli/bin.js (built by
// `npm ci` and .ci/setup-host.sh); from the sources, tests run `node --import tsx src/cli/bin.ts`.
import { main } from './main.ts';

// A command that returned is done: exit now, so a client it failed to close (a start-up that failed
// half-way, a reconnecting Redis client) cannot keep the process alive. On Linux, writes to stdout and
// stderr (files, pipes, terminals) are synchronous: nothing printed is lost.
process.exit(await main(process.argv.slice(2)));

#!/usr/bin/env node
// The `rollout-fleet` command. package.json's bin is its compiled form, dist/src/cli/bin.js (built by
// `npm ci` and .ci/setup-host.sh); from the sources, tests run `node --import tsx src/cli/bin.ts`.
import { main } from './main.ts';

process.exitCode = await main(process.argv.slice(2));

#!/usr/bin/env node
// The `rollout-fleet` command: runs the TypeScript sources through tsx, no build step.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('./main.ts');
process.exitCode = await main(process.argv.slice(2));

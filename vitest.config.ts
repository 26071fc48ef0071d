// Three projects. unit: pure logic, no Redis, no Docker, no dist/ (`npm run test:unit`, seconds, every
// core). integration: real Redis, the real engine and the compiled CLI. stress: the heavy and hostile
// files (chaos, the compose stack, full and quota-limited disks, attack corpora, the trainer).
// `npm test` runs all three: unit first, then integration and stress together in one pool of two
// workers, heaviest files first (test/helpers/heaviest-first.ts), so both cores stay busy to the end.
import os from 'node:os';
import { defineConfig } from 'vitest/config';
import { HeaviestFirst } from './test/helpers/heaviest-first.ts';

/** The heavy and hostile files: many containers, second engines, minutes of faults. */
export const STRESS_FILES = [
  'test/integration/chaos.test.ts',
  'test/integration/compose-stack.test.ts',
  'test/integration/disk-full.test.ts',
  'test/integration/disk-quota.test.ts',
  'test/integration/evidence-attacks.test.ts',
  'test/integration/api-hostile.test.ts',
  'test/integration/gateway-hostile.test.ts',
  'test/integration/verify-evasion.test.ts',
  'test/integration/hostile-sandbox.test.ts',
  'test/integration/harbor-hostile.test.ts',
  'test/integration/harbor-kept-attacks.test.ts',
  'test/integration/python-client.test.ts',
  'test/integration/services-hostile.test.ts',
  'test/integration/harbor-services-kill.test.ts',
  'test/integration/prepared-hostile.test.ts',
  'test/integration/infra-retry-hostile.test.ts',
];

/** What the files on services share: dist/ built first, two workers on 2 cores. */
const services = {
  // Tests start the compiled CLI (dist/) as a process: compile it first, incrementally.
  // Then the runtime generations every file's workers share, installed once (test/helpers/shared-runtime.ts).
  globalSetup: ['test/helpers/build-dist.ts', 'test/helpers/shared-runtime.ts'],
  testTimeout: 120_000,
  hookTimeout: 60_000,
  // Each file starts its own redis-server, and all share one Docker engine on 2 cores. Integration and
  // stress share this group (same groupOrder and maxWorkers): one pool, heaviest first.
  maxWorkers: 2,
  sequence: { groupOrder: 1 },
};

export default defineConfig({
  test: {
    pool: 'forks',
    sequence: { sequencer: HeaviestFirst },
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          testTimeout: 120_000,
          maxWorkers: os.availableParallelism(),
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: { name: 'integration', include: ['test/integration/**/*.test.ts'], exclude: STRESS_FILES, ...services },
      },
      {
        extends: true,
        test: { name: 'stress', include: STRESS_FILES, ...services },
      },
    ],
  },
});

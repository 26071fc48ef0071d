import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Tests start the compiled CLI (dist/) as a process: compile it first, incrementally.
    globalSetup: ['test/helpers/build-dist.ts'],
    pool: 'forks',
    testTimeout: 120_000,
    hookTimeout: 60_000,
    // Integration files each start their own redis-server and share one Docker engine on 2 cores.
    maxWorkers: 2,
  },
});

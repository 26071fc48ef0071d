import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    pool: 'forks',
    testTimeout: 120_000,
    hookTimeout: 60_000,
    // Integration files each start their own redis-server and share one Docker engine on 2 cores.
    maxWorkers: 2,
  },
});

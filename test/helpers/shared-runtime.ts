// vitest global set-up, after build-dist: installs the runtime generations the suite's workers use
// into the shared volume scope (test/helpers/fleet.ts sets FLEET_RUNTIME_SCOPE and FLEET_RUNTIME_CACHE),
// before any file starts. Each file has its own Redis, so their install locks cannot keep two files
// from filling one volume at once; installed here first, every file finds it ready and installs nothing.
// Two generations: in-process workers bundle the sandbox programs from src/, spawned ones from dist/.
// Files that test installing, reusing and removing generations (runtime.test.ts) use their own prefix
// and no scope, as production does.
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { sandboxPrograms } from '../../src/agent/sandbox-programs.ts';
import { startPrivateRedis } from '../../src/cli/private-redis.ts';
import { prepareRuntime } from '../../src/runtime/prepare-runtime.ts';
import { defaultRuntimeInputs, type ExtraFile } from '../../src/runtime/runtime-inputs.ts';
import { createDocker } from '../../src/sandbox/docker-client.ts';
import { ROOT, SHARED_RUNTIME_CACHE, SHARED_RUNTIME_SCOPE } from './fleet.ts';

export default async function installSharedRuntime(): Promise<void> {
  const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
  const log = pino({ level: process.env.TEST_LOG_LEVEL ?? 'warn' }, pino.destination(2));
  const distPrograms = (await import(pathToFileURL(path.join(ROOT, 'dist/src/agent/sandbox-programs.js')).href)) as { sandboxPrograms: (dir: string) => Promise<ExtraFile[]> };
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-shared-runtime-'));
  try {
    for (const [name, programs] of [['src', sandboxPrograms], ['dist', distPrograms.sandboxPrograms]] as const) {
      const inputs = await defaultRuntimeInputs(await programs(path.join(dir, name)), { cacheDir: SHARED_RUNTIME_CACHE });
      await prepareRuntime({ docker, redis: client, prefix: 'rfshared', log, volumeScope: SHARED_RUNTIME_SCOPE }, inputs, { timeoutMs: 600_000 });
    }
  } finally {
    await client.quit();
    await redis.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

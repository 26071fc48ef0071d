// A worker-like process for the runtime tests: prepares the full default runtime generation once the
// parent says "go" on stdin (so two of them race), prints the RuntimeGeneration as JSON, and exits.
// Usage: node --import tsx test/helpers/prepare-runtime-child.ts <redis-url> <prefix> [lock-ttl-ms]
import { once } from 'node:events';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { prepareRuntime } from '../../src/runtime/prepare-runtime.ts';
import { defaultRuntimeInputs } from '../../src/runtime/runtime-inputs.ts';
import { createDocker } from '../../src/sandbox/docker-client.ts';

const [redisUrl, prefix, lockTtlMs] = process.argv.slice(2);
if (!redisUrl || !prefix) throw new Error('usage: prepare-runtime-child.ts <redis-url> <prefix>');
const redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
const log = pino({ level: process.env.TEST_LOG_LEVEL ?? 'warn' }, pino.destination(2));
const inputs = await defaultRuntimeInputs();

process.stdout.write('ready\n');
await once(process.stdin, 'data');
try {
  const generation = await prepareRuntime({ docker, redis, prefix, log }, inputs, { pollMs: 20, lockTtlMs: lockTtlMs ? Number(lockTtlMs) : undefined });
  process.stdout.write(`${JSON.stringify(generation)}\n`);
} finally {
  await redis.quit();
}

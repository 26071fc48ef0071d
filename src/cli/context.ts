// The only place that reads the environment and builds clients: config, the root logger, Redis
// connections, the Docker client and queues, handed to the domain code as arguments.
import { FlowProducer, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { pino, type Logger } from 'pino';
import { EPISODES_QUEUE } from '../../queues/episodes/contract.ts';
import { loadConfig, type FleetConfig } from '../config/config.ts';
import { createDocker, dockerStatusOf, type Docker } from '../sandbox/docker-client.ts';

export class UsageError extends Error {
  override readonly name = 'UsageError';
}

export function rootLogger(config: FleetConfig): Logger {
  return pino({ level: config.LOG_LEVEL, base: { pid: process.pid } }, pino.destination(2));
}

export interface Cli {
  config: FleetConfig;
  log: Logger;
  docker: Docker;
}

export function cliContext(env: NodeJS.ProcessEnv = process.env): Cli {
  const config = loadConfig(env);
  return { config, log: rootLogger(config), docker: createDocker(config.DOCKER_HOST) };
}

export function requireRedisUrl(config: FleetConfig): string {
  if (config.REDIS_URL === undefined) throw new UsageError('REDIS_URL is not set (only `rollout-fleet demo` starts a private Redis)');
  return config.REDIS_URL;
}

/** A producer-side connection: fails fast instead of queueing commands while Redis is away. */
export async function connectProducer(url: string, connectionName = 'rf-cli'): Promise<Redis> {
  const redis = new Redis(url, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1, connectionName });
  let lastError: Error | undefined;
  redis.on('error', (err: Error) => (lastError = err));
  try {
    await redis.connect();
  } catch (err) {
    redis.disconnect();
    throw new UsageError(`cannot connect to Redis at ${url}: ${(lastError ?? (err as Error)).message}`);
  }
  return redis;
}

export function episodesQueue(redis: Redis, prefix: string): Queue {
  return new Queue(EPISODES_QUEUE, { connection: redis, prefix });
}

export function flowProducer(redis: Redis, prefix: string): FlowProducer {
  return new FlowProducer({ connection: redis, prefix });
}

/** Whether the engine has an image; undefined when the engine cannot be asked from here. */
export function imageChecker(docker: Docker) {
  return async (image: string): Promise<boolean | undefined> => {
    try {
      await docker.getImage(image).inspect();
      return true;
    } catch (err) {
      return dockerStatusOf(err) === 404 ? false : undefined;
    }
  };
}

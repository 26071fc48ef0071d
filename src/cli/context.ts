// The only place that reads the environment and builds clients: config, the root logger, Redis
// connections and the Docker client (queues: queue-clients.ts), handed to the domain code as
// arguments. It loads neither BullMQ nor dockerode, so `status` and `results` start quickly.
import type { Redis } from 'ioredis';
import { pino, type Logger } from 'pino';
import { loadConfig, type FleetConfig } from '../config/config.ts';
import { connectRedis } from '../client/connect-redis.ts';
import type { Docker } from '../sandbox/docker-client.ts';

export class UsageError extends Error {
  override readonly name = 'UsageError';
}

export function rootLogger(config: FleetConfig): Logger {
  return pino({ level: config.LOG_LEVEL, base: { pid: process.pid } }, pino.destination(2));
}

export interface Cli {
  config: FleetConfig;
  log: Logger;
  /** The Docker client, built on first use: dockerode takes ~0.1 s to load, which `status` need not pay. */
  docker(): Promise<Docker>;
}

export function cliContext(env: NodeJS.ProcessEnv = process.env): Cli {
  const config = loadConfig(env);
  let docker: Promise<Docker> | undefined;
  return {
    config,
    log: rootLogger(config),
    docker: () => (docker ??= import('../sandbox/docker-client.ts').then((m) => m.createDocker(config.DOCKER_HOST))),
  };
}

/** The value of an option that must be an integer from 1 up, or undefined when it was not given. */
export function positiveOption(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`--${name}: expected an integer from 1 up, got ${JSON.stringify(value)}`);
  return n;
}

export function requireRedisUrl(config: FleetConfig): string {
  if (config.REDIS_URL === undefined) throw new UsageError('REDIS_URL is not set (only `rollout-fleet demo` starts a private Redis)');
  return config.REDIS_URL;
}

/** A producer-side connection: fails fast instead of queueing commands while Redis is away. */
export function connectProducer(url: string, connectionName = 'rf-cli'): Promise<Redis> {
  return connectRedis(url, { enableOfflineQueue: false, maxRetriesPerRequest: 1, connectionName }, UsageError);
}

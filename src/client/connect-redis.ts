// Connect to Redis now, or fail at once with why: the last error the connection saw (ioredis's own
// rejection may say only that the connection closed), with the URL's password masked in the URL and in
// the message. Shared by the CLI's producer connections and the fleet client.
import { Redis, type RedisOptions } from 'ioredis';
import { redactUrlCredentials } from '../config/zod-issues.ts';

/**
 * A connected client for `url`, with `options` (lazyConnect is implied). Its errors are swallowed from
 * then on: ioredis reconnects by itself, and each caller's options say how commands wait meanwhile.
 * A Redis that cannot be reached now rejects with `new ConnectError(message)` and the client is disconnected.
 */
export async function connectRedis(url: string, options: RedisOptions, ConnectError: new (message: string) => Error): Promise<Redis> {
  const redis = new Redis(url, { ...options, lazyConnect: true });
  let lastError: Error | undefined;
  redis.on('error', (err: Error) => (lastError = err));
  try {
    await redis.connect();
  } catch (err) {
    redis.disconnect();
    throw new ConnectError(`cannot connect to Redis at ${redactUrlCredentials(url)}: ${redactUrlCredentials((lastError ?? (err as Error)).message)}`);
  }
  return redis;
}

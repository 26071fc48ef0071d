// `rollout-fleet api [--port N]`: the HTTP API (src/api/api-server.ts) until SIGTERM or SIGINT. It
// refuses to listen beyond loopback without FLEET_API_TOKEN.
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import { createApiApp } from '../api/api-server.ts';
import { cliClient } from './cli-client.ts';
import { API_OPTIONS } from './command-table.ts';
import { UsageError, connectProducer, requireRedisUrl, type Cli } from './context.ts';
import { imageChecker } from './queue-clients.ts';

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost']);

export async function apiCommand(cli: Cli, args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: API_OPTIONS });
  const { config, log } = cli;
  const host = config.FLEET_API_HOST;
  if (config.FLEET_API_TOKEN === undefined && !LOOPBACK.has(host)) {
    throw new UsageError(`FLEET_API_TOKEN is not set: the API listens beyond loopback (FLEET_API_HOST ${JSON.stringify(host)}) only with a token`);
  }
  const port = values.port === undefined ? config.FLEET_API_PORT : Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65_535) throw new UsageError(`--port: expected an integer from 0 to 65535, got ${JSON.stringify(values.port)}`);
  const redisUrl = requireRedisUrl(config);
  // Images are checked against what the live workers report (the API host needs no Docker engine).
  const facts = await connectProducer(redisUrl);
  const client = await cliClient(cli, {
    // A checker per call: its facts are read once per checker, and the API outlives many batches.
    imageExists: (image) => imageChecker(undefined, { redis: facts, prefix: config.FLEET_PREFIX })(image),
  });
  const server = createApiApp({ client, token: config.FLEET_API_TOKEN, log }).listen(port, host);
  try {
    await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]);
    const address = server.address() as AddressInfo;
    log.info({ url: `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`, auth: config.FLEET_API_TOKEN !== undefined }, 'api listening');
    const [signal] = await Promise.race([once(process, 'SIGTERM'), once(process, 'SIGINT')]);
    log.info({ signal }, 'api stopping');
    return 0;
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await client.close();
    await facts.quit().catch(() => facts.disconnect());
  }
}

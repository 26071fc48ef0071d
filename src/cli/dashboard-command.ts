// `rollout-fleet dashboard [--port N] [--local-only]`: Bull Board, the batch pages and /metrics behind
// HTTP Basic auth. Without credentials it refuses to start, unless --local-only, which also binds
// 127.0.0.1 whatever FLEET_DASHBOARD_HOST says.
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import type { FleetConfig } from '../config/config.ts';
import type { Credentials } from '../dashboard/basic-auth.ts';
import { startDashboard } from '../dashboard/dashboard-server.ts';
import { RedisOutageLog } from '../redis/outage-log.ts';
import { fleetQueues } from './queue-clients.ts';
import { DASHBOARD_OPTIONS } from './command-table.ts';
import { UsageError, connectProducer, requireRedisUrl, type Cli } from './context.ts';
import { openArtifactStore } from '../artifacts/open-store.ts';

/** The credentials to require, or undefined when --local-only allows none; throws when it does not. */
export function dashboardCredentials(config: FleetConfig, localOnly: boolean): Credentials | undefined {
  const user = config.FLEET_DASHBOARD_USER;
  const password = config.FLEET_DASHBOARD_PASSWORD;
  if (user !== undefined && password !== undefined) return { user, password };
  if (user !== undefined || password !== undefined) {
    throw new UsageError('FLEET_DASHBOARD_USER and FLEET_DASHBOARD_PASSWORD must be set together');
  }
  if (localOnly) return undefined;
  throw new UsageError(
    'FLEET_DASHBOARD_USER and FLEET_DASHBOARD_PASSWORD are not set: the dashboard does not start without credentials '
      + '(or pass --local-only to serve 127.0.0.1 only, without authentication)',
  );
}

function port(value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 65_535) throw new UsageError(`--port: expected an integer from 0 to 65535, got ${JSON.stringify(value)}`);
  return n;
}

export async function dashboardCommand(cli: Cli, args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: DASHBOARD_OPTIONS });
  const { config, log } = cli;
  const localOnly = values['local-only'] === true;
  const credentials = dashboardCredentials(config, localOnly);
  const host = localOnly ? '127.0.0.1' : config.FLEET_DASHBOARD_HOST;
  const listenPort = port(values.port, config.FLEET_DASHBOARD_PORT);
  const redis = await connectProducer(requireRedisUrl(config), 'rf-dashboard');
  // An outage is logged once and its recovery with a count; the queues relay this connection's errors.
  const outages = new RedisOutageLog(log);
  outages.watchClient(redis, 'connection');
  const queues = fleetQueues(redis, config.FLEET_PREFIX, () => outages.listener('connection', 'queue error'));
  try {
    const dashboard = await startDashboard({
      redis,
      queues,
      prefix: config.FLEET_PREFIX,
      dataDir: config.FLEET_DATA_DIR,
      artifacts: openArtifactStore(config.FLEET_ARTIFACTS, config.FLEET_DATA_DIR),
      log,
      credentials,
      writeEnabled: config.FLEET_DASHBOARD_WRITE,
      host,
      port: listenPort,
    });
    log.info({ url: dashboard.url, auth: credentials !== undefined, readOnly: !config.FLEET_DASHBOARD_WRITE }, 'dashboard listening');
    const signal = await Promise.race([once(process, 'SIGTERM'), once(process, 'SIGINT')]);
    log.info({ signal: signal[0] }, 'dashboard stopping');
    await dashboard.close();
    return 0;
  } finally {
    await Promise.all(queues.map((q) => q.close()));
    await redis.quit().catch(() => redis.disconnect());
  }
}

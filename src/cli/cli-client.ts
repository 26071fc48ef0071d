// The TypeScript client as the commands use it: the config's Redis, prefix, data folder and artifact
// store. The commands that steer the fleet (enqueue, status, cancel, retry, api) are thin users of it.
import { FleetClient, FleetConnectionError, type FleetClientOptions } from '../client/fleet-client.ts';
import { UsageError, requireRedisUrl, type Cli } from './context.ts';

export async function cliClient(cli: Cli, extra: Partial<FleetClientOptions> = {}): Promise<FleetClient> {
  const { config } = cli;
  return FleetClient.connect({ redisUrl: requireRedisUrl(config), prefix: config.FLEET_PREFIX, dataDir: config.FLEET_DATA_DIR, artifacts: config.FLEET_ARTIFACTS, ...extra }).catch((err: unknown) => {
    throw err instanceof FleetConnectionError ? new UsageError(err.message) : err;
  });
}

// `rollout-fleet policy-version set <endpoint> <n>` and `get <endpoint>`: the trainer's policy version of
// an endpoint, through the TypeScript client (src/model/policy-versions.ts).
import { parseArgs } from 'node:util';
import { PolicyVersionConflict, type PolicyVersionState } from '../model/policy-versions.ts';
import { COMMANDS, POLICY_VERSION_OPTIONS, commandUsage } from './command-table.ts';
import { cliClient } from './cli-client.ts';
import { UsageError, type Cli } from './context.ts';
import { EXIT_CONFLICT } from './control-commands.ts';

const usage = () => commandUsage('policy-version', COMMANDS['policy-version']);

export async function policyVersionCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: POLICY_VERSION_OPTIONS });
  const [action, endpoint, value, ...rest] = positionals;
  if ((action !== 'set' && action !== 'get') || endpoint === undefined || rest.length > 0 || (action === 'set') !== (value !== undefined)) {
    throw new UsageError(`expected \`set <endpoint> <version>\` or \`get <endpoint>\`\n${usage()}`);
  }
  let version: number | undefined;
  if (action === 'set') {
    version = /^\d{1,15}$/.test(value!) ? Number(value) : Number.NaN;
    if (!Number.isSafeInteger(version)) throw new UsageError(`version: expected a non-negative integer, got ${JSON.stringify(value)}`);
  }
  const print = (state: PolicyVersionState) => process.stdout.write(values.json ? `${JSON.stringify(state)}\n` : `${state.endpoint}: version ${state.version} (set at ${state.setAt})\n`);
  const client = await cliClient(cli);
  try {
    if (action === 'get') {
      const state = await client.getPolicyVersion(endpoint).catch(asUsage);
      if (state === undefined) {
        process.stderr.write(`${endpoint}: no policy version was ever set\n`);
        return 1;
      }
      print(state);
      return 0;
    }
    try {
      print(await client.setPolicyVersion(endpoint, version!).catch(asUsage));
      return 0;
    } catch (err) {
      if (!(err instanceof PolicyVersionConflict)) throw err;
      process.stderr.write(`rollout-fleet policy-version: ${err.message}\n`);
      return EXIT_CONFLICT;
    }
  } finally {
    await client.close();
  }
}

function asUsage(err: unknown): never {
  if (err instanceof TypeError && /^[a-zA-Z]+: /.test(err.message)) throw new UsageError(err.message);
  throw err;
}

// Entry of the `rollout-fleet` CLI: dispatches to a command, turns known errors into a message and a
// non-zero exit code.
import { ConfigError } from '../config/config.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { checkpointWriterCommand } from './checkpoint-writer-command.ts';
import { enqueueCommand, resultsCommand, statusCommand, workerCommand } from './commands.ts';
import { cancelCommand, retryCommand } from './control-commands.ts';
import { UsageError, cliContext, type Cli } from './context.ts';
import { dashboardCommand } from './dashboard-command.ts';
import { demoCommand } from './demo.ts';
import { modelStubCommand } from './model-stub-command.ts';

const USAGE = `usage: rollout-fleet <command>
  worker [--concurrency N]                 run episodes (and cleanup, checkpoint writing) until SIGTERM
  checkpoint-writer [--concurrency N]      run only the checkpoint writer until SIGTERM
  enqueue <batch.yaml> [--wait [--timeout-ms N]] [--json]
                                           enqueue a batch; prints its id (exit 4: wait timed out)
  status <batch-id> [--json]               counts by status, mean reward, done or not
  results <batch-id> --format jsonl|csv    one result per line (or row)
  cancel <episode-id|batch-id> [--wait-ms N]  cancel waiting and running episodes (exit 3: already closing)
  retry <batch-id> --kind infra            re-enqueue only the episodes that failed with that kind
  demo                                     run the example batch on a private Redis, print the summary
  model-stub (--port N | --socket PATH) --tasks DIR [--wrong-fraction F] [--require-key K]
                                           [--fail-first N] [--delay-ms N]
                                           the scripted policy server that stands in for a model
  dashboard [--port N] [--local-only]      Bull Board, batch pages and /metrics (HTTP Basic auth)`;

const COMMANDS: Record<string, (cli: Cli, args: string[]) => Promise<number>> = {
  worker: workerCommand,
  enqueue: enqueueCommand,
  status: statusCommand,
  results: resultsCommand,
  demo: demoCommand,
  cancel: cancelCommand,
  retry: retryCommand,
  'model-stub': modelStubCommand,
  dashboard: dashboardCommand,
  'checkpoint-writer': checkpointWriterCommand,
};

export async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  const command = name === undefined ? undefined : COMMANDS[name];
  if (command === undefined) {
    process.stderr.write(`${name === undefined || name === '--help' ? '' : `unknown command ${JSON.stringify(name)}\n`}${USAGE}\n`);
    return name === '--help' ? 0 : 2;
  }
  try {
    return await command(cliContext(), args);
  } catch (err) {
    if (err instanceof ConfigError || err instanceof UsageError || err instanceof FleetError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      process.stderr.write(`rollout-fleet ${name}: ${(err as Error).message}\n`);
      return 2;
    }
    throw err;
  }
}

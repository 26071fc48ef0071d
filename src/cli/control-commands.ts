// `rollout-fleet cancel` and `rollout-fleet retry`: steering episodes that are queued or running, through
// the TypeScript client (src/client/fleet-client.ts), as a trainer would.
import { parseArgs } from 'node:util';
import { FAILURE_KINDS, isFailureKind } from '../errors/failure-kind.ts';
import { CANCEL_OPTIONS, COMMANDS, RETRY_OPTIONS, commandUsage } from './command-table.ts';
import { cliClient } from './cli-client.ts';
import { UsageError, type Cli } from './context.ts';

/** A client error naming the command's argument (`target: no batch ...`) is a usage error. */
function asUsage(err: unknown): never {
  if (err instanceof TypeError && /^[a-zA-Z]+: /.test(err.message)) throw new UsageError(err.message.replace(/^[a-zA-Z]+: /, ''));
  throw err;
}

/** Exit code of a cancel that met an episode already closing. */
export const EXIT_CONFLICT = 3;

export async function cancelCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: CANCEL_OPTIONS });
  const target = positionals[0];
  if (target === undefined || positionals.length > 1) throw new UsageError(`expected one episode or batch id\n${commandUsage('cancel', COMMANDS.cancel)}`);
  const waitMs = Number(values['wait-ms']);
  if (!Number.isFinite(waitMs) || waitMs < 0) throw new UsageError(`--wait-ms: expected a number of milliseconds, got ${JSON.stringify(values['wait-ms'])}`);
  const client = await cliClient(cli);
  try {
    const { batchId, batch, outcomes } = await client.cancel(target, { by: 'cli-cancel' }).catch(asUsage);
    let conflict = false;
    for (const [id, outcome] of Object.entries(outcomes)) {
      if (batch && outcome === 'ended') continue;
      if (outcome === 'cancelled') process.stdout.write(`${id}: cancelled (it was waiting)\n`);
      else if (outcome === 'ended') process.stdout.write(`${id}: already ended (${(await client.result(batchId, id))?.status ?? 'unknown'})\n`);
      else if (outcome === 'unknown') process.stdout.write(`${id}: not in the queue\n`);
      else {
        const result = await client.waitForResult(batchId, id, waitMs);
        if (outcome === 'closing') {
          conflict = true;
          process.stdout.write(`${id}: conflict: already closing, the close was not interrupted; it ended ${result?.status ?? '(still closing)'}\n`);
        } else {
          process.stdout.write(`${id}: ${result ? `${result.status} (it was running)` : 'cancel requested; no result yet'}\n`);
        }
      }
    }
    return conflict ? EXIT_CONFLICT : 0;
  } finally {
    await client.close();
  }
}

export async function retryCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: RETRY_OPTIONS });
  const batchId = positionals[0];
  const kind = values.kind;
  if (batchId === undefined || positionals.length > 1 || kind === undefined) throw new UsageError(`expected one batch id and --kind\n${commandUsage('retry', COMMANDS.retry)}`);
  if (!isFailureKind(kind)) throw new UsageError(`--kind: expected one of ${FAILURE_KINDS.join(', ')}, got ${JSON.stringify(kind)}`);
  const client = await cliClient(cli);
  try {
    if ((await client.status(batchId)) === undefined) throw new UsageError(`no batch ${JSON.stringify(batchId)} in this Redis`);
    const report = await client.retryByKind(batchId, kind);
    for (const id of report.requeued) process.stdout.write(`${id}: requeued\n`);
    for (const id of report.missing) process.stdout.write(`${id}: not retried (its job is no longer kept)\n`);
    for (const id of report.pending) process.stdout.write(`${id}: not retried (its job is queued or running already)\n`);
    process.stdout.write(`${report.requeued.length} episode(s) of kind ${kind} requeued\n`);
    return 0;
  } finally {
    await client.close();
  }
}

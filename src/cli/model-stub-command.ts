// `rollout-fleet model-stub`: run the scripted policy server, which stands in for a model in the demo
// and the tests. Prints where it listens (its base URL, or unix:<path>) on stdout, runs until SIGTERM.
import { once } from 'node:events';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startModelStub } from '../model/model-stub.ts';
import { COMMANDS, MODEL_STUB_OPTIONS, commandUsage } from './command-table.ts';
import { UsageError, type Cli } from './context.ts';

const USAGE = commandUsage('model-stub', COMMANDS['model-stub']);

/** An option that takes an integer from 0 up; 0 when absent. */
function wholeNumber(option: string, value: string | undefined): number {
  const n = value === undefined ? 0 : Number(value);
  if (!Number.isInteger(n) || n < 0) throw new UsageError(`${option}: expected an integer from 0 up, got ${JSON.stringify(value)}`);
  return n;
}

export async function modelStubCommand(cli: Cli, args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: MODEL_STUB_OPTIONS });
  if ((values.port === undefined) === (values.socket === undefined)) throw new UsageError(`give exactly one of --port and --socket\n${USAGE}`);
  if (values.tasks === undefined) throw new UsageError(`--tasks is required\n${USAGE}`);
  const port = values.port === undefined ? undefined : Number(values.port);
  if (port !== undefined && !(Number.isInteger(port) && port >= 0 && port <= 65_535)) {
    throw new UsageError(`--port: expected an integer from 0 to 65535, got ${JSON.stringify(values.port)}`);
  }
  const wrongFraction = values['wrong-fraction'] === undefined ? 0 : Number(values['wrong-fraction']);
  if (!(wrongFraction >= 0 && wrongFraction <= 1)) {
    throw new UsageError(`--wrong-fraction: expected a number from 0 to 1, got ${JSON.stringify(values['wrong-fraction'])}`);
  }
  const failFirst = wholeNumber('--fail-first', values['fail-first']);
  const delayMs = wholeNumber('--delay-ms', values['delay-ms']);
  const streamChunkDelayMs = wholeNumber('--stream-chunk-delay-ms', values['stream-chunk-delay-ms']);
  const rateLimitRpm = values['rate-limit-rpm'] === undefined ? undefined : Number(values['rate-limit-rpm']);
  if (rateLimitRpm !== undefined && !(Number.isInteger(rateLimitRpm) && rateLimitRpm > 0)) {
    throw new UsageError(`--rate-limit-rpm: expected an integer from 1 up, got ${JSON.stringify(values['rate-limit-rpm'])}`);
  }
  if (values['require-key'] === '') throw new UsageError('--require-key: expected a non-empty key');

  const stub = await startModelStub({
    tasksDir: values.tasks,
    listen: port !== undefined ? { port, host: values.host, anyHost: values['any-host'] === true } : { socketPath: path.resolve(values.socket!) },
    wrongFraction,
    requireKey: values['require-key'],
    failFirst,
    delayMs,
    streamChunkDelayMs,
    rateLimitRpm,
    log: cli.log,
  });
  process.stdout.write(`${stub.baseUrl ?? `unix:${stub.socketPath}`}\n`);
  const signal = await Promise.race([once(process, 'SIGTERM'), once(process, 'SIGINT')]);
  cli.log.info({ signal }, 'model stub stopping');
  await stub.close();
  return 0;
}

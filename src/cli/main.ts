// Entry of the `rollout-fleet` CLI: answers --help and --version, checks a command's options against
// its entry in the command table, then loads only that command's code and runs it, turning known
// errors into a message and a non-zero exit code. Neither the config nor Redis nor Docker is touched
// before a command actually runs, so help works anywhere.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { PACKAGE_ROOT } from '../package-paths.ts';
import { USAGE, commandSpec, commandUsage } from './command-table.ts';

/** Exit code of a command line that cannot be run as written: unknown command or option, bad value. */
export const EXIT_USAGE = 2;

/** The version in this package's package.json. */
export function packageVersion(): string {
  const manifest: unknown = JSON.parse(readFileSync(path.join(PACKAGE_ROOT, 'package.json'), 'utf8'));
  if (typeof manifest === 'object' && manifest !== null && 'version' in manifest && typeof manifest.version === 'string') return manifest.version;
  throw new Error(`${path.join(PACKAGE_ROOT, 'package.json')} has no version`);
}

/** node:util parseArgs' errors (unknown option, missing value, unexpected argument). */
function isParseArgsError(err: unknown): err is Error {
  if (!(err instanceof Error)) return false;
  const { code } = err as { code?: unknown };
  return typeof code === 'string' && code.startsWith('ERR_PARSE_ARGS');
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (name === '--help' || name === '-h') {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (name === '--version' || name === '-V') {
    process.stdout.write(`${packageVersion()}\n`);
    return 0;
  }
  const spec = name === undefined ? undefined : commandSpec(name);
  if (name === undefined || spec === undefined) {
    process.stderr.write(`${name === undefined ? '' : `unknown command ${JSON.stringify(name)}\n`}${USAGE}\n`);
    return EXIT_USAGE;
  }
  let help: boolean;
  try {
    const { values } = parseArgs({ args, options: { ...spec.options, help: { type: 'boolean', short: 'h' } }, allowPositionals: spec.allowPositionals, strict: true });
    help = values.help === true;
  } catch (err) {
    if (!isParseArgsError(err)) throw err;
    process.stderr.write(`rollout-fleet ${name}: ${err.message}\n${commandUsage(name, spec)}\n`);
    return EXIT_USAGE;
  }
  if (help) {
    process.stdout.write(`${commandUsage(name, spec)}\n`);
    return 0;
  }
  try {
    const [run, { cliContext }] = await Promise.all([spec.load(), import('./context.ts')]);
    return await run(cliContext(), args);
  } catch (err) {
    // Imported only now: they load zod and the config schema, which --help need not.
    const [{ ConfigError }, { FleetError }, { UsageError }] = await Promise.all([
      import('../config/config.ts'), import('../errors/fleet-error.ts'), import('./context.ts'),
    ]);
    if (err instanceof ConfigError || err instanceof UsageError || err instanceof FleetError || isParseArgsError(err)) {
      // Messages name user paths and values: no control character of theirs reaches the terminal.
      const { printableLines } = await import('../errors/printable.ts');
      process.stderr.write(`rollout-fleet ${name}: ${printableLines((err as Error).message)}\n`);
      return EXIT_USAGE;
    }
    throw err;
  }
}

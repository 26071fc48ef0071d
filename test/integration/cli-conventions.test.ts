// The CLI's conventions, on the compiled bin run as a process (as users run it): every command in the
// usage answers --help and -h with its own usage on stdout and exit 0, without Redis, Docker or a valid
// config; --version prints package.json's version; an unknown option or command exits 2 with the
// usage on stderr.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT, runCli, type CliRun } from '../helpers/fleet.ts';

/** No REDIS_URL, an invalid config value and an engine address nothing answers on: help needs none. */
const HOSTILE_ENV: NodeJS.ProcessEnv = {
  PATH: process.env.PATH,
  FLEET_WORKER_CONCURRENCY: 'many',
  DOCKER_HOST: 'unix:///nonexistent/docker.sock',
};

const cli = (args: string[]): Promise<CliRun> => runCli(args, HOSTILE_ENV);

/** The command names the top-level usage lists: the two-space-indented words before their synopsis. */
function commandsIn(usage: string): string[] {
  return usage
    .split('\n')
    .map((line) => /^ {2}([a-z][a-z-]*)(?: |$)/.exec(line)?.[1])
    .filter((name): name is string => name !== undefined);
}

describe('rollout-fleet CLI conventions', () => {
  it('--help prints the usage listing every command to stdout and exits 0', async () => {
    const run = await cli(['--help']);
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^usage: rollout-fleet <command>/);
    expect(commandsIn(run.stdout)).toEqual([
      'worker', 'checkpoint-writer', 'enqueue', 'prepare', 'status', 'results', 'cancel', 'retry', 'policy-version', 'demo', 'model-stub', 'dashboard', 'api',
    ]);
    expect((await cli(['-h'])).stdout).toBe(run.stdout);
  });

  it('every command answers --help and -h with its own usage on stdout, exit 0, no config, Redis or Docker', async () => {
    const names = commandsIn((await cli(['--help'])).stdout);
    expect(names.length).toBeGreaterThan(0);
    const runs = await Promise.all(names.flatMap((name) => [
      cli([name, '--help']).then((run) => ({ name, flag: '--help', run })),
      cli([name, '-h']).then((run) => ({ name, flag: '-h', run })),
    ]));
    for (const { name, flag, run } of runs) {
      const what = `${name} ${flag}: ${run.stderr}`;
      expect(run.code, what).toBe(0);
      expect(run.stdout.split('\n')[0], what).toMatch(new RegExp(`^usage: rollout-fleet ${name}( |$)`));
      expect(run.stdout, what).toContain('--help, -h');
      expect(run.stderr, what).toBe('');
    }
  });

  it('--help after arguments and options still wins, and does not run the command', async () => {
    // With no Docker engine, `demo` would fail; `status` with no REDIS_URL would exit 2.
    for (const args of [['demo', '--help'], ['status', 'some-batch', '--json', '--help'], ['cancel', 'x', '-h']]) {
      const run = await cli(args);
      expect(run.code, args.join(' ')).toBe(0);
      expect(run.stdout, args.join(' ')).toMatch(new RegExp(`^usage: rollout-fleet ${args[0]}`));
    }
  });

  it('--version and -V print the version of package.json', async () => {
    const { version } = JSON.parse(await readFile(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };
    for (const flag of ['--version', '-V']) {
      const run = await cli([flag]);
      expect(run.code).toBe(0);
      expect(run.stdout).toBe(`${version}\n`);
    }
  });

  it('an unknown option exits 2 with the message and the command usage on stderr', async () => {
    const run = await cli(['cancel', '--no-such-option', 'x']);
    expect(run.code).toBe(2);
    expect(run.stdout).toBe('');
    expect(run.stderr).toContain("Unknown option '--no-such-option'");
    expect(run.stderr).toContain('usage: rollout-fleet cancel');
  });

  it('an unknown command, or none, exits 2 with the usage on stderr', async () => {
    for (const args of [['no-such-command'], []]) {
      const run = await cli(args);
      expect(run.code).toBe(2);
      expect(run.stdout).toBe('');
      expect(run.stderr).toContain('usage: rollout-fleet <command>');
    }
  });

  it('a command that runs still reads the config: a bad value is an error, exit 2', async () => {
    const run = await cli(['status', 'some-batch']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('FLEET_WORKER_CONCURRENCY');
  });

  it('never echoes a Redis URL\'s password, neither in a config error nor when Redis cannot be reached', async () => {
    const base = { PATH: process.env.PATH };
    const badScheme = await runCli(['status', 'b'], { ...base, REDIS_URL: 'http://fleet:s3cret-pw@127.0.0.1:1' });
    expect(badScheme.code).toBe(2);
    expect(badScheme.stderr).toContain('REDIS_URL');
    expect(badScheme.stderr).toContain('fleet:***@127.0.0.1:1');
    // Port 1 on loopback: nothing listens there, the connection is refused at once.
    const unreachable = await runCli(['status', 'b'], { ...base, REDIS_URL: 'redis://:s3cret-pw@127.0.0.1:1' });
    expect(unreachable.code).toBe(2);
    expect(unreachable.stderr).toContain('cannot connect to Redis at redis://:***@127.0.0.1:1');
    for (const run of [badScheme, unreachable]) expect(run.stderr + run.stdout).not.toContain('s3cret-pw');
  });
});

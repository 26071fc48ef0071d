// The CLI's commands as data: each one's synopsis, help text and options, and a loader that imports
// its code only when it runs. Kept free of runtime imports (types only, and the failure kinds, a list
// that imports nothing), so `--help`, `--version` and a mistyped option answer without loading BullMQ,
// dockerode, zod or the config.
import type { ParseArgsConfig } from 'node:util';
import { FAILURE_KINDS } from '../errors/failure-kind.ts';
import type { Cli } from './context.ts';

export type CommandOptions = NonNullable<ParseArgsConfig['options']>;
export type CommandRun = (cli: Cli, args: string[]) => Promise<number>;

export interface CommandSpec {
  /** What follows the command's name on its usage line. */
  synopsis: string;
  /** One line for the overall usage. */
  summary: string;
  /** For the command's own --help: what it does and its exit codes, if more than the summary says. */
  about: string;
  /** For the command's own --help: one line per option (--help is added). */
  optionHelp: string;
  /** Parsed by main (to find --help and refuse unknown options) and again by the command. */
  options: CommandOptions;
  allowPositionals: boolean;
  load(): Promise<CommandRun>;
}

const noOptions = {} as const satisfies CommandOptions;

export const WORKER_OPTIONS = { concurrency: { type: 'string' } } as const satisfies CommandOptions;
export const CHECKPOINT_WRITER_OPTIONS = { concurrency: { type: 'string' } } as const satisfies CommandOptions;
export const ENQUEUE_OPTIONS = { wait: { type: 'boolean' }, json: { type: 'boolean' }, 'timeout-ms': { type: 'string' } } as const satisfies CommandOptions;
export const PREPARE_OPTIONS = { local: { type: 'boolean' }, 'timeout-ms': { type: 'string' } } as const satisfies CommandOptions;
export const STATUS_OPTIONS = { json: { type: 'boolean' } } as const satisfies CommandOptions;
export const RESULTS_OPTIONS = { format: { type: 'string', default: 'jsonl' } } as const satisfies CommandOptions;
export const CANCEL_OPTIONS = { 'wait-ms': { type: 'string', default: '60000' } } as const satisfies CommandOptions;
export const RETRY_OPTIONS = { kind: { type: 'string' } } as const satisfies CommandOptions;
export const DASHBOARD_OPTIONS = { port: { type: 'string' }, 'local-only': { type: 'boolean' } } as const satisfies CommandOptions;
export const API_OPTIONS = { port: { type: 'string' } } as const satisfies CommandOptions;
export const POLICY_VERSION_OPTIONS = { json: { type: 'boolean' } } as const satisfies CommandOptions;
export const MODEL_STUB_OPTIONS = {
  port: { type: 'string' },
  /** Address to listen on with --port. @default 127.0.0.1 */
  host: { type: 'string', default: '127.0.0.1' },
  socket: { type: 'string' },
  tasks: { type: 'string' },
  'wrong-fraction': { type: 'string' },
  'require-key': { type: 'string' },
  'any-host': { type: 'boolean' },
  'fail-first': { type: 'string' },
  'delay-ms': { type: 'string' },
  'stream-chunk-delay-ms': { type: 'string' },
  'rate-limit-rpm': { type: 'string' },
} as const satisfies CommandOptions;

export const COMMANDS = {
  worker: {
    synopsis: '[--concurrency N]',
    summary: 'run episodes (and cleanup, checkpoint writing) until SIGTERM',
    about: `Pulls episode jobs from REDIS_URL and runs each in its own Docker sandbox; SIGTERM or SIGINT
drains it (running episodes are handed over) and it exits 0.`,
    optionHelp: `  --concurrency N   episodes at once, the ceiling when self-tuning (default: FLEET_WORKER_CONCURRENCY)`,
    options: WORKER_OPTIONS,
    allowPositionals: false,
    load: async () => (await import('./worker-command.ts')).workerCommand,
  },
  'checkpoint-writer': {
    synopsis: '[--concurrency N]',
    summary: 'run only the checkpoint writer until SIGTERM',
    about: `Persists checkpoints from the checkpoints queue under FLEET_DATA_DIR (workers run one too).`,
    optionHelp: `  --concurrency N   checkpoints written at once (default: FLEET_CHECKPOINT_WRITER_CONCURRENCY)`,
    options: CHECKPOINT_WRITER_OPTIONS,
    allowPositionals: false,
    load: async () => (await import('./checkpoint-writer-command.ts')).checkpointWriterCommand,
  },
  enqueue: {
    synopsis: '<batch.yaml> [--wait [--timeout-ms N]] [--json]',
    summary: 'enqueue a batch; prints its id (exit 4: wait timed out)',
    about: `Validates the batch file and its tasks, then enqueues every episode; the same batch again adds nothing.`,
    optionHelp: `  --wait            show progress until every episode has a result, then print the summary
  --timeout-ms N    with --wait: give up waiting after N ms (exit 4; the batch goes on)
  --json            print JSON instead of text`,
    options: ENQUEUE_OPTIONS,
    allowPositionals: true,
    load: async () => (await import('./enqueue-command.ts')).enqueueCommand,
  },
  prepare: {
    synopsis: '<batch.yaml> [--local] [--timeout-ms N]',
    summary: 'build the Harbor environments of a batch on every live host ahead of time',
    about: `Builds every Harbor task's environment/ of the batch on the engine of every host with a live
worker (each engine's workers take its jobs), one line of progress per host and environment: built,
already there, or failed with its error's kind and code. The builds are the workers' own (one per
engine and content, under the fleet's lock; with FLEET_REGISTRY one build for the fleet, pushed, and
pulled by every other host). With no live worker it says so and builds on the engine at DOCKER_HOST
instead. Exit 1 when an environment failed (or was not done in time) on some host.`,
    optionHelp: `  --local           build on the engine at DOCKER_HOST only, not through the workers
  --timeout-ms N    give up on what is not done after N ms (default: the sum of the build timeouts plus 2 min each)`,
    options: PREPARE_OPTIONS,
    allowPositionals: true,
    load: async () => (await import('./prepare-command.ts')).prepareCommand,
  },
  status: {
    synopsis: '<batch-id> [--json]',
    summary: 'counts by status, mean reward, done or not',
    about: `Prints a batch's summary: counts by status and failure kind, reward, pass@k, p50/p95, tokens.`,
    optionHelp: `  --json            print the summary as JSON`,
    options: STATUS_OPTIONS,
    allowPositionals: true,
    load: async () => (await import('./status-command.ts')).statusCommand,
  },
  results: {
    synopsis: '<batch-id> --format jsonl|csv|trajectories',
    summary: 'one result per line (or row)',
    about: `Prints every episode result of a batch recorded so far; trajectories: one JSON line per episode
with its result and its final attempt's trajectory (messages, token ids, logprobs), for training.`,
    optionHelp: `  --format F        jsonl (default), csv or trajectories`,
    options: RESULTS_OPTIONS,
    allowPositionals: true,
    load: async () => (await import('./results-command.ts')).resultsCommand,
  },
  cancel: {
    synopsis: '<episode-id|batch-id> [--wait-ms N]',
    summary: 'cancel waiting and running episodes',
    about: `Cancels one episode, or every episode of a batch: waiting ones at once, running ones through
their worker (evidence is kept). Exit 3 when an episode was already closing (it ends as it would have).`,
    optionHelp: `  --wait-ms N       how long to wait for a running episode's result (default 60000)`,
    options: CANCEL_OPTIONS,
    allowPositionals: true,
    load: async () => (await import('./control-commands.ts')).cancelCommand,
  },
  retry: {
    synopsis: '<batch-id> --kind infra',
    summary: 're-enqueue only the episodes that failed with that kind',
    about: ``,
    optionHelp: `  --kind K          ${FAILURE_KINDS.slice(0, -1).join(', ')} or ${FAILURE_KINDS.at(-1)}`,
    options: RETRY_OPTIONS,
    allowPositionals: true,
    load: async () => (await import('./control-commands.ts')).retryCommand,
  },
  'policy-version': {
    synopsis: '(set <endpoint> <version> | get <endpoint>) [--json]',
    summary: "set or read an endpoint's current policy version",
    about: `The trainer's step: every model call that starts after \`set\` returns is stamped with the version
(in model-calls.jsonl, trajectory.json and the results). Versions only move forward: a lower one is
refused (exit 3); the same one again is kept. The endpoint is \`default\` (MODEL_BASE_URL) until named
endpoints exist. \`get\` exits 1 when no version was ever set.`,
    optionHelp: `  --json            print {"endpoint", "version", "setAt"} as JSON`,
    options: POLICY_VERSION_OPTIONS,
    allowPositionals: true,
    load: async () => (await import('./policy-version-command.ts')).policyVersionCommand,
  },
  demo: {
    synopsis: '',
    summary: 'run the example batch on a private Redis, print the summary',
    about: `Starts a private redis-server (unless REDIS_URL is set), the scripted policy server (unless
MODEL_BASE_URL is set) and two worker processes, enqueues examples/demo-batch.yaml, waits for its
summary and for every sandbox to be removed, and stops what it started. Needs a Docker engine.`,
    optionHelp: ``,
    options: noOptions,
    allowPositionals: false,
    load: async () => (await import('./demo.ts')).demoCommand,
  },
  'model-stub': {
    synopsis: `(--port N [--host H [--any-host]] | --socket PATH) --tasks DIR [--wrong-fraction F] [--require-key K]
                                           [--fail-first N] [--delay-ms N] [--stream-chunk-delay-ms N]
                                           [--rate-limit-rpm N]`,
    summary: 'the scripted policy server that stands in for a model',
    about: `Serves chat completions that solve the tasks under DIR with their solution/; prints its base URL
(or unix:PATH) and runs until SIGTERM.`,
    optionHelp: `  --port N          listen on this TCP port (0: any free one)
  --host H          with --port: the address to listen on (default 127.0.0.1; loopback only
                    unless --any-host)
  --any-host        allow a --host that is not loopback (a container network nothing else reaches)
  --socket PATH     listen on a Unix socket instead
  --tasks DIR       the task folders whose solutions it plays
  --wrong-fraction F  share of episodes (0 to 1, by episode id) finished without solving
  --require-key K   answer 401 without "Authorization: Bearer K"
  --fail-first N    answer 503 to the first N chat calls of each episode
  --delay-ms N      answer each chat call after N ms
  --stream-chunk-delay-ms N  space the events of a streamed answer N ms apart
  --rate-limit-rpm N  answer 429 with Retry-After to chat calls beyond N a minute`,
    options: MODEL_STUB_OPTIONS,
    allowPositionals: false,
    load: async () => (await import('./model-stub-command.ts')).modelStubCommand,
  },
  dashboard: {
    synopsis: '[--port N] [--local-only]',
    summary: 'Bull Board, batch pages and /metrics (HTTP Basic auth)',
    about: `Needs FLEET_DASHBOARD_USER and FLEET_DASHBOARD_PASSWORD, unless --local-only.`,
    optionHelp: `  --port N          listen on this port (default: FLEET_DASHBOARD_PORT)
  --local-only      serve 127.0.0.1 only, without authentication`,
    options: DASHBOARD_OPTIONS,
    allowPositionals: false,
    load: async () => (await import('./dashboard-command.ts')).dashboardCommand,
  },
  api: {
    synopsis: '[--port N]',
    summary: 'the HTTP API: batch status and results as they finish (SSE or NDJSON)',
    about: `Listens on FLEET_API_HOST:FLEET_API_PORT (127.0.0.1:3100). Needs FLEET_API_TOKEN (Bearer auth)
unless it listens on loopback. GET /openapi.json describes it.`,
    optionHelp: `  --port N          listen on this port (default: FLEET_API_PORT)`,
    options: API_OPTIONS,
    allowPositionals: false,
    load: async () => (await import('./api-command.ts')).apiCommand,
  },
} as const satisfies Record<string, CommandSpec>;

export type CommandName = keyof typeof COMMANDS;

export function commandSpec(name: string): CommandSpec | undefined {
  return Object.hasOwn(COMMANDS, name) ? COMMANDS[name as CommandName] : undefined;
}

const COLUMN = 43;

export const USAGE = `usage: rollout-fleet <command> [options]    (rollout-fleet <command> --help for its own)
${Object.entries(COMMANDS).map(([name, spec]) => {
  const head = `  ${name}${spec.synopsis ? ` ${spec.synopsis}` : ''}`;
  // A long synopsis (or its last line) gets the summary on the next line, as it reads better than wrapping.
  const lastLine = head.split('\n').at(-1) ?? head;
  return lastLine.length < COLUMN - 1 ? `${head}${' '.repeat(COLUMN - lastLine.length)}${spec.summary}` : `${head}\n${' '.repeat(COLUMN)}${spec.summary}`;
}).join('\n')}
  --help, -h                               this text
  --version, -V                            the version of rollout-fleet`;

/** A command's own --help text. */
export function commandUsage(name: string, spec: CommandSpec): string {
  const synopsis = spec.synopsis.replace(/\s*\n\s*/g, ' ');
  return [
    `usage: rollout-fleet ${name}${synopsis ? ` ${synopsis}` : ''}`,
    '',
    `${spec.summary[0]?.toUpperCase()}${spec.summary.slice(1)}.${spec.about ? `\n${spec.about}` : ''}`,
    '',
    'options:',
    ...(spec.optionHelp ? [spec.optionHelp] : []),
    '  --help, -h        print this help',
  ].join('\n');
}

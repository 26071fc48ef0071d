// Terminal-Bench 1 task folders (task.yaml with `instruction`, a Dockerfile, docker-compose.yaml with
// the `client` service, run-tests.sh, tests/, solution.sh or solution.yaml), mapped to a Harbor task
// folder as Harbor's own mapper does (H:mappers/terminal_bench.py), so that everything after loading
// (the digest, the image build, set-up, the oracle, grading) is the Harbor path, unchanged:
// - task.yaml's timeouts become [agent] and [verifier] timeout_sec; its metadata [metadata];
// - the client service's build context becomes environment/, its Dockerfile gets the service's
//   environment, working_dir, user and entrypoint as lines, and `ENV TEST_DIR=/tests`; an `image:`
//   without `build:` becomes docker_image;
// - run-tests.sh and tests/ become tests/, with a tests/test.sh of ours that runs run-tests.sh and
//   grades its output as Terminal-Bench's pytest parser does (below), writing reward.json;
// - solution.sh becomes solution/solve.sh; solution.yaml's keystrokes are typed into one bash, in order.
// - the services beside the client become environment/docker-compose.yaml's sidecars, the client its
//   `main` (Harbor's task services: one network namespace per episode, so its networks go).
// A compose file asking for host paths, privileges or anything else this fleet does not give is
// refused at enqueue, naming the service and the key.
// The mapped folder is written once per content into a cache folder (named by the hash of the source
// folder and of this mapper), never into the task's own folder.
import { createHash } from 'node:crypto';
import { chmod, cp, lstat, mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { stringify as stringifyToml } from 'smol-toml';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { z } from 'zod';
import { packFolder, PackRefusal } from '../archive/pack-folder.ts';
import { printable } from '../errors/printable.ts';
import { MAX_TASK_ARCHIVE_BYTES, MAX_TASK_ENTRIES } from './pack-task.ts';

/** Bump when the mapping changes: the cache key covers it, so a changed mapper maps again. */
const MAPPER_VERSION = 'tb1-map-2';

/** The files that make a folder a Terminal-Bench 1 task (with task.yaml, and no workspace/ of ours). */
export const TB1_FILES = {
  yaml: 'task.yaml',
  compose: ['docker-compose.yaml', 'docker-compose.yml'],
  runTests: 'run-tests.sh',
  solution: 'solution.sh',
  solutionYaml: 'solution.yaml',
} as const;

/** Terminal-Bench 1's values for the variables its compose files use. */
export const TB1_VARIABLES: Readonly<Record<string, string>> = {
  T_BENCH_TEST_DIR: '/tests',
  T_BENCH_CONTAINER_LOGS_PATH: '/logs',
  T_BENCH_CONTAINER_AGENT_LOGS_PATH: '/agent-logs',
  T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME: 'rollout-fleet/tb1-client',
  T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME: 'client',
  T_BENCH_TASK_DOCKER_NAME_PREFIX: 'hb',
};
/** Host paths in Terminal-Bench 1's own volume lines (its logs): the only bind mounts accepted, and ignored. */
const TB1_HOST_PATHS = ['T_BENCH_TASK_LOGS_PATH', 'T_BENCH_TASK_AGENT_LOGS_PATH'];

export class Tb1Problem extends Error {
  constructor(readonly file: string, message: string) {
    super(message);
  }
}

const seconds = z.number().positive().max(7 * 24 * 3600);
const text = z.union([z.string(), z.number(), z.boolean()]).transform(String);

/** task.yaml as Terminal-Bench 1 writes it; keys not listed are kept out of the mapping, not refused. */
export const Tb1TaskYaml = z.looseObject({
  instruction: z.string().min(1, 'must not be empty'),
  author_name: text.optional(),
  author_email: text.optional(),
  difficulty: text.optional(),
  category: text.optional(),
  tags: z.array(text).max(100).optional(),
  parser_name: z.literal('pytest', { error: 'only "pytest" is supported (Terminal-Bench\'s other parsers belong to adapters that need services or network)' }).default('pytest'),
  max_agent_timeout_sec: seconds.default(360),
  max_test_timeout_sec: seconds.default(60),
  run_tests_in_same_shell: z.boolean().optional(),
  disable_asciinema: z.boolean().optional(),
  estimated_duration_sec: z.number().optional(),
  expert_time_estimate_min: z.number().optional(),
  junior_time_estimate_min: z.number().optional(),
});
export type Tb1TaskYaml = z.infer<typeof Tb1TaskYaml>;

const SolutionYaml = z.array(z.looseObject({
  command: z.string(),
  append_enter: z.boolean().default(true),
  min_timeout_sec: z.number().optional(),
  max_timeout_sec: z.number().optional(),
  block: z.boolean().optional(),
})).min(1);

/** Keys of the client service: honoured, or accepted and of no effect here (each says why). */
const HONOURED_KEYS = new Set(['build', 'image', 'environment', 'working_dir', 'entrypoint', 'user', 'depends_on', 'volumes']);
const IGNORED_KEYS: Readonly<Record<string, string>> = {
  container_name: 'the fleet names its containers',
  command: 'the fleet keeps the container alive itself',
  networks: 'an episode\'s services share one network namespace: each reaches every other by name',
  expose: 'the agent has no network',
  tty: 'commands run through exec', stdin_open: 'commands run through exec', init: 'the fleet runs its own keep-alive',
  restart: 'an episode\'s container is never restarted', platform: 'the engine\'s platform is used', labels: 'the fleet labels its containers',
  hostname: 'not needed in one container', healthcheck: 'write [environment.healthcheck] in a Harbor task instead',
};

/**
 * Early Terminal-Bench 1 tasks wrote `descriptions: [{ key: base, description }]` instead of
 * `instruction`: the base description is the instruction, as Terminal-Bench used it.
 */
function withInstruction(raw: unknown): unknown {
  if (raw === null || typeof raw !== 'object' || 'instruction' in raw) return raw;
  const descriptions = (raw as { descriptions?: unknown }).descriptions;
  if (!Array.isArray(descriptions)) return raw;
  const base = descriptions.find((d) => d !== null && typeof d === 'object' && (d as { key?: unknown }).key === 'base') ?? descriptions[0];
  const text = (base as { description?: unknown } | undefined)?.description;
  return typeof text === 'string' ? { ...raw, instruction: text } : raw;
}

/** Text of a task file: bounded, a regular file, never echoed (the loader's reader). */
export type ReadText = (file: string) => Promise<string>;

function yamlOf(textIn: string, file: string): unknown {
  try {
    return parseYaml(textIn, { logLevel: 'error' });
  } catch (err) {
    throw new Tb1Problem(file, `not valid YAML: ${printable((err as Error).message.split('\n')[0] ?? '')}`);
  }
}

/** `${VAR}`, `${VAR:-default}` and `$VAR` with Terminal-Bench's values; any other name needs a default. */
function interpolate(value: string, field: string): string {
  return value.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (_m, braced: string | undefined, fallback: string | undefined, bare: string | undefined) => {
    const name = (braced ?? bare)!;
    const known = TB1_VARIABLES[name];
    if (known !== undefined) return known;
    if (fallback !== undefined) return fallback;
    throw new Tb1Problem('docker-compose.yaml', `${field}: \${${name}} is not a Terminal-Bench variable, and has no default (write \${${name}:-value})`);
  });
}

function strings(value: unknown, field: string): string[] {
  if (typeof value === 'string') return [value];
  if (Array.isArray(value) && value.every((v) => typeof v === 'string' || typeof v === 'number')) return value.map(String);
  throw new Tb1Problem('docker-compose.yaml', `${field}: a string or a list of strings (got ${typeof value})`);
}

/** The client service's environment as KEY=value pairs, interpolated. */
function environmentOf(value: unknown, field: string): [string, string][] {
  const pairs: [string, string][] = [];
  if (Array.isArray(value)) {
    for (const [i, item] of value.entries()) {
      if (typeof item !== 'string') throw new Tb1Problem('docker-compose.yaml', `${field}.${i}: "KEY=value" (got ${typeof item})`);
      const eq = item.indexOf('=');
      // "KEY" alone passes the host's value in compose: nothing of the host reaches a sandbox here.
      if (eq < 0) continue;
      pairs.push([item.slice(0, eq), interpolate(item.slice(eq + 1), `${field}.${i}`)]);
    }
  } else if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      if (v === null || v === undefined) continue;
      pairs.push([k, interpolate(String(v), `${field}.${k}`)]);
    }
  } else {
    throw new Tb1Problem('docker-compose.yaml', `${field}: a list of "KEY=value" or a map (got ${typeof value})`);
  }
  for (const [k] of pairs) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new Tb1Problem('docker-compose.yaml', `${field}: ${JSON.stringify(printable(k))} is not an environment variable name`);
  }
  return pairs;
}

/** What the client service asks for, checked; and the task services beside it, for the Harbor compose file. */
export interface Tb1Client {
  service: string;
  build?: { context: string; dockerfile: string };
  image?: string;
  environment: [string, string][];
  workingDir?: string;
  entrypoint?: string[];
  user?: string;
  /** The client's depends_on and named-volume mounts: main's in the Harbor compose file. */
  dependsOn?: unknown;
  volumes?: string[];
  /** The services beside the client, Terminal-Bench's variables filled in, judged later as Harbor compose services. */
  sidecars?: Record<string, Record<string, unknown>>;
  /** The file's top-level named volumes. */
  namedVolumes?: unknown;
}

/** A log mount of Terminal-Bench's own (a host path of its): accepted and dropped. */
function isTb1LogMount(volume: string): boolean {
  const host = volume.split(':')[0] ?? '';
  return TB1_HOST_PATHS.some((name) => host === `\${${name}}` || host === `$${name}`);
}

/**
 * A sidecar's definition with Terminal-Bench's variables filled in (the client's image as Harbor's
 * ${MAIN_IMAGE_NAME}); other variables are left for the Harbor compose reader, which judges them.
 * Its container_name and networks go (one namespace per episode), and so do Terminal-Bench's log mounts.
 */
function sidecarOf(spec: Record<string, unknown>): Record<string, unknown> {
  const fill = (v: unknown): unknown => {
    if (typeof v === 'string') {
      return v.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (m, braced: string | undefined, bare: string | undefined) => {
        const name = (braced ?? bare)!;
        if (name === 'T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME') return '${MAIN_IMAGE_NAME}';
        return TB1_VARIABLES[name] ?? m;
      });
    }
    if (Array.isArray(v)) return v.map(fill);
    if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, fill(x)]));
    return v;
  };
  const { container_name: _name, networks: _networks, ...rest } = spec;
  const out = fill(rest) as Record<string, unknown>;
  if (Array.isArray(out.volumes)) out.volumes = out.volumes.filter((v) => typeof v !== 'string' || !isTb1LogMount(v));
  return out;
}

/** The client service of a Terminal-Bench 1 compose file (`client`, else the only one), or why it is refused. */
export function readTb1Compose(raw: unknown): Tb1Client {
  const file = 'docker-compose.yaml';
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new Tb1Problem(file, 'not a mapping of compose keys');
  const top = raw as Record<string, unknown>;
  for (const key of Object.keys(top)) {
    // networks: dropped (one namespace per episode); volumes: the named volumes services share.
    if (!['services', 'version', 'name', 'volumes', 'networks'].includes(key)) throw new Tb1Problem(file, `${printable(key)}: not supported here`);
  }
  const services = top.services;
  if (services === null || typeof services !== 'object' || Array.isArray(services) || Object.keys(services).length === 0) {
    throw new Tb1Problem(file, 'services: missing or empty (Terminal-Bench 1 runs the `client` service)');
  }
  const names = Object.keys(services);
  if (names.length > 1 && !names.includes('client')) {
    throw new Tb1Problem(file, `services: ${names.map((n) => printable(n)).join(', ')}: no \`client\` service (the agent's container, in Terminal-Bench 1)`);
  }
  const service = names.includes('client') ? 'client' : names[0]!;
  if (names.includes('main') && service !== 'main') throw new Tb1Problem(file, 'services.main: the agent\'s container is `main` in the Harbor task this maps to: rename the service');
  const spec = (services as Record<string, unknown>)[service];
  if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) throw new Tb1Problem(file, `services.${printable(service)}: not a mapping`);
  const at = `services.${printable(service)}`;
  const s = spec as Record<string, unknown>;
  for (const key of Object.keys(s)) {
    if (HONOURED_KEYS.has(key) || key in IGNORED_KEYS) continue;
    throw new Tb1Problem(file, `${at}.${printable(key)}: not supported (a sandbox gets no privileges, devices, host namespaces, host paths or published ports)`);
  }
  const named: string[] = [];
  for (const [i, volume] of (s.volumes === undefined ? [] : strings(s.volumes, `${at}.volumes`)).entries()) {
    if (isTb1LogMount(volume)) continue;
    // A named volume of the file (`data:/data[:ro]`), shared with the services that mount it.
    if (/^[A-Za-z0-9][A-Za-z0-9_.-]*:\//.test(volume)) {
      named.push(volume);
      continue;
    }
    throw new Tb1Problem(file, `${at}.volumes.${i}: ${JSON.stringify(printable(volume))}: only Terminal-Bench's own log mounts and named volumes are accepted (a sandbox mounts no host path)`);
  }
  const client: Tb1Client = { service, environment: s.environment === undefined ? [] : environmentOf(s.environment, `${at}.environment`) };
  if (named.length > 0) client.volumes = named;
  if (s.depends_on !== undefined) client.dependsOn = s.depends_on;
  const sidecars = names.filter((n) => n !== service);
  if (sidecars.length > 0) {
    client.sidecars = {};
    for (const n of sidecars) {
      const spec = (services as Record<string, unknown>)[n];
      if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) throw new Tb1Problem(file, `services.${printable(n)}: not a mapping`);
      client.sidecars[n] = sidecarOf(spec as Record<string, unknown>);
    }
  }
  if (top.volumes !== undefined) client.namedVolumes = top.volumes;
  if (s.build !== undefined) {
    const b = typeof s.build === 'string' ? { context: s.build } : s.build;
    if (b === null || typeof b !== 'object') throw new Tb1Problem(file, `${at}.build: a context path or a mapping (got ${typeof s.build})`);
    const { context = '.', dockerfile = 'Dockerfile', ...rest } = b as Record<string, unknown>;
    const extra = Object.keys(rest);
    if (extra.length > 0) throw new Tb1Problem(file, `${at}.build.${printable(extra[0]!)}: not supported (only context and dockerfile)`);
    if (typeof context !== 'string' || typeof dockerfile !== 'string') throw new Tb1Problem(file, `${at}.build: context and dockerfile must be strings`);
    client.build = { context: inside(interpolate(context, `${at}.build.context`), `${at}.build.context`), dockerfile: interpolate(dockerfile, `${at}.build.dockerfile`) };
    inside(path.posix.join(client.build.context, client.build.dockerfile), `${at}.build.dockerfile`);
  } else if (typeof s.image === 'string') {
    client.image = interpolate(s.image, `${at}.image`);
    if (client.image === TB1_VARIABLES.T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME) throw new Tb1Problem(file, `${at}.build: missing (the image is the one Terminal-Bench builds, and nothing says from what)`);
  } else {
    throw new Tb1Problem(file, `${at}: neither build nor image: the task has no image`);
  }
  if (s.working_dir !== undefined) client.workingDir = interpolate(String(s.working_dir), `${at}.working_dir`);
  if (s.entrypoint !== undefined) client.entrypoint = strings(s.entrypoint, `${at}.entrypoint`).map((e, i) => interpolate(e, `${at}.entrypoint.${i}`));
  if (s.user !== undefined) client.user = interpolate(String(s.user), `${at}.user`);
  return client;
}

/** A relative path that stays inside the task folder, normalised ("." for the folder itself). */
function inside(p: string, field: string): string {
  const norm = path.posix.normalize(p.replace(/\\/g, '/'));
  if (path.posix.isAbsolute(norm) || norm === '..' || norm.startsWith('../')) {
    throw new Tb1Problem('docker-compose.yaml', `${field}: ${JSON.stringify(printable(p))} is outside the task folder`);
  }
  return norm.replace(/\/$/, '') || '.';
}

/**
 * The grader our tests/test.sh runs after run-tests.sh: Terminal-Bench 1's pytest parser, in POSIX awk
 * (every image with bash has one): the output after the first "short test summary info" line, each
 * line whose first word is a pytest status and which names a test (the name after "::", a failure's
 * " - reason" cut), the last status of a name kept; passed = PASSED, SKIPPED or XFAIL. The task is
 * solved when every parsed test passed. No summary, or a summary naming no test, writes nothing:
 * the episode then ends as an error (reward_file_missing), never as a 0 nor a 1.
 */
export const TB1_GRADER_AWK = String.raw`
!found { if (tolower($0) ~ /=+[ \t]*short test summary info[ \t]*=+/) found = 1; next }
{
  status = $1; gsub(/"/, "", status)
  if (status !~ /^(PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)$/ || NF < 2) next
  name = $0; sub(/^[ \t]*[^ \t]+[ \t]+/, "", name)
  if (status == "FAILED") sub(/ - .*$/, "", name)
  i = index(name, "::"); if (i > 0) name = substr(name, i + 2)
  sub(/[ \t]+$/, "", name)
  if (!(name in seen)) { order[++n] = name; seen[name] = 1 }
  state[name] = status
}
END {
  if (n == 0) exit 0
  for (k = 1; k <= n; k++) if (state[order[k]] ~ /^(PASSED|SKIPPED|XFAIL)$/) passed++
  printf "{\"reward\": %d, \"tests_passed\": %d, \"tests_total\": %d}\n", (passed == n), passed, n > out
}`;

/** tests/test.sh of a mapped task: run-tests.sh as Terminal-Bench runs it, then the grader. */
export function tb1TestScript(): string {
  return [
    '#!/bin/bash',
    '# Written by rollout-fleet from a Terminal-Bench 1 task: runs its run-tests.sh (as Terminal-Bench does,',
    '# from the container\'s working directory, TEST_DIR=/tests), then grades the output as Terminal-Bench\'s',
    '# pytest parser does. The reward is 1 when every test in pytest\'s short summary passed, else 0.',
    'export TEST_DIR="${TEST_DIR:-/tests}"',
    'mkdir -p /logs/verifier',
    'bash /tests/run-tests.sh > /logs/verifier/run-tests.txt 2>&1',
    'echo "run-tests.sh exited $?"',
    'cat /logs/verifier/run-tests.txt',
    `awk -v out=/logs/verifier/reward.json '${TB1_GRADER_AWK.replace(/'/g, `'\\''`)}' /logs/verifier/run-tests.txt`,
    '',
  ].join('\n');
}

/** solution/solve.sh from solution.yaml: the keystrokes typed, in order, into one bash. */
export function tb1SolutionScript(commands: z.infer<typeof SolutionYaml>): string {
  const typed = commands.map((c) => c.command + (c.append_enter ? '\n' : '')).join('');
  const marker = `ROLLOUT_FLEET_KEYSTROKES_${createHash('sha256').update(typed).digest('hex').slice(0, 16)}`;
  return `#!/bin/bash\n# Written by rollout-fleet from solution.yaml: its keystrokes, typed into one bash in order.\nbash <<'${marker}'\n${typed}${typed.endsWith('\n') ? '' : '\n'}${marker}\n`;
}

/** Dockerfile lines for what the client service sets (after the task's own Dockerfile). */
function dockerfileLines(client: Tb1Client): string[] {
  const quote = (v: string) => JSON.stringify(v);
  const lines = ['', '# Added by rollout-fleet from docker-compose.yaml (Terminal-Bench 1), as Harbor\'s mapper does.'];
  if (!client.environment.some(([k]) => k === 'TEST_DIR')) lines.push('ENV TEST_DIR=/tests');
  for (const [k, v] of client.environment) lines.push(`ENV ${k}=${quote(v)}`);
  if (client.workingDir !== undefined) lines.push(`WORKDIR ${client.workingDir}`);
  if (client.user !== undefined) lines.push(`USER ${client.user}`);
  if (client.entrypoint !== undefined) lines.push(`ENTRYPOINT ${JSON.stringify(client.entrypoint)}`);
  return lines;
}

async function exists(p: string): Promise<boolean> {
  return lstat(p).then(() => true, () => false);
}

/** The generated task.toml: Terminal-Bench 1's fields where Harbor's mapper puts them. */
function taskToml(yaml: Tb1TaskYaml, client: Tb1Client): string {
  const metadata: Record<string, unknown> = { source_format: 'terminal-bench-1' };
  for (const key of ['author_name', 'author_email', 'difficulty', 'category', 'tags', 'estimated_duration_sec', 'expert_time_estimate_min', 'junior_time_estimate_min'] as const) {
    if (yaml[key] !== undefined) metadata[key] = yaml[key];
  }
  const environment: Record<string, unknown> = {};
  if (client.image !== undefined) {
    environment.docker_image = client.image;
    environment.env = Object.fromEntries([['TEST_DIR', '/tests'], ...client.environment]);
    if (client.workingDir !== undefined) environment.workdir = client.workingDir;
  }
  const toml: Record<string, unknown> = {
    version: '1.0',
    metadata,
    agent: { timeout_sec: yaml.max_agent_timeout_sec, ...(client.image !== undefined && client.user !== undefined && { user: client.user }) },
    verifier: { timeout_sec: yaml.max_test_timeout_sec, env: { TEST_DIR: '/tests' } },
    environment,
  };
  return `# Written by rollout-fleet from a Terminal-Bench 1 task.yaml.\n${stringifyToml(toml)}\n`;
}

/** Where mapped folders are kept: FLEET_TASK_CACHE, else a folder of this user's in the temp dir. */
export function tb1CacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.FLEET_TASK_CACHE ?? path.join(os.tmpdir(), `rollout-fleet-tasks-${process.getuid?.() ?? 'user'}`);
}

/**
 * Map the Terminal-Bench 1 folder `dir` (absolute) to a Harbor task folder and return its path. The
 * source is measured by the packer first (so a folder too big for a task is refused before anything
 * is copied), and the mapped folder is reused while the source and this mapper are unchanged.
 */
export async function mapTerminalBench1(dir: string, read: ReadText, cacheDir = tb1CacheDir()): Promise<string> {
  const yamlRaw = withInstruction(yamlOf(await read(path.join(dir, TB1_FILES.yaml)), TB1_FILES.yaml));
  const parsedYaml = Tb1TaskYaml.safeParse(yamlRaw);
  if (!parsedYaml.success) {
    const issue = parsedYaml.error.issues[0]!;
    throw new Tb1Problem(TB1_FILES.yaml, `${issue.path.join('.') || '(top)'}: ${issue.message}`);
  }
  const yaml = parsedYaml.data;
  const composeName = (await Promise.all(TB1_FILES.compose.map((f) => exists(path.join(dir, f))))).findIndex(Boolean);
  if (composeName < 0) throw new Tb1Problem('docker-compose.yaml', 'missing (a Terminal-Bench 1 task names its client service and Dockerfile there)');
  const client = readTb1Compose(yamlOf(await read(path.join(dir, TB1_FILES.compose[composeName]!)), 'docker-compose.yaml'));
  if (!(await exists(path.join(dir, TB1_FILES.runTests)))) throw new Tb1Problem(TB1_FILES.runTests, 'missing (Terminal-Bench 1 grades a task by running it)');
  if (await exists(path.join(dir, 'tests', 'test.sh'))) throw new Tb1Problem('tests/', 'test.sh: the fleet writes its grader there; rename the task\'s own');
  // solution.sh is copied as it is; solution.yaml's keystrokes become a script.
  let solution: string | undefined;
  if (!(await exists(path.join(dir, TB1_FILES.solution))) && (await exists(path.join(dir, TB1_FILES.solutionYaml)))) {
    const parsed = SolutionYaml.safeParse(yamlOf(await read(path.join(dir, TB1_FILES.solutionYaml)), TB1_FILES.solutionYaml));
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      throw new Tb1Problem(TB1_FILES.solutionYaml, `${issue.path.join('.') || '(top)'}: ${issue.message}`);
    }
    solution = tb1SolutionScript(parsed.data);
  }
  let contextDir: string | undefined;
  if (client.build !== undefined) {
    contextDir = path.join(dir, client.build.context);
    if (!(await stat(contextDir).then((s) => s.isDirectory(), () => false))) throw new Tb1Problem('docker-compose.yaml', `services.${client.service}.build.context: ${JSON.stringify(client.build.context)} is not a folder of the task`);
    if (!(await stat(path.join(contextDir, client.build.dockerfile)).then((s) => s.isFile(), () => false))) {
      throw new Tb1Problem('docker-compose.yaml', `services.${client.service}.build.dockerfile: ${JSON.stringify(client.build.dockerfile)} is not a file of the task`);
    }
  }

  // The source, measured and hashed by the packer (its limits refuse a folder too big to be a task).
  const top = (await readdir(dir)).sort();
  let source: string;
  try {
    source = (await packFolder(dir, top, { maxBytes: MAX_TASK_ARCHIVE_BYTES * 2, maxEntries: MAX_TASK_ENTRIES })).digest;
  } catch (err) {
    if (err instanceof PackRefusal) throw new Tb1Problem('(folder)', `cannot be a task: ${printable(err.message)}`);
    throw err;
  }
  const key = createHash('sha256').update(`${MAPPER_VERSION}\n${source}\n${path.basename(dir)}`).digest('hex').slice(0, 32);
  const mapped = path.join(cacheDir, `tb1-${key}`);
  if (await exists(path.join(mapped, 'task.toml'))) return mapped;

  await mkdir(cacheDir, { recursive: true, mode: 0o700 });
  const work = `${mapped}.tmp-${process.pid}-${Date.now()}`;
  await rm(work, { recursive: true, force: true });
  try {
    await mkdir(work, { recursive: true });
    await writeFile(path.join(work, 'task.toml'), taskToml(yaml, client));
    await writeFile(path.join(work, 'instruction.md'), yaml.instruction.endsWith('\n') ? yaml.instruction : `${yaml.instruction}\n`);
    const env = path.join(work, 'environment');
    await mkdir(env);
    if (contextDir !== undefined && client.build !== undefined) {
      // The build context, but for the compose file itself: in a Harbor folder, environment/'s compose
      // file declares services, and this one has been read already.
      const composeFiles = new Set(TB1_FILES.compose.map((f) => path.join(dir, f)));
      await cp(contextDir, env, { recursive: true, verbatimSymlinks: true, errorOnExist: false, filter: (src) => !composeFiles.has(src) });
      const dockerfile = await read(path.join(contextDir, client.build.dockerfile));
      const body = dockerfile.endsWith('\n') ? dockerfile : `${dockerfile}\n`;
      await rm(path.join(env, 'Dockerfile'), { force: true });
      await writeFile(path.join(env, 'Dockerfile'), `${body}${dockerfileLines(client).join('\n')}\n`);
    }
    if (client.sidecars !== undefined) await writeServices(dir, client, contextDir, env);
    const tests = path.join(work, 'tests');
    if (await exists(path.join(dir, 'tests'))) await cp(path.join(dir, 'tests'), tests, { recursive: true, verbatimSymlinks: true });
    else await mkdir(tests);
    await cp(path.join(dir, TB1_FILES.runTests), path.join(tests, 'run-tests.sh'));
    await writeFile(path.join(tests, 'test.sh'), tb1TestScript());
    await chmod(path.join(tests, 'test.sh'), 0o755);
    const hasSolution = solution !== undefined || (await exists(path.join(dir, TB1_FILES.solution)));
    if (hasSolution) {
      await mkdir(path.join(work, 'solution'));
      const solve = path.join(work, 'solution', 'solve.sh');
      if (solution !== undefined) await writeFile(solve, solution);
      else await cp(path.join(dir, TB1_FILES.solution), solve);
      await chmod(solve, 0o755);
    }
    await rename(work, mapped).catch(async (err: NodeJS.ErrnoException) => {
      // Another process mapped the same folder first: its copy is the same.
      if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
      await rm(work, { recursive: true, force: true });
    });
  } catch (err) {
    await rm(work, { recursive: true, force: true });
    throw err;
  }
  return mapped;
}

/**
 * environment/docker-compose.yaml of the mapped task: the client as `main` (its depends_on and named
 * volumes), the sidecars as they were written, a build context of theirs inside environment/ (the
 * client's context is copied there; any other folder of the task is copied under .tb1-services/).
 * What Harbor's compose reader refuses is refused when the mapped task loads, naming the service and key.
 */
async function writeServices(dir: string, client: Tb1Client, clientContext: string | undefined, env: string): Promise<void> {
  const sidecars: Record<string, Record<string, unknown>> = {};
  for (const [name, spec] of Object.entries(client.sidecars ?? {})) {
    const out = { ...spec };
    if (out.build !== undefined) {
      const b = typeof out.build === 'string' ? { context: out.build } : out.build;
      if (b !== null && typeof b === 'object' && !Array.isArray(b)) {
        const at = `services.${printable(name)}.build.context`;
        const { context = '.', ...rest } = b as Record<string, unknown>;
        if (typeof context !== 'string') throw new Tb1Problem('docker-compose.yaml', `${at}: a path (got ${typeof context})`);
        const source = path.join(dir, inside(context, at));
        if (!(await stat(source).then((st) => st.isDirectory(), () => false))) throw new Tb1Problem('docker-compose.yaml', `${at}: ${JSON.stringify(printable(context))} is not a folder of the task`);
        const within = clientContext === undefined ? undefined : path.relative(clientContext, source);
        let mapped: string;
        if (within !== undefined && !within.startsWith('..') && !path.isAbsolute(within)) mapped = `./${within}`;
        else {
          mapped = `./.tb1-services/${name.replace(/[^A-Za-z0-9_.-]/g, '_')}`;
          await cp(source, path.join(env, mapped), { recursive: true, verbatimSymlinks: true });
        }
        out.build = { ...rest, context: mapped };
      }
    }
    sidecars[name] = out;
  }
  const main: Record<string, unknown> = {};
  if (client.dependsOn !== undefined) main.depends_on = client.dependsOn;
  if (client.volumes !== undefined) main.volumes = client.volumes;
  const compose = { services: { main, ...sidecars }, ...(client.namedVolumes !== undefined && { volumes: client.namedVolumes }) };
  await writeFile(path.join(env, 'docker-compose.yaml'), `# Written by rollout-fleet from a Terminal-Bench 1 docker-compose.yaml: its client is main.\n${stringifyYaml(compose)}`);
}

/** True when `dir` holds a Terminal-Bench 1 task: task.yaml with a compose file or run-tests.sh, and no workspace/ of ours. */
export async function isTerminalBench1Folder(dir: string): Promise<boolean> {
  if (!(await exists(path.join(dir, TB1_FILES.yaml)))) return false;
  if (await exists(path.join(dir, 'workspace'))) return false;
  for (const f of [...TB1_FILES.compose, TB1_FILES.runTests]) if (await exists(path.join(dir, f))) return true;
  return false;
}

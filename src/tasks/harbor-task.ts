// A Harbor task folder (task.toml, instruction.md, environment/, tests/test.sh, solution/) resolved to
// the fleet's TaskSpec, as Harbor v0.22.0 would run it, with the fleet's invariants kept:
// - the agent's timeout, unset in Harbor ("no limit"), is bounded by the batch's deadline;
// - the network a phase asks for is recorded, and what runs is capped by the operator (no-network);
// - what the fleet cannot give is refused by name: GPUs, TPUs, Windows, MCP servers; environment/
//   docker-compose.yaml's services are read by harbor-compose.ts, which refuses what would reach past
//   the episode;
// - `${VAR}` in `[environment].env` and the other env tables is read from the enqueuing host only
//   when the name is not a secret's nor a fleet setting's, and never on the API's behalf.
import path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { isSecretName } from '../config/secret-names.ts';
import { printable } from '../errors/printable.ts';
import { ComposeProblem, healthcheckBoundSec, readHarborCompose } from './harbor-compose.ts';
import { HarborTaskToml } from './harbor-toml.ts';
import { formatHostRule, parseHostRules } from '../egress/host-rules.ts';
import {
  BUILTIN_DEFAULTS,
  HARBOR_TEST_COMMAND,
  MAX_INSTRUCTION_BYTES,
  type HarborServices,
  type NetworkMode,
  type TaskDefaults,
} from './task-spec.ts';

/** What of a Harbor task folder the resolver looks at, read by the loader (from disk or a stored archive). */
export interface HarborFolder {
  /** The folder's name: the task id is made from it. */
  name: string;
  tomlText: string;
  instruction: string;
  has: { dockerfile: boolean; compose: boolean; testScript: boolean; testsDockerfile: boolean };
  /** The folders under steps/ (multi-step tasks): each one's instruction.md and what else it holds. */
  steps?: Record<string, HarborStepFolder>;
  /** environment/docker-compose.yaml's text, when the folder has one. */
  composeText?: string;
  /** Whether a file exists in the folder (a "/"-separated path relative to it): sidecar Dockerfiles. */
  exists?: (rel: string) => boolean;
}

export interface HarborStepFolder {
  instruction: string | undefined;
  has: { workdir: boolean; setup: boolean; tests: boolean; testScript: boolean; solution: boolean };
}

/** Where `${VAR}` values come from: the producer's environment, or none (a request to the API). */
export type HostEnv = Readonly<Record<string, string | undefined>>;

/** The image of a Harbor task whose environment/ the worker builds (tagged by its content there). */
export const HARBOR_BUILT_IMAGE = 'rollout-fleet/env:built';

/** A problem of the folder: which file, which field, what is wrong. */
export interface HarborProblem {
  file: 'task.toml' | 'instruction.md' | 'environment/' | 'tests/' | `steps/${string}`;
  message: string;
}

export type HarborResolved = { ok: true; spec: unknown } | { ok: false; problems: HarborProblem[] };

// Harbor's canary lines (H:models/task/task.py): HTML or hash comments naming a canary, then blank lines.
const CANARY_LINE = /^(<!--.*canary.*-->|#.*canary.*)$/i;

/** The instruction as the agent sees it: leading canary lines, and the blank lines after them, removed. */
export function stripCanary(text: string): string {
  const lines = text.split('\n');
  let i = 0;
  while (i < lines.length && CANARY_LINE.test(lines[i]!.trim())) i++;
  while (i < lines.length && lines[i]!.trim() === '') i++;
  return lines.slice(i).join('\n');
}

/** Settings of the fleet that a task must never read into its sandbox, whatever their names end with. */
const FLEET_SETTING = /^(REDIS_|MODEL_|FLEET_|AWS_|S3_|DOCKER_|OPENAI_|ANTHROPIC_|API_)/;

/** The task id a folder name gives: lower-case, other characters as "-", at most 63. */
export function harborTaskId(folderName: string): string {
  const id = folderName
    .toLowerCase()
    .replace(/[^a-z0-9_-]+/g, '-')
    .replace(/^[^a-z0-9]+/, '')
    .slice(0, 63);
  return id === '' ? 'task' : id;
}

/** `${VAR}` and `${VAR:-default}` in `value`, from `host`; problems name the table and the key. */
function interpolate(value: string, field: string, host: HostEnv, problems: HarborProblem[]): string {
  return value.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g, (_m, name: string, fallback: string | undefined) => {
    if (isSecretName(name) || FLEET_SETTING.test(name)) {
      problems.push({ file: 'task.toml', message: `${field}: \${${name}} would read a secret or a setting of the fleet into the sandbox; write the value itself` });
      return '';
    }
    const found = host[name];
    if (found !== undefined) return found;
    if (fallback !== undefined) return fallback;
    problems.push({ file: 'task.toml', message: `${field}: \${${name}} is not set where the batch was enqueued, and has no default (write \${${name}:-value})` });
    return '';
  });
}

function resolveEnv(table: Record<string, string>, field: string, host: HostEnv, problems: HarborProblem[]): Record<string, string> {
  return Object.fromEntries(Object.entries(table).map(([k, v]) => [k, interpolate(v, `${field}.${k}`, host, problems)]));
}

/** "field: message (got value)" lines for what zod refused. */
type Describe = (error: import('zod').ZodError, input: unknown) => string[];

/**
 * The TaskSpec (not yet validated: the caller parses it with TaskSpec, so every message names its
 * field) of a Harbor task folder, against the batch defaults, or the problems that refuse it.
 */
export function resolveHarborTask(folder: HarborFolder, defaults: TaskDefaults, host: HostEnv, describe: Describe): HarborResolved {
  const problems: HarborProblem[] = [];
  let raw: unknown;
  try {
    raw = parseToml(folder.tomlText);
  } catch (err) {
    // smol-toml's message names the line and column, then quotes the line: only the first line is kept.
    const first = printable(String((err as Error).message).split('\n')[0] ?? '');
    return { ok: false, problems: [{ file: 'task.toml', message: `not valid TOML: ${first}` }] };
  }
  const parsed = HarborTaskToml.safeParse(raw);
  if (!parsed.success) return { ok: false, problems: describe(parsed.error, raw).map((message) => ({ file: 'task.toml', message })) };
  const toml = parsed.data;
  const env = toml.environment;

  // What the fleet cannot give, refused by name (gpus = 0 and mcp_servers = [], as published tasks write them, are fine).
  if ((env.gpus ?? 0) > 0) problems.push({ file: 'task.toml', message: `environment.gpus: this fleet's sandboxes have no GPUs (got ${env.gpus})` });
  if (env.tpu !== undefined) problems.push({ file: 'task.toml', message: 'environment.tpu: this fleet\'s sandboxes have no TPUs (got a value)' });
  if (env.os.toLowerCase() !== 'linux') problems.push({ file: 'task.toml', message: `environment.os: only "linux" runs here (got ${JSON.stringify(printable(env.os))})` });
  if ((env.mcp_servers?.length ?? 0) > 0) problems.push({ file: 'task.toml', message: `environment.mcp_servers: MCP servers beside the agent are not supported (got ${env.mcp_servers!.length})` });
  const tomlSteps = toml.steps ?? [];
  const multiStep = tomlSteps.length > 0;
  // Harbor's separate verifier: [verifier.environment] (or tests/Dockerfile, or environment_mode = "separate").
  const separate = toml.verifier.environment !== undefined || toml.verifier.environment_mode === 'separate' || folder.has.testsDockerfile;
  if (toml.verifier.environment_mode === 'shared' && (toml.verifier.environment !== undefined || folder.has.testsDockerfile)) {
    problems.push({ file: 'task.toml', message: 'verifier.environment_mode: "shared" with a verifier environment ([verifier.environment] or tests/Dockerfile): say "separate", or remove the environment' });
  }
  const venv = toml.verifier.environment;
  if (venv !== undefined) {
    if ((venv.gpus ?? 0) > 0) problems.push({ file: 'task.toml', message: `verifier.environment.gpus: this fleet's sandboxes have no GPUs (got ${venv.gpus})` });
    if (venv.os.toLowerCase() !== 'linux') problems.push({ file: 'task.toml', message: `verifier.environment.os: only "linux" runs here (got ${JSON.stringify(printable(venv.os))})` });
  }
  const artifacts = (toml.artifacts ?? []).map((a, i) => {
    const entry = typeof a === 'string' ? { source: a } : a;
    if ((entry.exclude?.length ?? 0) > 0) problems.push({ file: 'task.toml', message: `artifacts.${i}.exclude: not supported yet (got ${entry.exclude!.length} patterns)` });
    if (!entry.source.startsWith('/')) problems.push({ file: 'task.toml', message: `artifacts.${i}.source: an absolute path in the agent's container (got ${JSON.stringify(printable(entry.source))})` });
    // `destination` is where Harbor saves it on its host: here /logs and the verifier's copies are the evidence.
    return { source: entry.source, ...(entry.service !== undefined && entry.service !== 'main' && { service: entry.service }) };
  });
  const collect = (toml.verifier.collect ?? []).map((c) => ({
    command: c.command, timeoutSec: c.timeout_sec,
    ...(c.user !== undefined && { user: c.user }),
    ...(c.service !== 'main' && { service: c.service }),
  }));
  let services: HarborServices | undefined;
  if (folder.has.compose) {
    try {
      services = readHarborCompose(folder.composeText ?? '', {
        cpus: env.cpus ?? defaults.limits?.cpus ?? BUILTIN_DEFAULTS.limits.cpus,
        memoryMb: env.memory_mb ?? env.memory ?? defaults.limits?.memoryMb ?? BUILTIN_DEFAULTS.limits.memoryMb,
        buildTimeoutSec: env.build_timeout_sec,
        exists: folder.exists ?? (() => false),
      }, host);
    } catch (err) {
      if (!(err instanceof ComposeProblem)) throw err;
      problems.push({ file: 'environment/', message: `docker-compose.yaml: ${err.message}` });
    }
  }
  // A collect hook or an artifact of a sidecar names one of the compose file's services.
  const sidecarNames = new Set((services?.sidecars ?? []).map((s) => s.name));
  const checkService = (field: string, service: string | undefined) => {
    if (service === undefined || sidecarNames.has(service)) return;
    const known = sidecarNames.size > 0 ? `its services are main, ${[...sidecarNames].join(', ')}` : 'the task has no environment/docker-compose.yaml services';
    problems.push({ file: 'task.toml', message: `${field}: no such task service (got ${JSON.stringify(printable(service))}; ${known})` });
  };
  artifacts.forEach((a, i) => checkService(`artifacts.${i}.service`, a.service));
  collect.forEach((c, i) => checkService(`verifier.collect.${i}.service`, c.service));
  if (!folder.has.testScript && !multiStep) problems.push({ file: 'tests/', message: 'test.sh: missing (Harbor runs tests/test.sh, which writes /logs/verifier/reward.txt or reward.json)' });
  if (env.docker_image === undefined && !folder.has.dockerfile) {
    problems.push({ file: 'environment/', message: 'Dockerfile: missing, and task.toml sets no environment.docker_image: the task has no image' });
  }

  const checkInstruction = (text: string, file: HarborProblem['file']): string => {
    const stripped = stripCanary(text);
    const bytes = Buffer.byteLength(stripped);
    if (stripped.trim() === '') problems.push({ file, message: 'empty (after its canary lines): the agent would have nothing to do' });
    else if (bytes > MAX_INSTRUCTION_BYTES) problems.push({ file, message: `at most ${MAX_INSTRUCTION_BYTES} bytes (got ${bytes} bytes)` });
    return stripped;
  };
  // Multi-step: each step's folder under steps/ gives its instruction, tests and solution.
  const steps = tomlSteps.map((step, i) => {
    const dir = folder.steps?.[step.name];
    const at = `steps/${step.name}` as const;
    if (dir === undefined) {
      problems.push({ file: 'task.toml', message: `steps.${i}.name: no folder steps/${printable(step.name)}/ (it holds the step's instruction.md and tests)` });
      return undefined;
    }
    if (dir.instruction === undefined) problems.push({ file: at, message: 'instruction.md: missing' });
    if (!dir.has.testScript && !folder.has.testScript) problems.push({ file: at, message: 'tests/test.sh: missing, and the task has no tests/test.sh for every step' });
    if ((step.artifacts?.length ?? 0) > 0) problems.push({ file: 'task.toml', message: `steps.${i}.artifacts: per-step artifacts are not supported yet (got ${step.artifacts!.length})` });
    const hc = step.healthcheck;
    return {
      name: step.name,
      instruction: checkInstruction(dir.instruction ?? 'x', `${at}/instruction.md` as HarborProblem['file']),
      agentTimeoutSec: step.agent.timeout_sec ?? toml.agent.timeout_sec ?? defaults.deadlineSec ?? BUILTIN_DEFAULTS.deadlineSec,
      verifierTimeoutSec: step.verifier.timeout_sec ?? toml.verifier.timeout_sec,
      ...((step.agent.user ?? toml.agent.user) !== undefined && { agentUser: step.agent.user ?? toml.agent.user }),
      ...((step.verifier.user ?? toml.verifier.user) !== undefined && { verifierUser: step.verifier.user ?? toml.verifier.user }),
      verifierEnv: { ...resolveEnv(toml.verifier.env, 'verifier.env', host, problems), ...resolveEnv(step.verifier.env, `steps.${i}.verifier.env`, host, problems) },
      ...(step.min_reward !== undefined && { minReward: typeof step.min_reward === 'number' ? { reward: step.min_reward } : step.min_reward }),
      ...(hc && { healthcheck: { command: hc.command, intervalSec: hc.interval_sec, timeoutSec: hc.timeout_sec, startPeriodSec: hc.start_period_sec, startIntervalSec: hc.start_interval_sec, retries: hc.retries } }),
      has: { workdir: dir.has.workdir, setup: dir.has.setup, tests: dir.has.tests, solution: dir.has.solution },
    };
  });
  const instruction = multiStep && folder.instruction.trim() === '' ? (steps[0]?.instruction ?? '') : checkInstruction(folder.instruction, 'instruction.md');

  const agentEnv = resolveEnv(env.env, 'environment.env', host, problems);
  const verifierEnv = resolveEnv(toml.verifier.env, 'verifier.env', host, problems);
  const solutionEnv = resolveEnv(toml.solution.env, 'solution.env', host, problems);
  const separateEnv = venv === undefined ? {} : resolveEnv(venv.env, 'verifier.environment.env', host, problems);
  if (problems.length > 0) return { ok: false, problems };

  // allow_internet (deprecated): true is "public", false "no-network"; Harbor's default is public.
  const taskNetwork: NetworkMode = env.network_mode ?? (env.allow_internet === false ? 'no-network' : 'public');
  // allowed_hosts of a phase, else the environment's; each entry checked here, kept normalized.
  const hostsOf = (own: string[] | undefined, field: string) => {
    const entries = own ?? env.allowed_hosts ?? [];
    const { rules, problems: bad } = parseHostRules(entries, own !== undefined ? field : 'environment.allowed_hosts');
    for (const message of bad) problems.push({ file: 'task.toml', message });
    return rules.map(formatHostRule);
  };
  const allowedHosts = { agent: hostsOf(toml.agent.allowed_hosts, 'agent.allowed_hosts'), verifier: hostsOf(toml.verifier.allowed_hosts, 'verifier.allowed_hosts') };
  if (problems.length > 0) return { ok: false, problems };
  const network = { agent: toml.agent.network_mode ?? taskNetwork, verifier: toml.verifier.network_mode ?? taskNetwork, allowedHosts };

  const hc = env.healthcheck;
  const healthcheck = hc && {
    command: hc.command, intervalSec: hc.interval_sec, timeoutSec: hc.timeout_sec,
    startPeriodSec: hc.start_period_sec, startIntervalSec: hc.start_interval_sec, retries: hc.retries,
  };
  // The healthcheck runs in set-up: its worst case (the start period, then every retry timing out) is
  // added to the set-up reserve, so a slow but healthy service is not cut short by the fleet.
  const healthcheckSec = (healthcheck ? healthcheck.startPeriodSec + healthcheck.retries * (healthcheck.intervalSec + healthcheck.timeoutSec) : 0)
    // The sidecars' healthchecks are waited for one after another in the worst case, and their builds are set-up time too.
    + (services?.sidecars ?? []).reduce((n, s) => n + (s.healthcheck ? healthcheckBoundSec(s.healthcheck) : 0) + (s.image.from === 'build' ? s.image.timeoutSec : 0), 0);
  const setupSec = (defaults.reserves?.setupSec ?? BUILTIN_DEFAULTS.reserves.setupSec) + healthcheckSec;
  // A separate verifier also runs the collect hooks and creates its container within the reserve.
  const stepsRun = steps.filter((st) => st !== undefined);
  const verifySec = multiStep
    ? stepsRun.reduce((sum, st) => sum + st.verifierTimeoutSec + 10, 0)
    : toml.verifier.timeout_sec + 10 + (separate ? 30 + collect.reduce((sum, c) => sum + c.timeoutSec, 0) : 0);
  const closeSec = defaults.reserves?.closeSec ?? BUILTIN_DEFAULTS.reserves.closeSec;
  // Harbor's unset agent timeout means no limit; here the batch's deadline (or the fleet's) bounds it.
  const agentSec = multiStep
    ? stepsRun.reduce((sum, st) => sum + st.agentTimeoutSec, 0)
    : toml.agent.timeout_sec ?? defaults.deadlineSec ?? BUILTIN_DEFAULTS.deadlineSec;

  const workdir = env.workdir;
  const memoryMb = env.memory_mb ?? env.memory;
  const diskMb = env.storage_mb ?? env.storage;
  const spec = {
    id: harborTaskId(folder.name),
    instruction,
    image: env.docker_image ?? HARBOR_BUILT_IMAGE,
    workdir: workdir ?? '/',
    verify: { command: HARBOR_TEST_COMMAND, timeoutSec: multiStep ? Math.max(...stepsRun.map((st) => st.verifierTimeoutSec)) : toml.verifier.timeout_sec },
    deadlineSec: setupSec + agentSec + verifySec + closeSec,
    limits: {
      ...BUILTIN_DEFAULTS.limits,
      ...defaults.limits,
      ...(memoryMb !== undefined && { memoryMb }),
      ...(env.cpus !== undefined && { cpus: env.cpus }),
      ...(diskMb !== undefined && { diskMb }),
    },
    reserves: { setupSec, verifySec, closeSec },
    harbor: {
      ...(toml.schema_version ?? toml.version ? { schemaVersion: toml.schema_version ?? toml.version } : {}),
      ...(env.docker_image !== undefined && { dockerImage: env.docker_image }),
      ...(folder.has.dockerfile && { build: { timeoutSec: env.build_timeout_sec } }),
      uploadEnvironment: !folder.has.dockerfile,
      workdirFromImage: workdir === undefined,
      ...(toml.agent.user !== undefined && { agentUser: toml.agent.user }),
      ...(toml.verifier.user !== undefined && { verifierUser: toml.verifier.user }),
      env: agentEnv,
      verifierEnv,
      solutionEnv,
      ...(healthcheck && { healthcheck }),
      ...(services && { services }),
      network,
      ...(separate && {
        separateVerifier: {
          ...(venv?.docker_image !== undefined && { dockerImage: venv.docker_image }),
          ...(folder.has.testsDockerfile && { build: { timeoutSec: venv?.build_timeout_sec ?? env.build_timeout_sec } }),
          ...(venv?.workdir !== undefined && { workdir: venv.workdir }),
          env: separateEnv,
          limits: {
            ...((venv?.memory_mb ?? venv?.memory) !== undefined && { memoryMb: venv!.memory_mb ?? venv!.memory }),
            ...(venv?.cpus !== undefined && { cpus: venv.cpus }),
          },
        },
      }),
      artifacts,
      collect,
      ...(multiStep && { steps: stepsRun, stepStrategy: toml.multi_step_reward_strategy ?? 'mean' }),
    },
  };
  return { ok: true, spec };
}

/** The files of a Harbor folder that the resolver needs, by their paths inside the folder. */
export const HARBOR_FILES = {
  toml: 'task.toml',
  instruction: 'instruction.md',
  dockerfile: path.posix.join('environment', 'Dockerfile'),
  compose: ['environment/docker-compose.yaml', 'environment/docker-compose.yml'],
  testScript: path.posix.join('tests', 'test.sh'),
  testsDockerfile: path.posix.join('tests', 'Dockerfile'),
} as const;

// The task format: a folder with task.yaml, workspace/ (copied in at set-up), tests/ (copied in only
// for verification, after the agent stopped) and an optional solution/. This file holds the schemas of
// task.yaml as written (TaskFile) and of a task fully resolved against batch defaults (TaskSpec).
// A leaf (it imports nothing of the repository): the episode job's contract parses it, on the producer
// and on the worker, so what it refuses never reaches the engine or the sandbox.
import { z } from 'zod';

export const DEFAULT_IMAGE = 'rollout-fleet/sandbox:busybox';

// Image references, checked against the grammar of distribution/reference before any engine call:
// dockerode puts the name into the request path unescaped, so "..//host:port/x" would make the
// client send its request to another host, and "busybox; rm -rf /" reaches the engine as a 400.
//   reference   := name [ ":" tag ] [ "@" digest ]
//   name        := [domain '/'] remote-name; domain := (domain-name | '[' IPv6 ']') [':' port]
//   remote-name := path-component ['/' path-component]*; path-component := [a-z0-9]+ (separator [a-z0-9]+)*
//   separator   := [_.] | __ | [-]+;  tag := [\w][\w.-]{0,127}
//   digest      := sha256 ":" hex{64} | sha384 ":" hex{96} | sha512 ":" hex{128}, lower-case hex (the
//                  algorithms the engine accepts; the grammar's looser form only earns a 400 from it)
const ALPHANUMERIC = '[a-z0-9]+';
const PATH_COMPONENT = `${ALPHANUMERIC}(?:(?:[._]|__|[-]+)${ALPHANUMERIC})*`;
const DOMAIN_COMPONENT = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const DOMAIN = `(?:${DOMAIN_COMPONENT}(?:\\.${DOMAIN_COMPONENT})*|\\[[a-fA-F0-9:]+\\])(?::[0-9]+)?`;
const IMAGE_NAME = `(?:${DOMAIN}/)?${PATH_COMPONENT}(?:/${PATH_COMPONENT})*`;
const IMAGE_REFERENCE = new RegExp(
  `^(${IMAGE_NAME})(?::[\\w][\\w.-]{0,127})?(?:@(?:sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128}))?$`,
);
/** distribution/reference's limit on the name (without tag and digest). */
const MAX_IMAGE_NAME_LENGTH = 255;
/** Longer strings are not matched at all (a backtracking regex must not see 200 KiB). */
const MAX_IMAGE_REFERENCE_LENGTH = 512;

/** Whether `ref` is a well-formed image reference (and so names an image, nothing else). */
export function isImageReference(ref: string): boolean {
  if (ref.length > MAX_IMAGE_REFERENCE_LENGTH) return false;
  const match = IMAGE_REFERENCE.exec(ref);
  return match !== null && (match[1]?.length ?? Infinity) <= MAX_IMAGE_NAME_LENGTH;
}

export const ImageReference = z
  .string()
  .refine(isImageReference, 'not a valid image reference: [registry[:port]/]lower-case/path[:tag][@sha256:<hex>]');

const seconds = z.number().positive().max(7 * 24 * 3600);

export const Limits = z.object({
  /** Memory limit of the sandbox; swap is not allowed beyond it. @default 512 */
  memoryMb: z.number().int().min(16).max(65_536),
  /** CPU limit of the sandbox, in cores. @default 1 */
  cpus: z.number().positive().max(64),
  /** Process limit of the sandbox (fork bombs stop here). @default 256 */
  pids: z.number().int().min(8).max(32_768),
  /**
   * Disk the sandbox may write (its writable layer: the workdir, /tmp, anything outside the read-only
   * mounts). Enforced by the engine where it can (StorageOpt size: overlay2 on xfs with pquota, btrfs), else watched during
   * the agent, which is stopped past it (kind agent, `disk_limit_exceeded`). @default 2048
   */
  diskMb: z.number().int().min(16).max(1_048_576),
});
export type Limits = z.infer<typeof Limits>;

/**
 * Time set aside inside the episode deadline for everything that is not the agent. The agent's
 * ceiling is deadlineSec minus these; a batch whose reserves leave no positive ceiling is rejected.
 */
export const Reserves = z.object({
  /** Creating the sandbox and copying the workspace in. @default 60 */
  setupSec: seconds,
  /** Copying the tests in and running the verifier; at least verify.timeoutSec. @default verify.timeoutSec + 10 */
  verifySec: seconds,
  /** Collecting evidence and handing the sandbox to the cleanup queue. @default 30 */
  closeSec: seconds,
});
export type Reserves = z.infer<typeof Reserves>;

export const BUILTIN_DEFAULTS = {
  image: DEFAULT_IMAGE,
  workdir: '/workspace',
  deadlineSec: 600,
  limits: { memoryMb: 512, cpus: 1, pids: 256, diskMb: 2048 },
  reserves: { setupSec: 60, closeSec: 30 },
} as const;

const taskId = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_-]{0,62}$/, 'lower-case letters, digits, - and _, at most 63 characters');

const absolutePath = z
  .string()
  .regex(/^\/[^\0]*$/, 'must be an absolute path')
  .refine((p) => !p.split('/').includes('..'), 'must not contain ..');

/**
 * Folders of the sandbox the fleet owns or the kernel provides: a workdir there would be overwritten
 * by the workspace copy, hide the tests or the runtime, or point into /proc. The same paths are
 * spelled where they are used (TESTS_DIR, SOLUTION_DIR, RUNTIME_MOUNT_PATH, AGENT_INPUT_PATH's
 * folder); test/unit/task-limits.test.ts checks the two lists agree.
 */
export const RESERVED_SANDBOX_PATHS = ['/proc', '/sys', '/dev', '/tests', '/solution', '/opt/rollout-fleet', '/tmp/rollout-agent'] as const;

/** The path with duplicate slashes, "." segments and a trailing slash gone ("//proc/./" is "/proc"). */
function normalizeAbsolute(p: string): string {
  const parts = p.split('/').filter((s) => s !== '' && s !== '.');
  return `/${parts.join('/')}`;
}

/** Why `p` cannot be a task's workdir, or undefined. Harbor tasks may work in "/" (they copy no workspace). */
function workdirProblem(p: string, allowRoot: boolean): string | undefined {
  const norm = normalizeAbsolute(p);
  if (norm === '/') return allowRoot ? undefined : 'must not be / (the workspace is copied into it)';
  const reserved = RESERVED_SANDBOX_PATHS.find((r) => norm === r || norm.startsWith(`${r}/`));
  return reserved === undefined ? undefined : `must not be in ${reserved} (reserved in the sandbox)`;
}

const workdirPath = absolutePath.superRefine((p, ctx) => {
  const problem = workdirProblem(p, false);
  if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
});

/**
 * Every agent must be able to deliver the instruction: the command agent passes it in one environment
 * string (Linux caps one at 128 KiB, MAX_ARG_STRLEN), the llm agent in its first message. 64 KiB
 * leaves room for the variable's name and for more than one such string under the total ARG_MAX.
 */
export const MAX_INSTRUCTION_BYTES = 64 * 1024;
/** A command is one argument of `sh -c`: the same 128 KiB per-string cap applies; same margin. */
export const MAX_COMMAND_BYTES = 64 * 1024;

/** A non-empty string of at most `max` bytes of UTF-8; the message names the limit and the size found. */
export function boundedText(max: number) {
  return z
    .string()
    .min(1)
    .superRefine((s, ctx) => {
      const bytes = Buffer.byteLength(s);
      if (bytes > max) ctx.addIssue({ code: 'custom', message: `at most ${max} bytes (got ${bytes} bytes)` });
    });
}
const instruction = boundedText(MAX_INSTRUCTION_BYTES);
const command = boundedText(MAX_COMMAND_BYTES);

/**
 * How the verifier's run becomes a reward: `exit-code` (exit 0 is 1, exit 1 is 0, anything else a
 * broken verifier), or `file`: the verifier writes /logs/verifier/reward.json (an object of numbers) or
 * reward.txt (one float), read as a Harbor task's are, its exit code ignored.
 */
export const RewardSource = z.enum(['exit-code', 'file']);

export const Verify = z.object({
  /** Shell command run in the workdir after the tests were copied to /tests. Exit 0 passes, 1 fails. */
  command,
  /** The verifier is stopped after this long and the episode ends with kind verifier. @default 60 */
  timeoutSec: seconds.default(60),
  /** Where the reward comes from. @default exit-code */
  reward: RewardSource.optional(),
});

/** task.yaml as written: everything but id, instruction and verify may come from batch defaults. */
export const TaskFile = z.strictObject({
  id: taskId,
  instruction,
  image: ImageReference.optional(),
  workdir: workdirPath.optional(),
  verify: Verify.strict(),
  deadlineSec: seconds.optional(),
  limits: Limits.partial().strict().optional(),
  reserves: Reserves.partial().strict().optional(),
});
export type TaskFile = z.infer<typeof TaskFile>;

/** The fields a batch may set for all of its tasks. */
export const TaskDefaults = z.strictObject({
  image: ImageReference.optional(),
  workdir: workdirPath.optional(),
  deadlineSec: seconds.optional(),
  limits: Limits.partial().strict().optional(),
  reserves: Reserves.partial().strict().optional(),
});
export type TaskDefaults = z.infer<typeof TaskDefaults>;

/** The network a Harbor task asks for in a phase (what the fleet applies is capped by the operator). */
export const NetworkMode = z.enum(['public', 'no-network', 'allowlist']);
export type NetworkMode = z.infer<typeof NetworkMode>;

/** Environment variables handed to one phase: names as a shell takes them, 64 KiB in all. */
export const PhaseEnv = z
  .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'an environment variable name'), z.string())
  .superRefine((env, ctx) => {
    const bytes = Object.entries(env).reduce((n, [k, v]) => n + Buffer.byteLength(k) + Buffer.byteLength(v) + 2, 0);
    if (bytes > 64 * 1024) ctx.addIssue({ code: 'custom', message: `at most 65536 bytes of names and values (got ${bytes} bytes)` });
  });

/** Where Harbor puts what the agent and the verifier leave, inside the sandbox. */
export const HARBOR_LOGS_DIR = '/logs';
/** How Harbor runs a task's tests (H:verifier/verifier.py): the script's exit code is ignored, the reward file counts. */
export const HARBOR_TEST_COMMAND = '(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1';

const HealthcheckSpec = z.strictObject({
  command,
  intervalSec: seconds,
  timeoutSec: seconds,
  startPeriodSec: z.number().min(0).max(24 * 3600),
  startIntervalSec: seconds,
  retries: z.number().int().min(1).max(1_000),
});

/**
 * What a root agent of a Harbor task keeps of Docker's default capabilities: owning, reading and
 * writing any file, setting ids (apt, su), signalling, binding low ports. Dropped: NET_RAW, MKNOD,
 * AUDIT_WRITE, SETFCAP, SETPCAP and SYS_CHROOT, which no task of a no-network sandbox needs.
 * Every task service gets the same; a compose file asking for more is refused (harbor-compose.ts).
 */
export const HARBOR_CAPABILITIES = ['CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'SETGID', 'SETUID', 'NET_BIND_SERVICE'] as const;

/** A service name of a task's docker-compose.yaml (compose's own rule), also its host name in the episode. */
const ServiceName = z.string().regex(/^[a-z0-9][a-z0-9_.-]{0,62}$/, 'a compose service name: lower-case letters, digits, "_", "." and "-"');
const ExecForm = z.array(z.string().max(MAX_COMMAND_BYTES)).max(256);

/** A healthcheck of a compose service: an exec form run in the service until it exits 0, bounded. */
export const ServiceHealthcheck = z.strictObject({
  /** The exec form (CMD-SHELL becomes ["/bin/sh", "-c", text]). */
  test: ExecForm.min(1),
  intervalSec: seconds,
  timeoutSec: seconds,
  retries: z.number().int().min(1).max(1_000),
  startPeriodSec: z.number().min(0).max(24 * 3600),
});

const ServiceMount = z.strictObject({ volume: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/), target: z.string().startsWith('/').max(4096), readOnly: z.boolean() });
const DependsOn = z.strictObject({ service: ServiceName, condition: z.enum(['service_started', 'service_healthy']) });

/** A sidecar of a Harbor task (a service of environment/docker-compose.yaml other than main). */
export const HarborSidecar = z.strictObject({
  name: ServiceName,
  /** From `image:` (the engine must have it), `${MAIN_IMAGE_NAME}` (the agent's image), or `build:`. */
  image: z.discriminatedUnion('from', [
    z.strictObject({ from: z.literal('image'), reference: ImageReference }),
    z.strictObject({ from: z.literal('main') }),
    z.strictObject({
      from: z.literal('build'),
      /** The context's folder inside the task archive (e.g. environment/api). */
      context: z.string().regex(/^environment(\/[^/]+)*$/).max(1024),
      dockerfile: z.string().max(1024),
      timeoutSec: seconds,
    }),
  ]),
  entrypoint: ExecForm.optional(),
  command: ExecForm.optional(),
  env: PhaseEnv,
  workdir: z.string().startsWith('/').max(4096).optional(),
  user: z.string().max(65).optional(),
  expose: z.array(z.number().int().min(1).max(65535)).max(64),
  healthcheck: ServiceHealthcheck.optional(),
  dependsOn: z.array(DependsOn).max(64),
  mounts: z.array(ServiceMount).max(64),
});
export type HarborSidecar = z.infer<typeof HarborSidecar>;

/** environment/docker-compose.yaml as the fleet runs it (src/tasks/harbor-compose.ts, src/sandbox/task-services.ts). */
export const HarborServices = z.strictObject({
  /** Named volumes (top-level `volumes:`), one per episode, shared by the services mounting them. */
  volumes: z.array(z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/)).max(64),
  sidecars: z.array(HarborSidecar).min(1).max(16), // harbor-compose.ts's MAX_SIDECARS, refused there with the file's name
  /** main's entries of the compose file: what the agent's container waits for and mounts. */
  main: z.strictObject({ dependsOn: z.array(DependsOn).max(64), mounts: z.array(ServiceMount).max(64), env: PhaseEnv }),
});
export type HarborServices = z.infer<typeof HarborServices>;

/**
 * How a Harbor task folder (task.toml) runs, as resolved at enqueue (src/tasks/harbor-task.ts): the
 * image comes from `docker_image` when the engine has it, else from environment/ built by the fleet;
 * every command is `bash -c` in the workdir as the phase's user; the reward is the verifier's reward
 * file, not its exit code.
 */
export const HarborRun = z.strictObject({
  /** task.toml's schema_version (or version), as written. */
  schemaVersion: z.string().max(32).optional(),
  /** `[environment].docker_image`: used when the engine has it (there is no registry to pull from). */
  dockerImage: ImageReference.optional(),
  /** environment/ has a Dockerfile: built per engine (named by its content) when dockerImage is missing. */
  build: z.strictObject({ timeoutSec: seconds }).optional(),
  /** Only docker_image, no Dockerfile: the files of environment/ are copied into the workdir after start. */
  uploadEnvironment: z.boolean(),
  /** No `[environment].workdir`: the image's WORKDIR (else /) is the workdir of every exec. */
  workdirFromImage: z.boolean(),
  /** `[agent].user` (the oracle and command agents run as it); unset, the image's USER. */
  agentUser: z.string().max(65).optional(),
  /** `[verifier].user`; unset, the image's USER. */
  verifierUser: z.string().max(65).optional(),
  /** `[environment].env`, resolved: the agent's (and the healthcheck's) environment. */
  env: PhaseEnv,
  /** `[verifier].env`: the verifier's environment. */
  verifierEnv: PhaseEnv,
  /** `[solution].env`: the oracle's environment (with DEBIAN_FRONTEND=noninteractive). */
  solutionEnv: PhaseEnv,
  /** `[environment.healthcheck]`: run until it passes before the agent starts. */
  healthcheck: HealthcheckSpec.optional(),
  /** environment/docker-compose.yaml's services beside main (task services). */
  services: HarborServices.optional(),
  /** The network each phase asked for; the agent and the verifier run with what the operator allows (recorded in the result). */
  network: z.strictObject({
    agent: NetworkMode,
    verifier: NetworkMode,
    /** Each phase's `allowed_hosts` (else [environment]'s), normalized (src/egress/host-rules.ts); absent in jobs enqueued before it. */
    allowedHosts: z.strictObject({ agent: z.array(z.string().max(262)).max(1_000), verifier: z.array(z.string().max(262)).max(1_000) }).optional(),
  }),
  /**
   * `[verifier.environment]` or tests/Dockerfile: the verifier runs in a container of its own (Harbor's
   * separate mode), from its docker_image, else tests/ built (tests/Dockerfile), else the agent's image
   * afresh; it sees the declared artifacts and /logs/artifacts, nothing else of the agent's container.
   */
  separateVerifier: z.strictObject({
    dockerImage: ImageReference.optional(),
    build: z.strictObject({ timeoutSec: seconds }).optional(),
    /** `[verifier.environment].workdir`; unset, the verifier image's WORKDIR (else /). */
    workdir: absolutePath.optional(),
    /** `[verifier.environment].env`: the verifier container's environment. */
    env: PhaseEnv,
    limits: z.strictObject({ memoryMb: z.number().int().positive().optional(), cpus: z.number().positive().optional() }),
  }).optional(),
  /**
   * `artifacts`: paths that a separate verifier gets, at the same absolute paths: of the agent's
   * container, or of the task service `service` names.
   */
  artifacts: z.array(z.strictObject({ source: absolutePath, service: z.string().max(64).optional() })).max(100).default([]),
  /**
   * `[[steps]]`: one environment, the steps in order (Harbor's multi-step tasks). Each has its own
   * instruction, agent and verifier timeouts, steps/<name>/workdir/ (and its setup.sh) put into the
   * workdir first, its tests/ over the task's, and a min_reward gate that stops the later steps.
   */
  steps: z.array(z.strictObject({
    name: z.string().max(64),
    instruction,
    agentTimeoutSec: seconds,
    verifierTimeoutSec: seconds,
    agentUser: z.string().max(65).optional(),
    verifierUser: z.string().max(65).optional(),
    verifierEnv: PhaseEnv,
    minReward: z.record(z.string(), z.number()).optional(),
    healthcheck: HealthcheckSpec.optional(),
    has: z.strictObject({ workdir: z.boolean(), setup: z.boolean(), tests: z.boolean(), solution: z.boolean() }),
  })).max(50).optional(),
  /** Set on the task a step of a multi-step task runs as: the step's name (its solution, its tests). */
  currentStep: z.string().max(64).optional(),
  /** `multi_step_reward_strategy`: the per-key mean over the steps graded, or the last step graded. */
  stepStrategy: z.enum(['mean', 'final']).optional(),
  /**
   * `[[verifier.collect]]`: run after the agent, before anything is copied out (best effort), in the
   * agent's container, or in the task service `service` names.
   */
  collect: z.array(z.strictObject({ command, timeoutSec: seconds, user: z.string().max(65).optional(), service: z.string().max(64).optional() })).max(20).default([]),
}).refine((h) => h.dockerImage !== undefined || h.build !== undefined, 'needs [environment].docker_image or environment/Dockerfile');
export type HarborRun = z.infer<typeof HarborRun>;

/** A task resolved against batch defaults; this is what an episode job carries. */
export const TaskSpec = z
  .strictObject({
    id: taskId,
    instruction,
    image: ImageReference,
    workdir: absolutePath,
    // `reward` is set only for `file`: a task grading by exit code keeps the spec (and digest) it had.
    verify: z.strictObject({ command, timeoutSec: seconds, reward: z.literal('file').optional() }),
    deadlineSec: seconds,
    // A job queued before diskMb existed still parses, with the built-in default.
    limits: Limits.extend({ diskMb: Limits.shape.diskMb.default(BUILTIN_DEFAULTS.limits.diskMb) }).strict(),
    reserves: Reserves.strict(),
    /** Set for a Harbor task folder (task.toml); unset for the fleet's own format (task.yaml). */
    harbor: HarborRun.optional(),
  })
  .superRefine((task, ctx) => {
    const workdir = workdirProblem(task.workdir, task.harbor !== undefined);
    if (workdir !== undefined) ctx.addIssue({ code: 'custom', path: ['workdir'], message: workdir });
    if (task.reserves.verifySec < task.verify.timeoutSec) {
      ctx.addIssue({
        code: 'custom',
        path: ['reserves', 'verifySec'],
        message: `must be at least verify.timeoutSec (${task.verify.timeoutSec})`,
      });
    }
    if (agentCeilingSec(task) <= 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['deadlineSec'],
        message:
          `leaves the agent no time: deadline minus reserves (setup ${task.reserves.setupSec}` +
          ` + verify ${task.reserves.verifySec} + close ${task.reserves.closeSec}) must be positive`,
      });
    }
  });
export type TaskSpec = z.infer<typeof TaskSpec>;

/** The agent's time: the episode deadline minus the set-up, verification and close reserves. */
export function agentCeilingSec(task: Pick<TaskSpec, 'deadlineSec' | 'reserves'>): number {
  const { setupSec, verifySec, closeSec } = task.reserves;
  return task.deadlineSec - setupSec - verifySec - closeSec;
}

/** Merge task.yaml over batch defaults over built-in defaults (not yet validated). */
export function resolveTask(file: TaskFile, defaults: TaskDefaults = {}): unknown {
  const verify = { command: file.verify.command, timeoutSec: file.verify.timeoutSec, ...(file.verify.reward === 'file' && { reward: 'file' as const }) };
  return {
    id: file.id,
    instruction: file.instruction,
    image: file.image ?? defaults.image ?? BUILTIN_DEFAULTS.image,
    workdir: file.workdir ?? defaults.workdir ?? BUILTIN_DEFAULTS.workdir,
    verify,
    deadlineSec: file.deadlineSec ?? defaults.deadlineSec ?? BUILTIN_DEFAULTS.deadlineSec,
    limits: { ...BUILTIN_DEFAULTS.limits, ...defaults.limits, ...file.limits },
    reserves: {
      ...BUILTIN_DEFAULTS.reserves,
      verifySec: verify.timeoutSec + 10,
      ...defaults.reserves,
      ...file.reserves,
    },
  };
}

// The task format: a folder with task.yaml, workspace/ (copied in at set-up), tests/ (copied in only
// for verification, after the agent stopped) and an optional solution/. This file holds the schemas of
// task.yaml as written (TaskFile) and of a task fully resolved against batch defaults (TaskSpec).
import { z } from 'zod';

export const DEFAULT_IMAGE = 'rollout-fleet/sandbox:busybox';

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
   * mounts). Enforced by the engine where it can (overlay2 on xfs with pquota), else watched during
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

export const Verify = z.object({
  /** Shell command run in the workdir after the tests were copied to /tests. Exit 0 passes, 1 fails. */
  command: z.string().min(1),
  /** The verifier is stopped after this long and the episode ends with kind verifier. @default 60 */
  timeoutSec: seconds.default(60),
});

/** task.yaml as written: everything but id, instruction and verify may come from batch defaults. */
export const TaskFile = z.strictObject({
  id: taskId,
  instruction: z.string().min(1),
  image: z.string().min(1).optional(),
  workdir: absolutePath.optional(),
  verify: Verify.strict(),
  deadlineSec: seconds.optional(),
  limits: Limits.partial().strict().optional(),
  reserves: Reserves.partial().strict().optional(),
});
export type TaskFile = z.infer<typeof TaskFile>;

/** The fields a batch may set for all of its tasks. */
export const TaskDefaults = z.strictObject({
  image: z.string().min(1).optional(),
  workdir: absolutePath.optional(),
  deadlineSec: seconds.optional(),
  limits: Limits.partial().strict().optional(),
  reserves: Reserves.partial().strict().optional(),
});
export type TaskDefaults = z.infer<typeof TaskDefaults>;

/** A task resolved against batch defaults; this is what an episode job carries. */
export const TaskSpec = z
  .strictObject({
    id: taskId,
    instruction: z.string().min(1),
    image: z.string().min(1),
    workdir: absolutePath,
    verify: z.strictObject({ command: z.string().min(1), timeoutSec: seconds }),
    deadlineSec: seconds,
    // A job queued before diskMb existed still parses, with the built-in default.
    limits: Limits.extend({ diskMb: Limits.shape.diskMb.default(BUILTIN_DEFAULTS.limits.diskMb) }).strict(),
    reserves: Reserves.strict(),
  })
  .superRefine((task, ctx) => {
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
  const verify = { command: file.verify.command, timeoutSec: file.verify.timeoutSec };
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

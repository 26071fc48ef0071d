// Harbor's task.toml as written (Harbor v0.22.0's models/task/config.py; Terminal-Bench 2.0 files
// say `version = "1.0"`, the registry's copies `schema_version = "1.1"`). Only the shape is checked
// here: what the fleet honours, caps or refuses is decided in harbor-task.ts. As in Harbor, keys this
// schema does not know are ignored (a task written for a newer Harbor still loads), except where a
// key asks for something the fleet cannot give (gpus, tpu, windows, MCP servers, multi-step, a
// separate verifier environment): those are refused there, by name, never silently dropped.
import { z } from 'zod';

const seconds = z.number().positive().max(7 * 24 * 3600);
const envTable = z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'an environment variable name'), z.union([z.string(), z.number(), z.boolean()]).transform(String));
/** A user name or uid, as `docker exec -u` takes it (Harbor passes it through). */
const user = z.union([
  z.string().regex(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$/, 'a user name or uid, optionally :group'),
  z.number().int().min(0).max(2 ** 31 - 1).transform(String),
]);
export const NETWORK_MODES = ['public', 'no-network', 'allowlist'] as const;
const networkMode = z.enum(NETWORK_MODES);
const hosts = z.array(z.string().min(1).max(253)).max(1_000);
/** "2G", "512M", "1024K" (Harbor's deprecated memory and storage), in MB: G x 1024, K / 1024. */
const sizeText = z
  .string()
  .regex(/^\s*\d+(?:\.\d+)?\s*[KMGT]?i?B?\s*$/i, 'a size such as "2G", "512M" or "1024K"')
  .transform((s) => {
    const m = /^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)/i.exec(s)!;
    const factor = { '': 1, K: 1 / 1024, M: 1, G: 1024, T: 1024 * 1024 }[m[2]!.toUpperCase() as '' | 'K' | 'M' | 'G' | 'T'];
    return Math.ceil(Number(m[1]) * factor);
  });

export const HarborHealthcheck = z.object({
  command: z.string().min(1).max(64 * 1024),
  interval_sec: seconds.default(5),
  timeout_sec: seconds.default(30),
  start_period_sec: z.number().min(0).max(24 * 3600).default(0),
  start_interval_sec: seconds.default(5),
  retries: z.number().int().min(1).max(1_000).default(3),
});

const HarborEnvironment = z.object({
  build_timeout_sec: seconds.default(600),
  docker_image: z.string().min(1).max(512).optional(),
  os: z.string().default('linux'),
  cpus: z.number().positive().max(64).optional(),
  memory_mb: z.number().int().positive().max(1_048_576).optional(),
  storage_mb: z.number().int().positive().max(16_777_216).optional(),
  gpus: z.number().int().min(0).max(1_024).optional(),
  gpu_types: z.array(z.string()).optional(),
  tpu: z.unknown().optional(),
  mcp_servers: z.array(z.unknown()).optional(),
  env: envTable.default({}),
  skills_dir: z.string().optional(),
  workdir: z.string().min(1).max(4096).optional(),
  network_mode: networkMode.optional(),
  allowed_hosts: hosts.optional(),
  healthcheck: HarborHealthcheck.optional(),
  // Deprecated spellings, still in published tasks.
  memory: sizeText.optional(),
  storage: sizeText.optional(),
  allow_internet: z.boolean().optional(),
});

export const HarborTaskToml = z.object({
  schema_version: z.string().max(32).optional(),
  /** The older name of schema_version (Terminal-Bench 2.0). */
  version: z.string().max(32).optional(),
  source: z.string().nullable().optional(),
  metadata: z.record(z.string(), z.unknown()).default({}),
  task: z.object({ name: z.string().min(1).max(256), version: z.string().optional(), description: z.string().optional() }).optional(),
  agent: z.object({
    timeout_sec: seconds.optional(),
    user: user.optional(),
    network_mode: networkMode.optional(),
    allowed_hosts: hosts.optional(),
  }).default({}),
  verifier: z.object({
    timeout_sec: seconds.default(600),
    env: envTable.default({}),
    user: user.optional(),
    network_mode: networkMode.optional(),
    allowed_hosts: hosts.optional(),
    environment_mode: z.enum(['shared', 'separate']).optional(),
    environment: HarborEnvironment.optional(),
    collect: z.array(z.object({
      command: z.string().min(1).max(64 * 1024),
      service: z.string().min(1).max(64).default('main'),
      timeout_sec: seconds.default(60),
      user: user.optional(),
    })).max(20).optional(),
  }).default({ timeout_sec: 600, env: {} }),
  solution: z.object({ env: envTable.default({}) }).default({ env: {} }),
  environment: HarborEnvironment.default({ build_timeout_sec: 600, os: 'linux', env: {} }),
  artifacts: z.array(z.union([
    z.string().min(1).max(4096),
    z.object({ source: z.string().min(1).max(4096), destination: z.string().min(1).max(4096).optional(), exclude: z.array(z.string()).optional(), service: z.string().min(1).max(64).optional() }),
  ])).max(100).optional(),
  steps: z.array(z.object({
    name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'a step name (letters, digits, _ . -), the name of its folder under steps/'),
    agent: z.object({ timeout_sec: seconds.optional(), user: user.optional() }).default({}),
    verifier: z.object({ timeout_sec: seconds.optional(), env: envTable.default({}), user: user.optional() }).default({ env: {} }),
    min_reward: z.union([z.number(), z.record(z.string(), z.number())]).optional(),
    healthcheck: HarborHealthcheck.optional(),
    artifacts: z.array(z.unknown()).optional(),
  })).max(50).nullable().optional(),
  multi_step_reward_strategy: z.enum(['mean', 'final']).optional(),
});
export type HarborTaskToml = z.infer<typeof HarborTaskToml>;

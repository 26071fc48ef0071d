// All settings of the fleet, from the environment, validated by one schema once at start-up. A bad
// value stops the process with every problem listed, before Redis or Docker are touched.
import os from 'node:os';
import path from 'node:path';
import { z } from 'zod';
import { parseArtifactsLocation } from '../artifacts/artifacts-location.ts';
import { DEFAULT_RETRY_BUDGETS, MAX_RETRIES_PER_KIND } from '../errors/retry-budgets.ts';
import { describeIssues } from './zod-issues.ts';
import { DEFAULT_ENDPOINT, EndpointTableError, loadEndpointTable, type ModelEndpoint } from './model-endpoints.ts';
import { parseEgressHosts } from '../egress/host-rules.ts';
import { DEFAULT_NETWORK_CEILING, NETWORK_MODE_NAMES } from '../egress/network-grant.ts';

const positiveInt = z.coerce.number().int().positive();
/** A registry's host and port (distribution/reference's domain): name, IPv4 or [IPv6], then :1-65535. */
const REGISTRY_HOST = /^(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\]):(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$/;

/** The input as described in errors: a FLEET_REGISTRY carrying credentials (user:pass@host) is not echoed. */
function shownInput(input: Record<string, string>): Record<string, string> {
  const registry = input.FLEET_REGISTRY;
  if (registry === undefined || !registry.includes('@')) return input;
  return { ...input, FLEET_REGISTRY: `***@${registry.slice(registry.lastIndexOf('@') + 1)}` };
}

export const FleetConfig = z.object({
  /** Redis for the queues. Unset: `demo` starts a private redis-server; other commands refuse. */
  REDIS_URL: z.string().regex(/^rediss?:\/\//, 'must start with redis:// or rediss://').optional(),
  /** Where results and evidence are written. @default ./.fleet-data */
  FLEET_DATA_DIR: z.string().min(1).default(path.resolve('.fleet-data')),
  /**
   * Where checkpoints, evidence and trajectories are kept: `s3://<bucket>[/prefix]` (an S3-compatible
   * store; endpoint, region and keys from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_REGION,
   * AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) or an absolute folder path. @default FLEET_DATA_DIR
   */
  FLEET_ARTIFACTS: z
    .string()
    .superRefine((value, ctx) => {
      try {
        parseArtifactsLocation(value);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
      }
    })
    .optional(),
  /** Redis key prefix of every queue and fleet key, so several fleets can share one Redis. @default rf */
  FLEET_PREFIX: z.string().regex(/^[A-Za-z0-9_-]+$/, 'letters, digits, - and _ only').default('rf'),
  /** The Docker engine: unix:///path or tcp://host:port. @default unix:///var/run/docker.sock */
  DOCKER_HOST: z
    .string()
    .regex(/^(unix|tcp|http):\/\//, 'must be unix://..., tcp://... or http://...')
    .default('unix:///var/run/docker.sock'),
  /** Deadline of every single Docker API call (exec runs have their own). @default 30000 */
  FLEET_DOCKER_CALL_TIMEOUT_MS: positiveInt.default(30_000),
  /** Episodes one worker process runs at once; with FLEET_WORKER_AUTOTUNE, the most it runs at once. @default 2 */
  FLEET_WORKER_CONCURRENCY: positiveInt.default(2),
  /**
   * Warm sandboxes each worker keeps ready per kind (image, limits, runtime generation), created ahead
   * so an episode's set-up claims a running one; 0 turns the pool off. @default 1
   */
  FLEET_SANDBOX_POOL: z.coerce.number().int().min(0).max(64).default(1),
  /**
   * The engine's runtime every sandbox of this worker runs under (HostConfig.Runtime), e.g. `runsc`
   * (gVisor) for tasks that run as root and are not trusted; one the engine does not list stops the
   * worker at start. Unset: the engine's default (runc).
   */
  FLEET_SANDBOX_RUNTIME: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'a runtime name: letters, digits, ., - and _').optional(),
  /**
   * Self-tuning concurrency: the worker runs between FLEET_WORKER_CONCURRENCY_FLOOR and
   * FLEET_WORKER_CONCURRENCY episodes at once, fewer while the Docker engine's latency says it is
   * overloaded (src/worker/admission.ts). false: always FLEET_WORKER_CONCURRENCY. @default true
   */
  FLEET_WORKER_AUTOTUNE: z.stringbool().default(true),
  /** The fewest episodes at once self-tuning may go down to (capped at FLEET_WORKER_CONCURRENCY). @default 1 */
  FLEET_WORKER_CONCURRENCY_FLOOR: positiveInt.default(1),
  /**
   * Self-tuning: the engine counts as overloaded when its calls take more than this many times as long
   * as at the least load seen (their time over their baselines', over the last two windows). @default 6
   */
  FLEET_WORKER_AUTOTUNE_MAX_SLOWDOWN: z.coerce.number().gt(1).default(6),
  /**
   * Self-tuning: the host counts as overloaded while its 1-minute load average per core is above this.
   * Unset: the load is not used (on a host shared with other work it says little about the engine).
   */
  FLEET_WORKER_AUTOTUNE_MAX_LOAD_PER_CORE: z.coerce.number().positive().optional(),
  /**
   * The most network a phase of a Harbor task gets, whatever it asks (docs/HARBOR.md#network-per-phase):
   * `no-network` (every phase as before), `allowlist` (a task's allowed_hosts through the egress
   * proxy; a phase asking public gets its allowlist, else none) or `public` (any host through the
   * proxy, never a private address). A task asking more is run at the ceiling, never refused. @default allowlist
   */
  FLEET_NETWORK_CEILING: z.enum(NETWORK_MODE_NAMES, { error: 'one of no-network, allowlist, public' }).default(DEFAULT_NETWORK_CEILING),
  /**
   * Names the egress proxy connects to a given address, past its private-address guard:
   * `name=address[,name=address]` (tests stand a loopback server in for an allowed host). Unset: none.
   */
  FLEET_EGRESS_HOSTS: z
    .string()
    .superRefine((value, ctx) => {
      try {
        parseEgressHosts(value);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message.replace(/^FLEET_EGRESS_HOSTS: /, '') });
      }
    })
    .optional(),
  /**
   * Memory (MiB) the environments of one worker's running episodes may take together, each container
   * of an environment at its memory limit (a task with services: main, every sidecar and the
   * namespace holder); an episode waits until its environment fits. @default the host's memory
   */
  FLEET_WORKER_MEMORY_MB: positiveInt.optional(),
  /** CPUs (their limits summed the same way) one worker's running environments may take. Unset: not counted. */
  FLEET_WORKER_CPUS: z.coerce.number().positive().optional(),
  /** Cap of each captured output stream (agent, verifier) kept as evidence. @default 1048576 */
  FLEET_OUTPUT_CAP_BYTES: positiveInt.default(1024 * 1024),
  /** Name of this worker in labels and logs. @default <hostname>-<pid> */
  FLEET_WORKER_ID: z
    .string()
    .regex(/^[A-Za-z0-9_.-]+$/, 'letters, digits, ., - and _ only')
    .default(`${os.hostname()}-${process.pid}`),
  /** A worker's lease in Redis expires this long after its last heartbeat (the reaper then takes its sandboxes). @default 15000 */
  FLEET_LEASE_TTL_MS: positiveInt.default(15_000),
  /** How often the reaper looks for orphaned sandboxes. @default 30000 */
  FLEET_REAPER_INTERVAL_MS: positiveInt.default(30_000),
  /** BullMQ job lock: a job whose worker stopped renewing it is taken over after about this long. @default 30000 */
  FLEET_LOCK_DURATION_MS: positiveInt.default(30_000),
  /** On SIGTERM, running episodes get this long to finish before they are handed back to the queue. @default 30000 */
  FLEET_DRAIN_TIMEOUT_MS: z.coerce.number().int().min(0).default(30_000),
  /** Further attempts after infrastructure failures (Docker, Redis, lost worker). @default 2 */
  FLEET_INFRA_RETRIES: z.coerce.number().int().min(0).max(MAX_RETRIES_PER_KIND).default(DEFAULT_RETRY_BUDGETS.infra),
  /** Further attempts after model endpoint failures. @default 2 */
  FLEET_MODEL_RETRIES: z.coerce.number().int().min(0).max(MAX_RETRIES_PER_KIND).default(DEFAULT_RETRY_BUDGETS.model),
  /** Checkpoints kept on disk per episode (the newest ones). @default 5 */
  FLEET_CHECKPOINT_KEEP: positiveInt.default(5),
  /** A checkpoint's workspace tar larger than this is not captured (the checkpoint says why). @default 8388608 */
  FLEET_CHECKPOINT_WORKSPACE_CAP_BYTES: positiveInt.default(8 * 1024 * 1024),
  /** A checkpoint staged in Redis that no writer took expires after this long. @default 86400000 */
  FLEET_CHECKPOINT_STAGED_TTL_MS: positiveInt.default(24 * 3600 * 1000),
  /** Checkpoints one writer writes at once. @default 4 */
  FLEET_CHECKPOINT_WRITER_CONCURRENCY: positiveInt.default(4),
  /**
   * The model endpoint the per-episode model proxy forwards to: an OpenAI-compatible base URL ending
   * before `/chat/completions`, e.g. http://127.0.0.1:8000/v1. Unset: episodes run no model proxy.
   */
  MODEL_BASE_URL: z
    .string()
    .regex(/^https?:\/\/[^/]/, 'must be an http:// or https:// URL')
    .refine((u) => URL.canParse(u), 'must be a valid URL')
    .optional(),
  /**
   * API key the model proxy sends upstream as `Authorization: Bearer <key>`. It stays in the worker:
   * never in a sandbox's environment, files, arguments, or the evidence. Unset: no Authorization header.
   */
  MODEL_API_KEY: z.string().min(1).optional(),
  /** Model name the proxy puts in every request; unset, the agent's own `model` passes through. */
  MODEL_NAME: z.string().min(1).optional(),
  /**
   * The table of named model endpoints, as JSON: a list of `{ name, baseUrl, keyEnv?, model?,
   * maxConcurrent?, requestsPerMinute?, tokensPerMinute?, capture? }` (keyEnv names the environment
   * variable holding the endpoint's key; the key never leaves the worker). A batch picks one with
   * `model.endpoint`. MODEL_BASE_URL and the MODEL_* settings are the endpoint named `default`.
   * See docs/MODEL-GATEWAY.md. Unset: only `default`, when MODEL_BASE_URL is set.
   */
  FLEET_MODEL_ENDPOINTS: z.string().min(1).optional(),
  /** The same table in a file (JSON or YAML: a list, or `{ endpoints: [...] }`); set this or FLEET_MODEL_ENDPOINTS. */
  FLEET_MODEL_ENDPOINTS_FILE: z.string().min(1).optional(),
  /** Model calls one episode may make through its proxy; the next one is refused with 429. @default 100 */
  MODEL_MAX_CALLS: positiveInt.default(100),
  /** Tokens (`usage.total_tokens`) one episode may use; a request whose max_tokens would pass it is refused. @default 1000000 */
  MODEL_MAX_TOKENS: positiveInt.default(1_000_000),
  /** Deadline of one upstream attempt of a model call. @default 300000 */
  MODEL_REQUEST_TIMEOUT_MS: positiveInt.default(300_000),
  /** The proxy's further attempts of one call after a connection error, timeout, 429 or 5xx, with backoff (episode retries are separate). @default 3 */
  MODEL_UPSTREAM_RETRIES: z.coerce.number().int().min(0).max(10).default(3),
  /**
   * Concurrent requests to MODEL_BASE_URL across the whole fleet (every worker and host sharing this
   * Redis), counted in Redis. Unset: no limit of concurrency.
   */
  MODEL_MAX_CONCURRENT: positiveInt.optional(),
  /**
   * Requests per minute to MODEL_BASE_URL across the whole fleet (the endpoint's rate limit; bursts of
   * about one second's worth). Cut down for a while after a 429 or 503, and paused by a Retry-After.
   * Unset: no limit of requests.
   */
  MODEL_REQUESTS_PER_MINUTE: positiveInt.optional(),
  /**
   * Tokens (`usage.total_tokens`) per minute of MODEL_BASE_URL across the whole fleet, charged after
   * each answer; new requests wait while the allowance is in debt. Unset: no limit of tokens.
   */
  MODEL_TOKENS_PER_MINUTE: positiveInt.optional(),
  /**
   * Disk budget of the Harbor environment images the fleet built on each engine (their own layers,
   * not the base layers they share), in MB: past it, each host's workers remove the least recently
   * used ones (never one a container uses, one being built, or one asked for within
   * FLEET_ENV_IMAGE_MIN_IDLE_MS). @default 51200 (50 GiB)
   */
  FLEET_ENV_IMAGE_BUDGET_MB: z.coerce.number().int().min(0).default(51_200),
  /** How often each engine's built environment images are held to FLEET_ENV_IMAGE_BUDGET_MB; 0 never. @default 600000 */
  FLEET_ENV_PRUNE_INTERVAL_MS: z.coerce.number().int().min(0).default(600_000),
  /** Built environment images asked for within this long are kept whatever the budget. @default 600000 */
  FLEET_ENV_IMAGE_MIN_IDLE_MS: z.coerce.number().int().min(0).default(600_000),
  /**
   * A registry (host:port, e.g. 127.0.0.1:5000 or registry.internal:443) the fleet shares built
   * Harbor environments through: the first host to need one builds it, pushes it and records its
   * manifest digest in Redis; the others pull it by that digest. Loopback registries are plain HTTP
   * (the engine's default); others need TLS or the engine's insecure-registries. The fleet sends no
   * credentials: the registry must take anonymous pushes and pulls. Unset: each engine builds its own.
   */
  FLEET_REGISTRY: z
    .string()
    .refine((v) => !v.includes('@') && !v.includes('://'), 'must be host:port, without a scheme or credentials (a registry that needs a login is not supported)')
    .refine((v) => v.includes('@') || v.includes('://') || REGISTRY_HOST.test(v), 'must be host:port: a host name, IPv4 or [IPv6] address, and a port from 1 to 65535')
    .optional(),
  /** Runtime generations that no sandbox used for this long are removed by the reaper. @default 604800000 (7 days) */
  FLEET_RUNTIME_MAX_IDLE_MS: positiveInt.default(7 * 24 * 3600 * 1000),
  /**
   * An absolute folder where the patched copy of node (about 95 MB) is cached, shared by every data
   * folder naming it. Unset: each data folder keeps its own in runtime-src/.
   */
  FLEET_RUNTIME_CACHE: z.string().refine((v) => path.isAbsolute(v), { message: 'expected an absolute folder' }).optional(),
  /**
   * Name runtime volumes after this instead of FLEET_PREFIX, so fleets on one engine share one volume
   * per generation (the test suite, which installs it first). Unset: one volume per fleet.
   */
  FLEET_RUNTIME_SCOPE: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/).optional(),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  /** Dashboard user for HTTP Basic auth; without it (and the password) only `--local-only` starts. */
  FLEET_DASHBOARD_USER: z.string().min(1).optional(),
  /** Dashboard password for HTTP Basic auth; set together with FLEET_DASHBOARD_USER. */
  FLEET_DASHBOARD_PASSWORD: z.string().min(1).optional(),
  /** Address the dashboard listens on (`--local-only` forces 127.0.0.1). @default 127.0.0.1 */
  FLEET_DASHBOARD_HOST: z.string().min(1).default('127.0.0.1'),
  /** Port of the dashboard; 0 picks a free one (`--port` overrides). @default 3000 */
  FLEET_DASHBOARD_PORT: z.coerce.number().int().min(0).max(65_535).default(3000),
  /** Bearer token of `rollout-fleet api`; required unless the API listens on loopback. */
  FLEET_API_TOKEN: z.string().min(16, 'at least 16 characters').optional(),
  /** Address `rollout-fleet api` listens on. @default 127.0.0.1 */
  FLEET_API_HOST: z.string().min(1).default('127.0.0.1'),
  /** Port of `rollout-fleet api`; 0 picks a free one (`--port` overrides). @default 3100 */
  FLEET_API_PORT: z.coerce.number().int().min(0).max(65_535).default(3100),
  /** Allow write actions in Bull Board (retry, clean, pause, add); read-only otherwise. @default false */
  FLEET_DASHBOARD_WRITE: z.stringbool().default(false),
});
export type FleetConfig = z.infer<typeof FleetConfig>;

export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n  ${problems.join('\n  ')}`);
  }
}

/** Parse the environment (only the keys the schema knows); throws ConfigError listing every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): FleetConfig {
  const input = Object.fromEntries(
    Object.keys(FleetConfig.shape).flatMap((key) => {
      const value = env[key];
      return value === undefined || value === '' ? [] : [[key, value]];
    }),
  );
  const parsed = FleetConfig.safeParse(input);
  if (!parsed.success) throw new ConfigError(describeIssues(parsed.error, shownInput(input)));
  // The endpoint table's form is checked here too, so a bad one stops every command at start (its
  // keys' variables only where they are used: the worker, through modelSettings).
  try {
    configEndpoints(parsed.data, env, false);
  } catch (err) {
    if (err instanceof EndpointTableError) throw new ConfigError(err.problems);
    throw err;
  }
  return parsed.data;
}

/**
 * Every model endpoint of the configuration: `default` from MODEL_BASE_URL, MODEL_API_KEY, MODEL_NAME
 * and the MODEL_* limits (when MODEL_BASE_URL is set), then FLEET_MODEL_ENDPOINTS or its file, with
 * their keys read from `env`. Throws EndpointTableError.
 */
export function configEndpoints(config: FleetConfig, env: NodeJS.ProcessEnv = process.env, requireKeys = true): ModelEndpoint[] {
  const legacy: ModelEndpoint | undefined = config.MODEL_BASE_URL === undefined ? undefined : {
    name: DEFAULT_ENDPOINT,
    baseUrl: config.MODEL_BASE_URL,
    apiKey: config.MODEL_API_KEY,
    model: config.MODEL_NAME,
    limits: { maxConcurrent: config.MODEL_MAX_CONCURRENT, requestsPerMinute: config.MODEL_REQUESTS_PER_MINUTE, tokensPerMinute: config.MODEL_TOKENS_PER_MINUTE },
  };
  return loadEndpointTable({ json: config.FLEET_MODEL_ENDPOINTS, file: config.FLEET_MODEL_ENDPOINTS_FILE, legacy }, env, requireKeys);
}

// `rollout-fleet worker`: run episodes (and cleanup, checkpoint writing) until SIGTERM or SIGINT,
// then drain: running episodes are handed to other workers, and it exits 0. Whatever Redis does, it
// exits within the drain timeout plus the close grace (EXIT_NOT_HANDED_BACK when it had to leave
// episodes for stall detection to return).
import { parseEgressHosts } from '../egress/host-rules.ts';
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import { ConfigError, configEndpoints, type FleetConfig } from '../config/config.ts';
import { DEFAULT_ENDPOINT, EndpointTableError } from '../config/model-endpoints.ts';
import { untilAborted } from '../deadlines/deadline.ts';
import type { ModelSettings } from '../episode/episode-attempt.ts';
import { CLOSE_GRACE_MS, startWorker, type WorkerHandle } from '../worker/start-worker.ts';
import { WORKER_OPTIONS } from './command-table.ts';
import { positiveOption, requireRedisUrl, type Cli } from './context.ts';
import { openArtifactStore } from '../artifacts/open-store.ts';

/**
 * Exit code of a worker whose close deadline passed with episodes it could not hand back (Redis did not
 * answer): their jobs return to the queue when their lock expires, as if the worker had died.
 */
export const EXIT_NOT_HANDED_BACK = 5;

/**
 * The worker's model settings: the `default` endpoint of MODEL_BASE_URL (`baseUrl`) and the table's
 * (FLEET_MODEL_ENDPOINTS, keys read from `env`), with the budgets every episode's proxy gets.
 */
export function modelSettings(config: FleetConfig, baseUrl: string | undefined = config.MODEL_BASE_URL, env: NodeJS.ProcessEnv = process.env): ModelSettings {
  return {
    baseUrl,
    apiKey: config.MODEL_API_KEY,
    name: config.MODEL_NAME,
    // The table's own endpoints (its `default`, if any, only when MODEL_BASE_URL makes none).
    endpoints: configEndpoints({ ...config, MODEL_BASE_URL: undefined }, env).filter((e) => baseUrl === undefined || e.name !== DEFAULT_ENDPOINT),
    maxCalls: config.MODEL_MAX_CALLS,
    maxTokens: config.MODEL_MAX_TOKENS,
    requestTimeoutMs: config.MODEL_REQUEST_TIMEOUT_MS,
    upstreamRetries: config.MODEL_UPSTREAM_RETRIES,
    limits: {
      maxConcurrent: config.MODEL_MAX_CONCURRENT,
      requestsPerMinute: config.MODEL_REQUESTS_PER_MINUTE,
      tokensPerMinute: config.MODEL_TOKENS_PER_MINUTE,
    },
  };
}

/** modelSettings for the worker command: a table whose keys' variables are missing stops it (a ConfigError). */
function workerModelSettings(config: FleetConfig): ModelSettings {
  try {
    return modelSettings(config);
  } catch (err) {
    if (err instanceof EndpointTableError) throw new ConfigError(err.problems);
    throw err;
  }
}

export async function workerCommand(cli: Cli, args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: WORKER_OPTIONS });
  const { config, log } = cli;
  // Listen before anything starts: a SIGTERM during start-up (say, Redis down, so start-up waits on it)
  // must stop the worker too, not kill it half-started or be ignored.
  const stop = Promise.race([once(process, 'SIGTERM'), once(process, 'SIGINT')]);
  const docker = await cli.docker();
  const starting = startWorker({
    redisUrl: requireRedisUrl(config),
    prefix: config.FLEET_PREFIX,
    dataDir: config.FLEET_DATA_DIR,
    artifacts: openArtifactStore(config.FLEET_ARTIFACTS, config.FLEET_DATA_DIR),
    docker,
    log,
    workerId: config.FLEET_WORKER_ID,
    concurrency: positiveOption('concurrency', values.concurrency) ?? config.FLEET_WORKER_CONCURRENCY,
    sandboxPool: config.FLEET_SANDBOX_POOL,
    ...(config.FLEET_SANDBOX_RUNTIME !== undefined && { sandboxRuntime: config.FLEET_SANDBOX_RUNTIME }),
    network: { ceiling: config.FLEET_NETWORK_CEILING, hostsMap: parseEgressHosts(config.FLEET_EGRESS_HOSTS) },
    ...(config.FLEET_REGISTRY !== undefined && { registry: config.FLEET_REGISTRY }),
    admission: {
      autotune: config.FLEET_WORKER_AUTOTUNE,
      floor: config.FLEET_WORKER_CONCURRENCY_FLOOR,
      maxSlowdown: config.FLEET_WORKER_AUTOTUNE_MAX_SLOWDOWN,
      maxLoadPerCore: config.FLEET_WORKER_AUTOTUNE_MAX_LOAD_PER_CORE,
    },
    resources: { memoryMb: config.FLEET_WORKER_MEMORY_MB, cpus: config.FLEET_WORKER_CPUS },
    callTimeoutMs: config.FLEET_DOCKER_CALL_TIMEOUT_MS,
    outputCapBytes: config.FLEET_OUTPUT_CAP_BYTES,
    leaseTtlMs: config.FLEET_LEASE_TTL_MS,
    reaperIntervalMs: config.FLEET_REAPER_INTERVAL_MS,
    lockDurationMs: config.FLEET_LOCK_DURATION_MS,
    drainTimeoutMs: config.FLEET_DRAIN_TIMEOUT_MS,
    retryBudgets: { infra: config.FLEET_INFRA_RETRIES, model: config.FLEET_MODEL_RETRIES },
    runtimeMaxIdleMs: config.FLEET_RUNTIME_MAX_IDLE_MS,
    envPrune: { budgetBytes: config.FLEET_ENV_IMAGE_BUDGET_MB * 2 ** 20, everyMs: config.FLEET_ENV_PRUNE_INTERVAL_MS, minIdleMs: config.FLEET_ENV_IMAGE_MIN_IDLE_MS },
    ...(config.FLEET_RUNTIME_CACHE !== undefined && { runtimeCacheDir: config.FLEET_RUNTIME_CACHE }),
    ...(config.FLEET_RUNTIME_SCOPE !== undefined && { runtimeVolumeScope: config.FLEET_RUNTIME_SCOPE }),
    model: workerModelSettings(config),
    checkpointKeep: config.FLEET_CHECKPOINT_KEEP,
    checkpointWorkspaceCapBytes: config.FLEET_CHECKPOINT_WORKSPACE_CAP_BYTES,
    checkpointStagedTtlMs: config.FLEET_CHECKPOINT_STAGED_TTL_MS,
  });
  const first = await Promise.race([starting.then((handle) => ({ handle })), stop.then(([signal]) => ({ signal: signal as string }))]);
  let handle: WorkerHandle;
  let signal: string;
  if ('handle' in first) {
    handle = first.handle;
    [signal] = (await stop) as [string];
  } else {
    signal = first.signal;
    // Stopped while starting: start-up gets the same deadline a close would; no Worker exists before
    // it ends, so nothing runs that would need handing back.
    const deadlineMs = config.FLEET_DRAIN_TIMEOUT_MS + CLOSE_GRACE_MS;
    log.info({ signal, deadlineMs }, 'stopping during start-up');
    const deadline = AbortSignal.timeout(deadlineMs);
    const started = await untilAborted(starting, deadline).catch((err: unknown) => {
      if (deadline.aborted) return undefined;
      throw err;
    });
    if (started === undefined) {
      log.warn({ deadlineMs }, 'start-up did not finish before the close deadline; exiting');
      process.exit(0);
    }
    handle = started;
  }
  log.info({ signal, running: handle.running.size, drainTimeoutMs: config.FLEET_DRAIN_TIMEOUT_MS }, 'draining');
  const outcome = await handle.close();
  const code = outcome.notHandedBack > 0 ? EXIT_NOT_HANDED_BACK : 0;
  // Connections cut at the deadline may leave BullMQ's own clients' timers behind: exit now rather
  // than let them keep a stopped worker alive (pino's destination(2) is synchronous: nothing is lost).
  if (!outcome.clean) process.exit(code);
  return code;
}

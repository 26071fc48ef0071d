// /metrics of the dashboard, in Prometheus format (prom-client): episodes by status and failure kind
// and phase durations (both observed from the results store), queue depths per queue and state, and
// the workers connected to each queue, and the fleet-wide limits of each model endpoint (in flight,
// waiting, 429s, tokens of the last minute, allowance factor; labelled by the endpoint's short hash and
// host), and each live worker's admission control (its concurrency allowance, ceiling, episodes
// running, the engine latency it measured; from the facts workers report). Every number is read from
// Redis; nothing is a placeholder.
//
// Results are ingested incrementally: each scrape reads only batches that were not yet complete when
// last seen, observes the results it has not seen, and forgets a batch once all its episodes were
// observed. So the counters and the histogram only grow, as Prometheus expects, and a scrape costs
// what the running batches cost, not the whole history.
import type { JobState, Queue } from 'bullmq';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { EpisodeResult } from '../episode/episode-job.ts';
import type { EndpointLimitMetrics } from '../model/fleet-limits.ts';
import type { ResultsStore } from '../results/results-store.ts';
import type { WorkerFacts } from '../worker/host-facts.ts';
import { PHASES } from './batch-stats.ts';

/** Queue states reported as depths (finished jobs are kept for a while, so they count too). */
export const QUEUE_STATES = ['waiting', 'active', 'delayed', 'prioritized', 'waiting-children', 'completed', 'failed'] as const satisfies readonly JobState[];

export interface FleetMetricsOptions {
  queues: readonly Queue[];
  results: ResultsStore;
  /** Workers holding a lease now. */
  activeLeases: () => Promise<number>;
  /** Sandboxes the reaper removed, ever (a counter kept in Redis). */
  reapedSandboxes: () => Promise<number>;
  /** Each model endpoint's fleet-wide limit numbers, as kept in Redis (readEndpointLimitMetrics). Unset: not reported. */
  modelEndpoints?: () => Promise<EndpointLimitMetrics[]>;
  /** The facts every live worker reports (readHostFacts). Unset: no per-worker metrics. */
  workers?: () => Promise<WorkerFacts[]>;
  /** How many of the newest batches the first scrape reads. @default 1000 */
  backfillBatches?: number;
}

export interface FleetMetrics {
  registry: Registry;
  /** Ingest new results, then render every metric. */
  render(): Promise<string>;
  contentType: string;
}

export function createFleetMetrics(opts: FleetMetricsOptions): FleetMetrics {
  const registry = new Registry();
  const backfill = opts.backfillBatches ?? 1000;

  const episodes = new Counter({
    name: 'rollout_fleet_episodes_total',
    help: 'Episodes that ended with a result, by status and failure kind (kind="none" when not an error); from the results store, since this dashboard started, over its newest batches',
    labelNames: ['status', 'kind'] as const,
    registers: [registry],
  });
  const phaseSeconds = new Histogram({
    name: 'rollout_fleet_episode_phase_duration_seconds',
    help: 'Duration of each phase of finished episodes (setup, agent, verify, close), from their results',
    labelNames: ['phase'] as const,
    buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600],
    registers: [registry],
  });
  new Gauge({
    name: 'rollout_fleet_queue_jobs',
    help: 'Jobs in each queue by state',
    labelNames: ['queue', 'state'] as const,
    registers: [registry],
    async collect() {
      this.reset();
      for (const queue of opts.queues) {
        const counts = await queue.getJobCounts(...QUEUE_STATES);
        for (const state of QUEUE_STATES) this.set({ queue: queue.name, state }, counts[state] ?? 0);
      }
    },
  });
  new Gauge({
    name: 'rollout_fleet_queue_workers',
    help: 'Worker connections currently consuming each queue (BullMQ Queue.getWorkers)',
    labelNames: ['queue'] as const,
    registers: [registry],
    async collect() {
      this.reset();
      for (const queue of opts.queues) this.set({ queue: queue.name }, (await queue.getWorkers()).length);
    },
  });

  const runtimePreparations = new Counter({
    name: 'rollout_fleet_runtime_preparations_total',
    help: 'Runtime generation preparations of finished episodes: warm (reused, nothing copied) or cold (installed)',
    labelNames: ['warm'] as const,
    registers: [registry],
  });
  new Gauge({
    name: 'rollout_fleet_active_leases',
    help: 'Worker processes holding a lease in Redis now',
    registers: [registry],
    async collect() {
      this.set(await opts.activeLeases());
    },
  });
  new Gauge({
    name: 'rollout_fleet_reaped_sandboxes',
    help: 'Sandboxes the reaper has removed (dead workers, ended episodes), as counted in Redis',
    registers: [registry],
    async collect() {
      this.set(await opts.reapedSandboxes());
    },
  });

  if (opts.modelEndpoints !== undefined) {
    const read = opts.modelEndpoints;
    // One read of Redis per scrape, shared by the gauges below (prom-client collects them in turn).
    let reading: Promise<EndpointLimitMetrics[]> | undefined;
    const endpoints = () => {
      reading ??= read().finally(() => setImmediate(() => (reading = undefined)));
      return reading;
    };
    // Counters are kept in Redis too (they start again from 0 when an idle endpoint's keys expire,
    // which Prometheus takes as a counter reset): both kinds are set from the same fleet-wide read.
    const endpointMetric = (Kind: typeof Gauge | typeof Counter) => (name: string, help: string, value: (m: EndpointLimitMetrics) => number) =>
      new Kind({
        name,
        help,
        labelNames: ['endpoint', 'host'] as const,
        registers: [registry],
        async collect() {
          this.reset();
          for (const m of await endpoints()) {
            if (this instanceof Gauge) this.set({ endpoint: m.endpoint, host: m.host }, value(m));
            else this.inc({ endpoint: m.endpoint, host: m.host }, value(m));
          }
        },
      });
    const endpointGauge = endpointMetric(Gauge);
    const endpointCounter = endpointMetric(Counter);
    endpointGauge('rollout_fleet_model_endpoint_in_flight', 'Requests to the model endpoint in flight now, fleet-wide (concurrency leases in Redis)', (m) => m.inFlight);
    endpointGauge('rollout_fleet_model_endpoint_waiting', 'Model calls waiting for a turn of the endpoint\'s fleet-wide limits now', (m) => m.waiting);
    endpointCounter('rollout_fleet_model_endpoint_rate_limited_total', '429 answers of the model endpoint reported fleet-wide, as counted in Redis', (m) => m.rateLimited);
    endpointCounter('rollout_fleet_model_endpoint_unavailable_total', '503 answers of the model endpoint reported fleet-wide, as counted in Redis', (m) => m.unavailable);
    endpointGauge('rollout_fleet_model_endpoint_tokens_last_minute', 'Tokens the model endpoint\'s answers used in the last minute, fleet-wide', (m) => m.tokensLastMinute);
    endpointGauge('rollout_fleet_model_endpoint_allowance_factor', 'Adaptive share (0.1 to 1) of the configured requests per minute and concurrency now allowed, cut by 429s and 503s', (m) => m.allowanceFactor);
    endpointGauge('rollout_fleet_model_endpoint_paused_seconds', 'Seconds the model endpoint\'s turns are still paused by a Retry-After', (m) => m.pausedMs / 1000);
  }

  if (opts.workers !== undefined) {
    const read = opts.workers;
    let reading: Promise<WorkerFacts[]> | undefined;
    const workers = () => {
      reading ??= read().finally(() => setImmediate(() => (reading = undefined)));
      return reading;
    };
    const workerGauge = (name: string, help: string, value: (w: WorkerFacts) => number | undefined) =>
      new Gauge({
        name,
        help,
        labelNames: ['worker', 'host'] as const,
        registers: [registry],
        async collect() {
          this.reset();
          for (const w of await workers()) {
            const v = value(w);
            if (v !== undefined) this.set({ worker: w.workerId, host: w.host }, v);
          }
        },
      });
    workerGauge('rollout_fleet_worker_concurrency_allowance', 'Episodes the worker may run at once now: set by self-tuning (FLEET_WORKER_AUTOTUNE) between its floor and its configured concurrency, else the configured concurrency', (w) => w.admission?.allowance ?? w.concurrency);
    workerGauge('rollout_fleet_worker_concurrency_ceiling', 'The worker\'s configured concurrency (FLEET_WORKER_CONCURRENCY or --concurrency): the most its allowance may reach', (w) => w.concurrency);
    workerGauge('rollout_fleet_worker_episodes_running', 'Episodes the worker was running at its last report', (w) => w.admission?.inUse);
    workerGauge('rollout_fleet_worker_engine_latency_p50_seconds', 'Median latency of the worker\'s engine calls (create, start and restart container, create, start and inspect exec, inspect container) in its last window that had some', (w) => w.admission?.engineP50Ms === undefined ? undefined : w.admission.engineP50Ms / 1000);
    workerGauge('rollout_fleet_worker_engine_latency_p90_seconds', 'p90 latency of the worker\'s engine calls in its last window that had some', (w) => w.admission?.engineP90Ms === undefined ? undefined : w.admission.engineP90Ms / 1000);
    workerGauge('rollout_fleet_worker_engine_slowdown', 'Time the worker\'s engine calls took over what they took at the least load seen, in its last windows that had some', (w) => w.admission?.engineSlowdown);
    workerGauge('rollout_fleet_worker_load_per_core', 'The worker host\'s 1-minute load average per core, at the worker\'s last window', (w) => w.admission?.loadPerCore);
  }

  const observe = (r: EpisodeResult) => {
    episodes.inc({ status: r.status, kind: r.error?.kind ?? 'none' });
    if (r.runtime) runtimePreparations.inc({ warm: String(r.runtime.warm) });
    for (const phase of PHASES) {
      const ms = r.timings[`${phase}Ms`];
      if (ms !== undefined) phaseSeconds.observe({ phase }, ms / 1000);
    }
  };

  const pending = new Map<string, Set<string>>(); // batch id -> episodes observed so far
  const complete = new Set<string>();
  const ingest = async () => {
    for (const batchId of await opts.results.listBatches(backfill)) {
      if (complete.has(batchId)) continue;
      const manifest = await opts.results.getManifest(batchId);
      const seen = pending.get(batchId) ?? new Set<string>();
      for (const r of await opts.results.results(batchId)) {
        if (seen.has(r.episodeId)) continue;
        seen.add(r.episodeId);
        observe(r);
      }
      if (manifest !== undefined && seen.size >= manifest.episodeIds.length) {
        complete.add(batchId);
        pending.delete(batchId);
      } else {
        pending.set(batchId, seen);
      }
    }
  };

  // One ingestion at a time: concurrent scrapes must not observe a result twice.
  let running: Promise<void> = Promise.resolve();
  return {
    registry,
    contentType: registry.contentType,
    async render() {
      running = running.catch(() => undefined).then(ingest);
      await running;
      return registry.metrics();
    },
  };
}

// The operator's view: one express app serving Bull Board for every fleet queue (/queues), the batch
// pages (/batches), the live fleet page (/fleet), Prometheus metrics (/metrics) and a health check (/healthz, the only route without
// authentication). Everything it needs is passed in; closing releases what it opened, not the
// Redis connection it was given.
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import type { Queue } from 'bullmq';
import express, { type ErrorRequestHandler, type Express, type RequestHandler } from 'express';
import type { Redis } from 'ioredis';
import { countLeases } from '../cleanup/worker-lease.ts';
import { readHostFacts } from '../worker/host-facts.ts';
import type { Logger } from 'pino';
import { BATCHES_QUEUE } from '../results/batch-job.ts';
import { CHECKPOINTS_QUEUE } from '../checkpoints/checkpoint-job.ts';
import { CLEANUP_QUEUE } from '../cleanup/cleanup-job.ts';
import { EPISODES_QUEUE } from '../episode/episode-job.ts';
import { reapedCountKey } from '../redis/redis-keys.ts';
import { ResultsStore } from '../results/results-store.ts';
import { basicAuth, type Credentials } from './basic-auth.ts';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { batchPages } from './batch-pages.ts';
import { CompletionRates } from './completion-rates.ts';
import { hostsPage } from './hosts-page.ts';
import { fleetPage } from './fleet-page.ts';
import { transcriptPages } from './transcript-page.ts';
import { episodeHref } from './batch-view.ts';
import { bullBoardRouter } from './bull-board.ts';
import { createFleetMetrics } from './fleet-metrics.ts';
import { readEndpointLimitMetrics } from '../model/fleet-limits.ts';

export const BULL_BOARD_PATH = '/queues';

export interface DashboardOptions {
  /** A connection the dashboard shares with its queues, for the results store and health. */
  redis: Redis;
  /** The fleet's queues, shown in Bull Board and counted in the metrics; the caller closes them. */
  queues: Queue[];
  prefix: string;
  dataDir: string;
  /** Where evidence is read (FLEET_ARTIFACTS), so one dashboard shows every host's episodes. @default the data folder */
  artifacts?: ArtifactStore;
  log: Logger;
  /** HTTP Basic credentials; undefined serves without authentication (local-only use). */
  credentials: Credentials | undefined;
  /** Bull Board write actions (retry, clean, pause, add); read-only otherwise. */
  writeEnabled: boolean;
}

export interface DashboardApp {
  app: Express;
}

const QUEUE_DESCRIPTIONS: Record<string, string> = {
  [EPISODES_QUEUE]: 'one job per episode; job id = episode id',
  [CHECKPOINTS_QUEUE]: 'background writer of durable checkpoints',
  [CLEANUP_QUEUE]: 'sandbox removal with its own budget and retries',
  [BATCHES_QUEUE]: 'one parent job per batch; it stores the summary when the last episode ends',
};

/**
 * With Basic auth a browser sends the credentials to any request, including a cross-site form post:
 * refuse state-changing requests whose Origin is another site.
 */
const sameOriginWrites: RequestHandler = (req, res, next) => {
  if (req.method === 'GET' || req.method === 'HEAD' || req.method === 'OPTIONS') return next();
  const origin = req.headers.origin;
  // Hosts only: behind a TLS proxy the browser's scheme is not the one this server sees.
  const originHost = origin === undefined ? undefined : URL.canParse(origin) ? new URL(origin).host : '';
  if (originHost === undefined || originHost === req.headers.host) return next();
  res.status(403).type('text/plain').send('cross-origin request refused\n');
};

/**
 * Without authentication (local-only) a page on another site could still reach 127.0.0.1 through DNS
 * rebinding: its requests then carry its own host name. Serve loopback host names only.
 */
const loopbackHostsOnly: RequestHandler = (req, res, next) => {
  const host = req.headers.host ?? '';
  const name = host.startsWith('[') ? host.slice(0, host.indexOf(']') + 1) : host.split(':')[0];
  if (name === '127.0.0.1' || name === 'localhost' || name === '[::1]') return next();
  res.status(421).type('text/plain').send('this local-only dashboard answers to 127.0.0.1 or localhost only\n');
};

export function createDashboardApp(opts: DashboardOptions): DashboardApp {
  const { redis, prefix, queues, log } = opts;
  const results = new ResultsStore(redis, prefix, opts.dataDir);
  const metrics = createFleetMetrics({
    queues,
    results,
    activeLeases: () => countLeases(redis, prefix),
    reapedSandboxes: async () => Number((await redis.get(reapedCountKey(prefix))) ?? 0),
    modelEndpoints: () => readEndpointLimitMetrics(redis, prefix),
    workers: () => readHostFacts(redis, prefix),
  });

  const app = express();
  app.disable('x-powered-by');
  if (opts.credentials === undefined) app.use(loopbackHostsOnly);
  app.use((_req, res, next) => {
    res.set('X-Content-Type-Options', 'nosniff').set('X-Frame-Options', 'DENY').set('Referrer-Policy', 'same-origin');
    next();
  });

  app.get('/healthz', async (_req, res) => {
    const pong = await redis.ping().catch((err: unknown) => (err as Error).message);
    res.status(pong === 'PONG' ? 200 : 503).type('text/plain').send(pong === 'PONG' ? 'ok\n' : `redis: ${pong}\n`);
  });

  if (opts.credentials !== undefined) app.use(basicAuth(opts.credentials));
  app.use(sameOriginWrites);

  app.get('/metrics', async (_req, res) => {
    const body = await metrics.render();
    res.type(metrics.contentType).send(body);
  });
  app.use(BULL_BOARD_PATH, bullBoardRouter({
    queues,
    basePath: BULL_BOARD_PATH,
    writeEnabled: opts.writeEnabled,
    descriptions: QUEUE_DESCRIPTIONS,
    // From an episode's job back to its page: result, evidence, batch.
    jobLinks: {
      [EPISODES_QUEUE]: (data) => {
        const { batchId, episodeId } = (data ?? {}) as { batchId?: unknown; episodeId?: unknown };
        return typeof batchId === 'string' && typeof episodeId === 'string'
          ? { displayText: 'Episode page', href: episodeHref(batchId, episodeId) }
          : { displayText: 'Batches', href: '/batches' };
      },
    },
  }));
  // The batch pages have no script: forbid any, and any load from elsewhere (the fleet page sets its
  // own, allowing its one same-origin script).
  app.use((req, res, next) => {
    if (!req.path.startsWith(BULL_BOARD_PATH)) res.set('Content-Security-Policy', "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'");
    next();
  });
  const rates = new CompletionRates(redis, prefix);
  app.use(batchPages({ results, rates, dataDir: opts.dataDir, ...(opts.artifacts && { artifacts: opts.artifacts }), links: { bullBoardPath: BULL_BOARD_PATH, episodesQueue: EPISODES_QUEUE } }));
  app.use(transcriptPages({ results, dataDir: opts.dataDir, ...(opts.artifacts && { artifacts: opts.artifacts }), links: { bullBoardPath: BULL_BOARD_PATH, episodesQueue: EPISODES_QUEUE } }));
  app.use(hostsPage({ redis, prefix, links: { bullBoardPath: BULL_BOARD_PATH, episodesQueue: EPISODES_QUEUE } }));
  app.use(fleetPage({ redis, prefix, queues, results, rates, links: { bullBoardPath: BULL_BOARD_PATH, episodesQueue: EPISODES_QUEUE } }));

  app.use((_req, res) => {
    res.status(404).type('text/plain').send('not found\n');
  });
  const onError: ErrorRequestHandler = (err: Error, req, res, _next) => {
    log.error({ path: req.path, err: err.message }, 'dashboard request failed');
    if (!res.headersSent) res.status(500).type('text/plain').send('internal error (see the dashboard log)\n');
  };
  app.use(onError);

  return { app };
}

export interface DashboardHandle {
  url: string;
  port: number;
  close(): Promise<void>;
}

/** Listen on host:port (0 picks a free port) until closed. */
export async function startDashboard(opts: DashboardOptions & { host: string; port: number }): Promise<DashboardHandle> {
  const { app } = createDashboardApp(opts);
  const server = app.listen(opts.port, opts.host);
  await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]);
  const { port } = server.address() as AddressInfo;
  const host = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
  return {
    url: `http://${host}:${port}`,
    port,
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await closed;
    },
  };
}

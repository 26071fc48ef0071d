// The HTTP API a trainer in any language drives the fleet through: upload a task folder as a tar and
// get its digest; create a batch from task digests (idempotent, as `enqueue` is); read its status;
// stream its results in completion order as Server-Sent Events (`id:` is the cursor, so a reconnect
// with `Last-Event-ID` resumes with no loss and no duplicate) or as NDJSON (resume with `?after=`),
// with a group event once every sample of a task has ended; cancel; retry by kind; an episode's
// trajectory and evidence. Every route but /healthz and /openapi.json needs
// `Authorization: Bearer <FLEET_API_TOKEN>`. Errors are JSON `{ error: { field, message } }` with a 4xx
// naming the field; bodies are bounded (a task tar by the task archive limit, JSON by 1 MiB).
import { timingSafeEqual } from 'node:crypto';
import { once } from 'node:events';
import { pipeline } from 'node:stream/promises';
import express, { type NextFunction, type Request, type Response } from 'express';
import type { Logger } from 'pino';
import { z } from 'zod';
import { EpisodeResult, EpisodeStatus } from '../episode/episode-job.ts';
import { PHASES } from '../results/batch-summary.ts';
import { isCursor, type FleetClient } from '../client/fleet-client.ts';
import { describeIssues, shownValue } from '../config/zod-issues.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { FAILURE_KINDS } from '../errors/failure-kind.ts';
import { printable } from '../errors/printable.ts';
import { EPISODE_ID_PATTERN } from '../ids/episode-id.ts';
import { BatchFile, TaskDigest, TaskDigestRef } from '../tasks/batch-spec.ts';
import { MAX_TASK_ARCHIVE_BYTES } from '../tasks/pack-task.ts';
import { ENDPOINT_NAME_PATTERN, PolicyVersionBody, PolicyVersionConflict, PolicyVersionState, PolicyVersionsSeen } from '../model/policy-versions.ts';

export interface ApiOptions {
  client: FleetClient;
  /** Required bearer token; undefined only when the API listens on loopback (the command enforces it). */
  token: string | undefined;
  log: Logger;
  /** A comment line on a quiet SSE stream this often. @default 15000 */
  keepAliveMs?: number;
  /** A request not answering within this long (Redis hangs) gets 503. @default 30000 */
  requestTimeoutMs?: number;
  /** A request body that stops arriving (no byte for this long before its end) gets 408. @default 5000 */
  bodyIdleMs?: number;
}

const BATCH_ID = /^[a-z0-9][a-z0-9_.-]{0,120}$/;
/** Batches a page of GET /v1/batches lists, by default and at most. */
const DEFAULT_PAGE = 100;
const MAX_PAGE = 1_000;
const KEEP_ALIVE_MS = 15_000;
/** JSON bodies are a page of settings: a batch of 10,000 digests is about 700 KB. */
const MAX_JSON_BYTES = 1024 * 1024;

const ErrorBody = z.object({ error: z.object({ field: z.string().optional(), message: z.string() }) });
const ResultEvent = z.object({ kind: z.literal('result'), cursor: z.string(), result: EpisodeResult });
const GroupEvent = z.object({
  kind: z.literal('group'), cursor: z.string(), taskId: z.string(),
  episodeIds: z.array(z.string()).describe("the task's episodes in sample order"),
  rewards: z.array(z.number().nullable()).describe('their rewards (floats) in the same order; null: not graded'),
  metrics: z.array(z.record(z.string(), z.number()).nullable()).describe("their reward-file metrics (reward.json's keys) in the same order; null: none (exit-code grading, or not graded)"),
  policyVersions: PolicyVersionsSeen.optional().describe("the policy versions the group's episodes saw: the lowest first, the highest last, every one seen; absent when none was set"),
});
/** GET /v1/batches/{batchId}: the batch summary (src/results/batch-summary.ts), as the server sends it. */
export const BatchSummaryBody = z.strictObject({
  batchId: z.string(), total: z.number().int(), done: z.number().int(), finished: z.boolean(),
  byStatus: z.record(EpisodeStatus, z.number().int()),
  byKind: z.partialRecord(z.enum(FAILURE_KINDS), z.number().int()),
  meanReward: z.number().nullable().describe('mean reward (a float) over the graded episodes; null when none was graded yet'),
  passThreshold: z.number().describe("the reward a graded episode needs to pass (the batch's passThreshold, else 1): status passed and pass@k count by it"),
  metrics: z.record(z.string(), z.strictObject({ mean: z.number(), n: z.number().int() })).describe("mean of each reward-file metric (reward.json's keys) over the graded episodes that reported it"),
  passAt: z.record(z.string(), z.number()).describe('unbiased pass@k averaged over tasks, by k ("1" and the samples per task)'),
  phases: z.record(z.enum(PHASES), z.strictObject({ p50: z.number(), p95: z.number(), n: z.number().int() })),
  tokens: z.strictObject({ prompt: z.number(), completion: z.number(), total: z.number() }),
  model: z.strictObject({ endpoint: z.string(), name: z.string().optional() }).describe("the endpoint (its name in the workers' table) and model name the batch plays; endpoint \"default\" for a batch that names none"),
  staleRestarts: z.strictObject({ episodes: z.number().int(), restarts: z.number().int() }).describe("restarts from scratch for growing staler than the batch's maxStaleness (apart from infra retries): episodes restarted, restarts in all"),
});
const StoredTaskBody = z.object({ digest: z.string(), taskId: z.string(), bytes: z.number().int() });
/** A batch over HTTP: a batch file's fields, its tasks named by digest (a folder on the server never). */
export const BatchRequest = BatchFile.extend({
  name: BatchFile.shape.name.unwrap(),
  tasks: z.array(z.union([TaskDigest, TaskDigestRef])).min(1).max(10_000),
});
const EndEvent = z.object({
  kind: z.literal('end'),
  summary: BatchSummaryBody.nullable().describe('the batch summary as the stream ended (GET /v1/batches/{batchId}); null if it could not be read'),
}).describe('the last event: every episode has a result and all were delivered (SSE: `event: end`)');
const KeepAliveEvent = z.object({ kind: z.literal('keep-alive') }).describe('sent on a quiet NDJSON stream every 15 s (SSE sends a `: keep-alive` comment line instead); carries no cursor');
const BatchListing = z.object({ batchId: z.string(), name: z.string(), createdAt: z.string(), total: z.number().int(), done: z.number().int(), finished: z.boolean() });
const BatchList = z.object({
  batches: z.array(BatchListing).describe('newest first'),
  next: z.string().optional().describe('the page token for the next page (`?after=`); absent on the last page'),
});
const BatchCreated = z.object({ batchId: z.string(), episodes: z.number().int(), added: z.boolean(), episodeIds: z.array(z.string()) });
const RetryReportBody = z.object({
  requeued: z.array(z.string()).describe('episodes put back on the queue'),
  missing: z.array(z.string()).describe('episodes of that kind whose job is no longer kept: not retried'),
  pending: z.array(z.string()).describe('episodes whose job is not finished (a retry already requeued it)'),
});
const CancelReply = z.object({ outcomes: z.record(z.string(), z.enum(['cancelled', 'cancelling', 'closing', 'ended', 'unknown'])).describe('the outcome per episode') });
const CancelRequest = z.strictObject({ episodeIds: z.array(z.string().regex(EPISODE_ID_PATTERN)).max(100_000).optional() });
const RetryRequest = z.strictObject({ kind: z.enum(FAILURE_KINDS) });

/** The OpenAPI document, its schemas generated from the same zod schemas the server uses. */
export function openApiDocument(): Record<string, unknown> {
  const schema = (s: z.ZodType) => z.toJSONSchema(s, { unrepresentable: 'any', io: 'input' });
  const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
  const json = (name: string) => ({ content: { 'application/json': { schema: ref(name) } } });
  const fault = (description: string) => ({ description, ...json('Error') });
  const path = (name: string) => ({ name, in: 'path', required: true, schema: { type: 'string' } });
  const common = { 401: fault('missing or wrong bearer token') };
  const batch = path('batchId');
  const episode = [batch, path('episodeId')];
  return {
    openapi: '3.1.0',
    info: { title: 'rollout-fleet API', version: '0.1.0' },
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      schemas: {
        Error: schema(ErrorBody), ResultEvent: schema(ResultEvent), GroupEvent: schema(GroupEvent),
        StoredTask: schema(StoredTaskBody), BatchRequest: schema(BatchRequest), BatchCreated: schema(BatchCreated),
        CancelRequest: schema(CancelRequest), RetryRequest: schema(RetryRequest), EpisodeResult: schema(EpisodeResult),
        BatchSummary: schema(BatchSummaryBody), EndEvent: schema(EndEvent), KeepAliveEvent: schema(KeepAliveEvent),
        BatchList: schema(BatchList), BatchListing: schema(BatchListing), RetryReport: schema(RetryReportBody), CancelReply: schema(CancelReply),
        PolicyVersionRequest: schema(PolicyVersionBody), PolicyVersion: schema(PolicyVersionState),
      },
    },
    security: [{ bearer: [] }],
    paths: {
      '/v1/tasks': {
        post: {
          summary: "Upload a task folder as a plain tar of its contents (task.yaml, workspace/, tests/, solution/); returns its digest",
          requestBody: { required: true, content: { 'application/x-tar': { schema: { type: 'string', format: 'binary', maxLength: MAX_TASK_ARCHIVE_BYTES } } } },
          responses: { 201: { description: 'stored', ...json('StoredTask') }, 400: fault('not a task: the message names the entry or field'), 413: fault('larger than the task archive limit'), 415: fault('not application/x-tar'), ...common },
        },
      },
      '/v1/batches': {
        get: {
          summary: 'The batches, newest first, a page at a time',
          parameters: [
            { name: 'limit', in: 'query', required: false, schema: { type: 'integer', minimum: 1, maximum: MAX_PAGE, default: DEFAULT_PAGE } },
            { name: 'after', in: 'query', required: false, schema: { type: 'string' }, description: "a previous page's `next`: the page after it" },
          ],
          responses: { 200: { description: 'a page', ...json('BatchList') }, 400: fault('a bad limit or page token, naming the field'), ...common },
        },
        post: {
          summary: 'Create a batch from task digests; the same batch again names the same batch and adds nothing',
          requestBody: { required: true, ...json('BatchRequest') },
          responses: { 201: { description: 'enqueued', ...json('BatchCreated') }, 200: { description: 'enqueued before; nothing added', ...json('BatchCreated') }, 400: fault('malformed; the field is named'), 413: fault('body over 1 MiB'), 422: fault('a task digest not stored, or an image no host has'), ...common },
        },
      },
      '/v1/batches/{batchId}': {
        get: { summary: "The batch's summary so far", parameters: [batch], responses: { 200: { description: 'summary', ...json('BatchSummary') }, 404: fault('no such batch'), ...common } },
      },
      '/v1/batches/{batchId}/results': {
        get: {
          summary: 'Results in completion order, and a group event per task once all its samples ended; ends when every episode has a result',
          parameters: [
            batch,
            { name: 'after', in: 'query', required: false, schema: { type: 'string', default: '0' }, description: "resume right after this cursor: an event's `cursor` (SSE: its `id:`) this batch's stream sent; `0` (the default) is the start. A cursor this batch's stream never sent (another batch's, or past its end) is refused with 400. With the `Last-Event-ID` header too, both must be the same cursor (else 400)" },
            { name: 'Last-Event-ID', in: 'header', required: false, schema: { type: 'string' }, description: 'the same as `after` (what an EventSource sends when it reconnects)' },
            { name: 'Accept', in: 'header', required: false, schema: { type: 'string' }, description: 'text/event-stream or application/x-ndjson (the default), with q-values honoured; neither acceptable: 406' },
          ],
          responses: {
            200: {
              description: 'One event per result, a group event once every sample of a task has ended, keep-alives while quiet, and an end event (with the summary) last. A stream that closes before its end event was cut: reconnect from the last cursor received.',
              content: {
                'application/x-ndjson': { schema: { description: 'one JSON object a line', oneOf: [ref('ResultEvent'), ref('GroupEvent'), ref('EndEvent'), ref('KeepAliveEvent')] } },
                'text/event-stream': {
                  schema: { type: 'string', description: 'Server-Sent Events: `id: <cursor>`, `event: result|group`, `data: <the event as JSON>`; then `event: end` with `data: <EndEvent>`; `: keep-alive` comment lines while quiet' },
                  'x-events': { result: ref('ResultEvent'), group: ref('GroupEvent'), end: ref('EndEvent') },
                },
              },
            },
            400: fault('a bad cursor, one this batch never sent, or Last-Event-ID and after that differ; naming the field'),
            406: fault('Accept names neither text/event-stream nor application/x-ndjson'),
            404: fault('no such batch'),
            ...common,
          },
        },
      },
      '/v1/endpoints/{endpoint}/policy-version': {
        put: {
          summary: "Set the current policy version of a model endpoint (`default` until named endpoints exist): every model call that starts after this returns is stamped with it. Versions only move forward; the same version again is kept",
          parameters: [path('endpoint')],
          requestBody: { required: true, ...json('PolicyVersionRequest') },
          responses: { 200: { description: 'the current version', ...json('PolicyVersion') }, 400: fault('malformed; the field is named'), 409: fault('lower than the current version (field version)'), ...common },
        },
        get: {
          summary: "The endpoint's current policy version",
          parameters: [path('endpoint')],
          responses: { 200: { description: 'the current version', ...json('PolicyVersion') }, 400: fault('not an endpoint name'), 404: fault('no version was ever set for the endpoint'), ...common },
        },
      },
      '/v1/batches/{batchId}/cancel': {
        post: { summary: 'Cancel the batch (or the episodes named): queued ones at once, running ones at their next step', parameters: [batch], requestBody: { required: false, ...json('CancelRequest') }, responses: { 200: { description: 'outcome per episode', ...json('CancelReply') }, 400: fault('malformed'), 404: fault('no such batch'), ...common } },
      },
      '/v1/batches/{batchId}/retry': {
        post: { summary: 'Run again the episodes that failed with a kind', parameters: [batch], requestBody: { required: true, ...json('RetryRequest') }, responses: { 200: { description: 'requeued, missing and pending episode ids', ...json('RetryReport') }, 400: fault('malformed'), 404: fault('no such batch'), ...common } },
      },
      '/v1/batches/{batchId}/episodes/{episodeId}': {
        get: { summary: "The episode's result", parameters: episode, responses: { 200: { description: 'result', ...json('EpisodeResult') }, 404: fault('no such episode, or no result yet'), ...common } },
      },
      '/v1/batches/{batchId}/episodes/{episodeId}/trajectory': {
        get: { summary: 'The trajectory document: task, reward, attempts, usage, timings, conversation with token ids and logprobs', parameters: episode, responses: { 200: { description: 'trajectory' }, 404: fault('no such episode, or no result yet'), ...common } },
      },
      '/v1/batches/{batchId}/episodes/{episodeId}/evidence': {
        get: { summary: 'The evidence files of every attempt (attempt, name, bytes, href)', parameters: episode, responses: { 200: { description: 'index' }, 404: fault('no such episode'), ...common } },
      },
      '/v1/batches/{batchId}/episodes/{episodeId}/evidence/{attempt}/{name}': {
        get: { summary: 'One evidence file, as kept', parameters: [...episode, path('attempt'), path('name')], responses: { 200: { description: 'the file (application/octet-stream)' }, 404: fault('no such file'), ...common } },
      },
    },
  };
}

/** An error the API answers with a status and the field it is about. */
class ApiError extends Error {
  constructor(readonly status: number, readonly field: string | undefined, message: string) {
    super(message);
  }
}

const fail = (res: Response, status: number, message: string, field?: string) =>
  res.status(status).json({ error: { ...(field !== undefined && { field }), message } });

/** A fleet error's message names its field after the source: "request: tasks.2: ...", "body: task.yaml: ...". */
function fieldOf(message: string): string | undefined {
  return /^(?:request: )?([A-Za-z0-9_.[\]-]+)[: ]/.exec(message)?.[1];
}

/** What a failed call answers: the fleet's input errors as 4xx naming the field, anything else as 500. */
function answerError(res: Response, err: unknown, log: Logger): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  if (err instanceof ApiError) {
    fail(res, err.status, err.message, err.field);
    return;
  }
  const bodyError = err as { type?: string; limit?: number; length?: number };
  if (bodyError.type === 'entity.too.large') {
    fail(res, 413, `body: larger than ${bodyError.limit} bytes, the limit of this route (got ${bodyError.length ?? 'more'} bytes)`, 'body');
    return;
  }
  if (bodyError.type === 'entity.parse.failed') {
    fail(res, 400, `body: ${jsonKind((err as { body?: unknown }).body)}`, 'body');
    return;
  }
  // The client hung up mid-body: nobody is left to answer, and it is no fault of the server's.
  if (bodyError.type === 'request.aborted') {
    res.destroy();
    return;
  }
  if (err instanceof FleetError && ['invalid_task', 'task_archive_missing', 'image_not_found'].includes(err.code)) {
    const message = err.message.split('\n')[0]!;
    fail(res, err.code === 'invalid_task' ? 400 : 422, err.message, fieldOf(message));
    return;
  }
  if (err instanceof TypeError && /^[a-zA-Z]+: /.test(err.message)) {
    fail(res, 400, err.message, fieldOf(err.message));
    return;
  }
  log.error({ err }, 'api request failed');
  fail(res, 500, 'internal error (see the API log)');
}

/** Why a JSON body was refused: valid JSON that is not an object (null, a number...) is said so. */
function jsonKind(text: unknown): string {
  if (typeof text !== 'string') return 'not valid JSON';
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return 'not valid JSON';
  }
  const kind = value === null ? 'null' : Array.isArray(value) ? 'a list' : typeof value === 'string' ? 'a string' : `a ${typeof value}`;
  return `must be a JSON object (got ${kind})`;
}

function parseBody<S extends z.ZodType>(schema: S, body: unknown): z.infer<S> {
  const parsed = schema.safeParse(body ?? {});
  if (!parsed.success) {
    const lines = describeIssues(parsed.error, body);
    const first = parsed.error.issues[0]!;
    throw new ApiError(400, first.path.length > 0 ? first.path.map(String).join('.') : 'body', lines.map((l) => `request: ${l}`).join('\n'));
  }
  return parsed.data;
}

function bearer(token: string | undefined) {
  const expected = token === undefined ? undefined : Buffer.from(token);
  return (req: Request, res: Response, next: NextFunction) => {
    if (expected === undefined) return next();
    // The scheme is case-insensitive (RFC 7235); the token is compared in constant time.
    const got = Buffer.from(/^bearer +(.*)$/i.exec(req.headers.authorization ?? '')?.[1] ?? '');
    if (got.length !== expected.length || !timingSafeEqual(got, expected)) {
      res.setHeader('www-authenticate', 'Bearer');
      return fail(res, 401, `authorization: ${req.headers.authorization === undefined ? 'missing' : 'not the expected'} Bearer token (FLEET_API_TOKEN)`, 'authorization');
    }
    return next();
  };
}

/** A JSON body must say so: anything else is refused before it is read (415 naming the header). */
function jsonBody(limit: number) {
  const parse = express.json({ limit, type: () => true });
  return (req: Request, res: Response, next: NextFunction) => {
    const type = req.headers['content-type'];
    const hasBody = req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
    if (hasBody && !/^application\/json\s*(;|$)/i.test(type ?? '')) {
      return fail(res, 415, `content-type: expected application/json (got ${JSON.stringify((type ?? 'nothing').slice(0, 80))})`, 'content-type');
    }
    return parse(req, res, next);
  };
}

/**
 * Requests need the fleet's Redis: while it is away they get 503 at once, and one that has not begun
 * answering within `timeoutMs` (a Redis that hangs) gets 503 then, instead of waiting without end.
 * The result stream, once begun, waits out outages itself.
 */
function redisBound(client: FleetClient, timeoutMs: number) {
  const unavailable = (res: Response) => fail(res, 503, "the fleet's Redis is not reachable now; try again shortly");
  // Not only Redis: a slow store or a loaded host ends here too, and the message does not guess.
  const late = (res: Response) => fail(res, 503, `no answer within ${timeoutMs} ms (the fleet's Redis or artifact store is slow or away); try again shortly`);
  // A body still arriving then (a slow client, bytes trickling) is the client's, and said so.
  const slowBody = (res: Response) => {
    res.setHeader('connection', 'close');
    fail(res, 408, `body: not all received within ${timeoutMs} ms (the client is sending it too slowly)`, 'body');
  };
  return (req: Request, res: Response, next: NextFunction) => {
    if (!client.connected) return unavailable(res);
    const hasBody = req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
    const timer = setTimeout(() => {
      if (res.headersSent) return;
      if (hasBody && !req.complete) {
        slowBody(res);
        res.once('finish', () => req.destroy());
      } else late(res);
    }, timeoutMs);
    res.on('close', () => clearTimeout(timer));
    res.on('finish', () => clearTimeout(timer));
    const flush = res.flushHeaders.bind(res);
    // A stream's headers going out is its answer beginning.
    res.flushHeaders = () => {
      clearTimeout(timer);
      flush();
    };
    return next();
  };
}

/**
 * Each request logged as it ends: method, path (no query: nothing secret goes there, but nothing is
 * needed from it either), status and milliseconds; never a header. A 401 is a warning.
 */
function requestLog(log: Logger) {
  return (req: Request, res: Response, next: NextFunction) => {
    const started = performance.now();
    let logged = false;
    const done = () => {
      if (logged) return;
      logged = true;
      const line = { method: req.method, path: printable(req.path.slice(0, 200)), status: res.statusCode, ms: Math.round(performance.now() - started), ...(!res.writableFinished && { aborted: true }) };
      if (res.statusCode === 401) log.warn({ ...line, remote: req.socket.remoteAddress }, 'api request refused: no or wrong bearer token');
      else if (req.path === '/healthz') log.debug(line, 'api request');
      else log.info(line, 'api request');
    };
    res.on('finish', done);
    res.on('close', done);
    next();
  };
}

/**
 * A body that stops arriving before its end (Content-Length promised more; a chunked body with no last
 * chunk) is the client's doing: after `idleMs` with no byte it gets 408 saying so, and the connection
 * is closed, instead of waiting for the 503 of a fleet that is slow.
 */
function bodyWatch(idleMs: number) {
  return (req: Request, res: Response, next: NextFunction) => {
    const hasBody = req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
    if (!hasBody || req.complete) return next();
    const socket = req.socket;
    let seen = socket.bytesRead;
    let lastByte = performance.now();
    const timer = setInterval(() => {
      if (req.complete || res.headersSent) return clearInterval(timer);
      if (socket.bytesRead !== seen) {
        seen = socket.bytesRead;
        lastByte = performance.now();
        return;
      }
      if (performance.now() - lastByte < idleMs) return;
      clearInterval(timer);
      const length = req.headers['content-length'];
      res.setHeader('connection', 'close');
      fail(res, 408, `body: incomplete: the client stopped sending it (${length !== undefined ? `Content-Length says ${Number(length)} bytes; ` : ''}no byte for ${idleMs} ms); send the whole body`, 'body');
      res.once('finish', () => req.destroy());
    }, Math.max(50, Math.min(1_000, idleMs / 5)));
    timer.unref();
    res.once('close', () => clearInterval(timer));
    req.once('end', () => clearInterval(timer));
    return next();
  };
}

function batchIdOf(req: Request): string {
  const { batchId } = req.params as { batchId: string };
  if (!BATCH_ID.test(batchId)) throw new ApiError(400, 'batchId', `batchId: not a batch id (got ${JSON.stringify(batchId.slice(0, 80))})`);
  return batchId;
}

/** The batch's id and its episode's, checked to belong together. */
function episodeOf(req: Request): { batchId: string; episodeId: string } {
  const batchId = batchIdOf(req);
  const { episodeId } = req.params as { episodeId: string };
  if (!EPISODE_ID_PATTERN.test(episodeId) || !episodeId.startsWith(`${batchId}.`)) {
    throw new ApiError(400, 'episodeId', `episodeId: not an episode of batch ${batchId} (got ${JSON.stringify(episodeId.slice(0, 80))})`);
  }
  return { batchId, episodeId };
}

export function createApiApp(opts: ApiOptions): express.Express {
  const { client, log } = opts;
  const app = express();
  app.disable('x-powered-by');
  app.use(requestLog(log));
  app.use(bodyWatch(opts.bodyIdleMs ?? 5_000));
  // Ready means Redis is reachable: a load balancer or compose's health check sees an outage.
  app.get('/healthz', (_req, res) => res.status(client.connected ? 200 : 503).json({ ok: client.connected, redis: client.connected ? 'connected' : 'unreachable' }));
  app.get('/openapi.json', (_req, res) => res.json(openApiDocument()));
  app.use(bearer(opts.token));
  app.use('/v1', redisBound(client, opts.requestTimeoutMs ?? 30_000));
  const json = jsonBody(MAX_JSON_BYTES);
  const needBatch = async (batchId: string) => {
    const summary = await client.status(batchId);
    if (summary === undefined) throw new ApiError(404, 'batchId', `batchId: no batch ${JSON.stringify(batchId)}`);
    return summary;
  };

  app.post('/v1/tasks', (req, res, next) => {
    if (!(req.headers['content-type'] ?? '').startsWith('application/x-tar')) {
      return fail(res, 415, `content-type: expected application/x-tar (a plain tar of the task folder's contents) (got ${JSON.stringify((req.headers['content-type'] ?? 'nothing').slice(0, 80))})`, 'content-type');
    }
    return next();
  }, express.raw({ type: () => true, limit: MAX_TASK_ARCHIVE_BYTES }), async (req, res) => {
    const stored = await client.uploadTaskTar(Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0));
    res.status(201).json(stored);
  });

  app.post('/v1/batches', json, async (req, res) => {
    const request = parseBody(BatchRequest, req.body);
    const plan = await client.enqueueRequest({ ...request, tasks: request.tasks.map((t) => (typeof t === 'string' ? { digest: t } : t)) });
    res.status(plan.added ? 201 : 200).json({ batchId: plan.batchId, episodes: plan.jobs.length, added: plan.added, episodeIds: plan.jobs.map((j) => j.episodeId) });
  });

  app.get('/v1/batches', async (req, res) => {
    const { limit: rawLimit, after } = req.query;
    if (rawLimit !== undefined && (typeof rawLimit !== 'string' || !/^\d{1,4}$/.test(rawLimit) || Number(rawLimit) < 1 || Number(rawLimit) > MAX_PAGE)) {
      throw new ApiError(400, 'limit', `limit: expected a whole number from 1 to ${MAX_PAGE} (got ${JSON.stringify(String(rawLimit).slice(0, 20))})`);
    }
    if (after !== undefined && (typeof after !== 'string' || !BATCH_ID.test(after))) {
      throw new ApiError(400, 'after', `after: not a page token (a batch id from a previous page's next) (got ${shownValue(String(after))})`);
    }
    try {
      res.json(await client.listBatches({ limit: rawLimit === undefined ? DEFAULT_PAGE : Number(rawLimit), ...(after !== undefined && { after }) }));
    } catch (err) {
      if (err instanceof TypeError) throw new ApiError(400, 'after', err.message);
      throw err;
    }
  });

  app.get('/v1/batches/:batchId', async (req, res) => {
    res.json(await needBatch(batchIdOf(req)));
  });

  app.post('/v1/batches/:batchId/cancel', json, async (req, res) => {
    const batchId = batchIdOf(req);
    const { episodeIds } = parseBody(CancelRequest, req.body);
    await needBatch(batchId);
    const foreign = episodeIds?.find((id) => !id.startsWith(`${batchId}.`));
    if (foreign !== undefined) throw new ApiError(400, 'episodeIds', `episodeIds: not an episode of batch ${batchId} (got ${JSON.stringify(foreign)})`);
    res.json({ outcomes: (await client.cancel(batchId, { ...(episodeIds && { episodeIds }), by: 'api' })).outcomes });
  });

  app.post('/v1/batches/:batchId/retry', json, async (req, res) => {
    const batchId = batchIdOf(req);
    const { kind } = parseBody(RetryRequest, req.body);
    await needBatch(batchId);
    res.json(await client.retryByKind(batchId, kind));
  });

  const endpointOf = (req: Request): string => {
    const { endpoint } = req.params as { endpoint: string };
    if (!ENDPOINT_NAME_PATTERN.test(endpoint)) throw new ApiError(400, 'endpoint', `endpoint: not an endpoint name: letters, digits, ., - and _, at most 64 characters (got ${JSON.stringify(endpoint.slice(0, 80))})`);
    return endpoint;
  };

  app.put('/v1/endpoints/:endpoint/policy-version', json, async (req, res) => {
    const endpoint = endpointOf(req);
    if (req.body === null || typeof req.body !== 'object' || Array.isArray(req.body)) throw new ApiError(400, 'body', 'body: expected a JSON object {"version": <non-negative integer>}');
    const { version } = parseBody(PolicyVersionBody, req.body);
    try {
      res.json(await client.setPolicyVersion(endpoint, version));
    } catch (err) {
      if (err instanceof PolicyVersionConflict) throw new ApiError(409, 'version', err.message);
      throw err;
    }
  });

  app.get('/v1/endpoints/:endpoint/policy-version', async (req, res) => {
    const endpoint = endpointOf(req);
    const state = await client.getPolicyVersion(endpoint);
    if (state === undefined) throw new ApiError(404, 'endpoint', `endpoint: no policy version was ever set for ${JSON.stringify(endpoint)}`);
    res.json(state);
  });

  app.get('/v1/batches/:batchId/episodes/:episodeId', async (req, res) => {
    const { batchId, episodeId } = episodeOf(req);
    const result = await client.result(batchId, episodeId);
    if (result === undefined) throw new ApiError(404, 'episodeId', `episodeId: no result for ${JSON.stringify(episodeId)} (yet)`);
    res.json(result);
  });

  app.get('/v1/batches/:batchId/episodes/:episodeId/trajectory', async (req, res) => {
    const { batchId, episodeId } = episodeOf(req);
    const gone = new AbortController();
    res.on('close', () => gone.abort());
    const record = await client.trajectory(batchId, episodeId, AbortSignal.any([gone.signal, AbortSignal.timeout(60_000)]));
    if (record === undefined) throw new ApiError(404, 'episodeId', `episodeId: no result for ${JSON.stringify(episodeId)} (yet)`);
    res.json(record);
  });

  app.get('/v1/batches/:batchId/episodes/:episodeId/evidence', async (req, res) => {
    const { batchId, episodeId } = episodeOf(req);
    const files = await client.evidenceIndex(episodeId, AbortSignal.timeout(60_000));
    res.json({ episodeId, files: files.map((f) => ({ ...f, href: `/v1/batches/${batchId}/episodes/${episodeId}/evidence/${f.attempt}/${encodeURIComponent(f.name)}` })) });
  });

  app.get('/v1/batches/:batchId/episodes/:episodeId/evidence/:attempt/:name', async (req, res) => {
    const { episodeId } = episodeOf(req);
    const { attempt, name } = req.params as { attempt: string; name: string };
    if (!/^\d{1,6}$/.test(attempt)) throw new ApiError(400, 'attempt', `attempt: expected a number (got ${JSON.stringify(attempt.slice(0, 20))})`);
    const gone = new AbortController();
    res.on('close', () => gone.abort());
    const stream = await client.openEvidence(episodeId, Number(attempt), name, gone.signal);
    if (stream === undefined) throw new ApiError(404, 'name', `name: attempt ${attempt} of ${episodeId} kept no file ${JSON.stringify(name.slice(0, 80))}`);
    // Evidence is the agent's writing: never rendered by a browser that opens it.
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'x-content-type-options': 'nosniff', 'content-disposition': 'attachment' });
    await pipeline(stream, res).catch(() => res.destroy());
  });

  app.get('/v1/batches/:batchId/results', async (req, res) => {
    const batchId = batchIdOf(req);
    // Accept's q-values decide (text/event-stream;q=0 is a no); no Accept, or */*, is NDJSON.
    const media = req.accepts(['application/x-ndjson', 'text/event-stream']);
    if (media === false) {
      throw new ApiError(406, 'accept', `accept: expected text/event-stream or application/x-ndjson (got ${shownValue(String(req.headers.accept))})`);
    }
    const sse = media === 'text/event-stream';
    const header = req.headers['last-event-id'];
    const lastEventId = typeof header === 'string' && header !== '' ? header : undefined;
    const query = typeof req.query.after === 'string' ? req.query.after : undefined;
    if (lastEventId !== undefined && query !== undefined && lastEventId !== query) {
      throw new ApiError(400, 'after', `after: differs from the Last-Event-ID header (${shownValue(query)} and ${shownValue(lastEventId)}): send one, or the same cursor in both`);
    }
    const after = lastEventId ?? query ?? '0';
    const field = lastEventId !== undefined ? 'Last-Event-ID' : 'after';
    if (!isCursor(after)) throw new ApiError(400, field, `${field}: not a cursor: expected an event id this stream sent, or 0 (got ${shownValue(after)})`);
    await needBatch(batchId);
    // A cursor of another batch, or past this one's end, would skip every result: refused, not followed.
    if (!(await client.knowsCursor(batchId, after))) {
      throw new ApiError(400, field, `${field}: not a cursor this batch's stream sent (another batch's, or past its end): expected an event id of batch ${batchId}, or 0 (got ${shownValue(after)})`);
    }
    const gone = new AbortController();
    res.on('close', () => gone.abort());
    res.writeHead(200, sse
      ? { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' }
      : { 'content-type': 'application/x-ndjson; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
    res.flushHeaders();
    // Every 15 s while no episode ends: proxies and clients do not take a quiet stream for a dead one.
    // SSE sends a comment line; NDJSON a keep-alive record (no cursor: it moves nothing).
    const keepAlive = setInterval(() => res.write(sse ? ': keep-alive\n\n' : '{"kind":"keep-alive"}\n'), opts.keepAliveMs ?? KEEP_ALIVE_MS);
    try {
      for await (const event of client.results(batchId, { after, signal: gone.signal, blockMs: 1_000 })) {
        const body = event.kind === 'result'
          ? { kind: 'result', cursor: event.cursor, result: event.result }
          : { kind: 'group', cursor: event.cursor, taskId: event.taskId, episodeIds: event.episodeIds, rewards: event.rewards, metrics: event.metrics, ...(event.policyVersions && { policyVersions: event.policyVersions }) };
        const text = JSON.stringify(body);
        // Every event carries its cursor as its id: a reconnect resumes right after the last one received.
        const written = sse ? res.write(`id: ${event.cursor}\nevent: ${event.kind}\ndata: ${text}\n\n`) : res.write(`${text}\n`);
        // A slow reader holds the stream here, not the server's memory; one that left ends it.
        if (!written) await Promise.race([once(res, 'drain'), once(gone.signal, 'abort')]);
      }
      // The end, told apart from a cut: every episode has a result and all were delivered.
      const summary = await client.status(batchId).catch(() => undefined);
      const end = JSON.stringify({ kind: 'end', summary: summary ?? null });
      res.write(sse ? `event: end\ndata: ${end}\n\n` : `${end}\n`);
    } catch (err) {
      if (!gone.signal.aborted) log.warn({ batchId, err: String(err) }, 'result stream ended by an error');
    } finally {
      clearInterval(keepAlive);
    }
    res.end();
  });

  app.use((_req: Request, res: Response) => fail(res, 404, 'no such route'));
  app.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => answerError(res, err, log));
  return app;
}

// The HTTP API a trainer in any language drives the fleet through (first slice: a batch's status and
// its results as they finish). Results stream in completion order as Server-Sent Events (`id:` is the
// cursor, so a reconnect with `Last-Event-ID` resumes with no loss and no duplicate) or as NDJSON
// (resume with `?after=<cursor>`), with a group event once every sample of a task has ended. Every
// route but /healthz and /openapi.json needs `Authorization: Bearer <FLEET_API_TOKEN>`.
import { timingSafeEqual } from 'node:crypto';
import express, { type NextFunction, type Request, type Response } from 'express';
import type { Logger } from 'pino';
import { z } from 'zod';
import { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { FleetClient } from '../client/fleet-client.ts';

export interface ApiOptions {
  client: FleetClient;
  /** Required bearer token; undefined only when the API listens on loopback (the command enforces it). */
  token: string | undefined;
  log: Logger;
}

const CURSOR = /^(\d{1,20}-\d{1,20}(:g)?|0)$/;
const BATCH_ID = /^[a-z0-9][a-z0-9_.-]{0,120}$/;

const ErrorBody = z.object({ error: z.object({ field: z.string().optional(), message: z.string() }) });
const ResultEvent = z.object({ kind: z.literal('result'), cursor: z.string(), result: EpisodeResult });
const GroupEvent = z.object({ kind: z.literal('group'), cursor: z.string(), taskId: z.string(), rewards: z.array(z.number().nullable()) });

/** The OpenAPI document, its schemas generated from the same zod schemas the server uses. */
export function openApiDocument(): Record<string, unknown> {
  const schema = (s: z.ZodType) => z.toJSONSchema(s, { unrepresentable: 'any' });
  const errors = { 401: { description: 'missing or wrong bearer token', content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } } };
  return {
    openapi: '3.1.0',
    info: { title: 'rollout-fleet API', version: '0.1.0' },
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      schemas: { Error: schema(ErrorBody), ResultEvent: schema(ResultEvent), GroupEvent: schema(GroupEvent) },
    },
    security: [{ bearer: [] }],
    paths: {
      '/v1/batches/{batchId}': {
        get: { summary: "The batch's summary so far", parameters: [{ name: 'batchId', in: 'path', required: true, schema: { type: 'string' } }], responses: { 200: { description: 'summary' }, 404: { description: 'no such batch' }, ...errors } },
      },
      '/v1/batches/{batchId}/results': {
        get: {
          summary: 'Results in completion order, and a group event per task once all its samples ended; ends when every episode has a result',
          parameters: [
            { name: 'batchId', in: 'path', required: true, schema: { type: 'string' } },
            { name: 'after', in: 'query', required: false, schema: { type: 'string' }, description: 'resume after this cursor (or the Last-Event-ID header)' },
          ],
          responses: {
            200: {
              description: 'text/event-stream (Accept: text/event-stream; `id:` is the cursor) or application/x-ndjson',
              content: { 'application/x-ndjson': { schema: { oneOf: [{ $ref: '#/components/schemas/ResultEvent' }, { $ref: '#/components/schemas/GroupEvent' }] } } },
            },
            400: { description: 'a bad cursor, naming the field' },
            404: { description: 'no such batch' },
            ...errors,
          },
        },
      },
    },
  };
}

const fail = (res: Response, status: number, message: string, field?: string) =>
  res.status(status).json({ error: { ...(field !== undefined && { field }), message } });

function bearer(token: string | undefined) {
  const expected = token === undefined ? undefined : Buffer.from(`Bearer ${token}`);
  return (req: Request, res: Response, next: NextFunction) => {
    if (expected === undefined) return next();
    const got = Buffer.from(req.headers.authorization ?? '');
    if (got.length !== expected.length || !timingSafeEqual(got, expected)) {
      res.setHeader('www-authenticate', 'Bearer');
      return fail(res, 401, 'authorization: a Bearer token is required (FLEET_API_TOKEN)', 'authorization');
    }
    return next();
  };
}

export function createApiApp(opts: ApiOptions): express.Express {
  const app = express();
  app.disable('x-powered-by');
  app.get('/healthz', (_req, res) => res.json({ ok: true }));
  app.get('/openapi.json', (_req, res) => res.json(openApiDocument()));
  app.use(bearer(opts.token));

  app.get('/v1/batches/:batchId', async (req, res) => {
    const { batchId } = req.params;
    if (!BATCH_ID.test(batchId)) return fail(res, 400, `batchId: not a batch id (got ${JSON.stringify(batchId.slice(0, 80))})`, 'batchId');
    const summary = await opts.client.status(batchId);
    if (summary === undefined) return fail(res, 404, `batchId: no batch ${JSON.stringify(batchId)}`, 'batchId');
    return res.json(summary);
  });

  app.get('/v1/batches/:batchId/results', async (req, res) => {
    const { batchId } = req.params;
    if (!BATCH_ID.test(batchId)) return fail(res, 400, `batchId: not a batch id (got ${JSON.stringify(batchId.slice(0, 80))})`, 'batchId');
    const sse = (req.headers.accept ?? '').includes('text/event-stream');
    const lastEventId = req.headers['last-event-id'];
    const after = (typeof lastEventId === 'string' && lastEventId !== '' ? lastEventId : undefined) ?? (typeof req.query.after === 'string' ? req.query.after : undefined) ?? '0';
    if (!CURSOR.test(after)) return fail(res, 400, `after: not a cursor (got ${JSON.stringify(after.slice(0, 80))})`, sse ? 'Last-Event-ID' : 'after');
    if ((await opts.client.status(batchId)) === undefined) return fail(res, 404, `batchId: no batch ${JSON.stringify(batchId)}`, 'batchId');
    const gone = new AbortController();
    res.on('close', () => gone.abort());
    res.writeHead(200, sse
      ? { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' }
      : { 'content-type': 'application/x-ndjson; charset=utf-8', 'cache-control': 'no-cache' });
    res.flushHeaders();
    try {
      for await (const event of opts.client.results(batchId, { after, signal: gone.signal, blockMs: 1_000 })) {
        const body = event.kind === 'result'
          ? { kind: 'result', cursor: event.cursor, result: event.result }
          : { kind: 'group', cursor: event.cursor, taskId: event.taskId, rewards: event.rewards };
        const text = JSON.stringify(body);
        // Every event carries its cursor as its id: a reconnect resumes right after the last one received.
        const written = sse ? res.write(`id: ${event.cursor}\nevent: ${event.kind}\ndata: ${text}\n\n`) : res.write(`${text}\n`);
        if (!written) await new Promise((resolve) => res.once('drain', resolve));
      }
      if (sse) res.write('event: end\ndata: {}\n\n');
    } catch (err) {
      if (!gone.signal.aborted) opts.log.warn({ batchId, err: String(err) }, 'result stream ended by an error');
    }
    res.end();
    return undefined;
  });

  app.use((_req, res) => fail(res, 404, 'no such route'));
  return app;
}

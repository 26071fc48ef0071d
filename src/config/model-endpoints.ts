// The worker's table of model endpoints: each a name, a base URL, the NAME of the environment variable
// that holds its key (the key itself is read here, at start, and stays in the worker process: never in
// Redis, a job, the evidence or a sandbox), an optional model name, its fleet-wide limits and its
// capture default. From FLEET_MODEL_ENDPOINTS (JSON) or FLEET_MODEL_ENDPOINTS_FILE (a JSON or YAML
// file); today's MODEL_BASE_URL / MODEL_NAME / MODEL_API_KEY / MODEL_* limits are the endpoint named
// `default`. A batch picks one by name (`model.endpoint`, default `default`).
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { describeIssues } from './zod-issues.ts';

/** The name of the endpoint today's MODEL_* settings make, and the one a batch without `model.endpoint` uses. */
export const DEFAULT_ENDPOINT = 'default';

/** An endpoint's name: what a batch's `model.endpoint` says, and part of its limiter's Redis keys. */
export const EndpointName = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'an endpoint name: letters, digits, ., - and _ (at most 64, not starting with . - or _)');

const positiveInt = z.number().int().positive();

/** One entry of FLEET_MODEL_ENDPOINTS as written. */
export const EndpointEntry = z.strictObject({
  name: EndpointName,
  /** OpenAI-compatible base URL ending before `/chat/completions`, e.g. http://127.0.0.1:8000/v1. */
  baseUrl: z
    .string()
    .regex(/^https?:\/\/[^/]/, 'must be an http:// or https:// URL')
    .refine((u) => URL.canParse(u), 'must be a valid URL')
    .refine((u) => !URL.canParse(u) || new URL(u).password === '', 'must hold no password: put the key in the variable keyEnv names'),
  /** The NAME of the environment variable holding the key sent as `Authorization: Bearer <key>`. Unset: no header. */
  keyEnv: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, 'an environment variable name: letters, digits and _').optional(),
  /** The model name the proxy puts in every request to this endpoint (a batch's `model.name` wins). */
  model: z.string().min(1).max(256).optional(),
  /** Concurrent requests to this endpoint across the fleet. Unset: no limit. */
  maxConcurrent: positiveInt.optional(),
  /** Requests per minute to this endpoint across the fleet. Unset: no limit. */
  requestsPerMinute: positiveInt.optional(),
  /** Tokens per minute of this endpoint across the fleet. Unset: no limit. */
  tokensPerMinute: positiveInt.optional(),
  /** What a batch that says no `model.capture` asks of this endpoint. @default none */
  capture: z.enum(['none', 'tokens']).optional(),
});
export type EndpointEntry = z.infer<typeof EndpointEntry>;

export const EndpointTableSchema = z.array(EndpointEntry).max(256);

/** An endpoint as a worker holds it: its key read from the environment. */
export interface ModelEndpoint {
  name: string;
  baseUrl: string;
  /** Never leaves the worker process. */
  apiKey?: string | undefined;
  /** Put in every request (unless the batch names its own model). */
  model?: string | undefined;
  /** Fleet-wide limits (src/model/fleet-limits.ts's FleetLimits). */
  limits: { maxConcurrent?: number | undefined; requestsPerMinute?: number | undefined; tokensPerMinute?: number | undefined };
  capture?: 'none' | 'tokens' | undefined;
}

export class EndpointTableError extends Error {
  override readonly name = 'EndpointTableError';
  constructor(readonly problems: string[]) {
    super(problems.join('; '));
  }
}

/** What the table is read from; only the settings it names are used. */
export interface EndpointSources {
  /** FLEET_MODEL_ENDPOINTS: the table as JSON. */
  json?: string | undefined;
  /** FLEET_MODEL_ENDPOINTS_FILE: a file with the table as JSON or YAML (a list, or `{ endpoints: [...] }`). */
  file?: string | undefined;
  /** The `default` endpoint from MODEL_BASE_URL and friends, when set. */
  legacy?: ModelEndpoint | undefined;
}

/**
 * Parse and check an endpoint table: unique names, keys present in `env` (by name; the value is never
 * shown) unless `requireKeys` is false (a command that sends no model calls). `where` names the setting in messages. Throws EndpointTableError listing every problem.
 */
export function parseEndpointTable(input: unknown, where: string, env: NodeJS.ProcessEnv, requireKeys = true): ModelEndpoint[] {
  const doc = input !== null && typeof input === 'object' && !Array.isArray(input) && 'endpoints' in input && Object.keys(input).length === 1
    ? (input as { endpoints: unknown }).endpoints
    : input;
  const parsed = EndpointTableSchema.safeParse(doc);
  if (!parsed.success) throw new EndpointTableError(describeIssues(parsed.error, doc).map((p) => `${where}: ${p}`));
  const problems: string[] = [];
  const seen = new Set<string>();
  const out: ModelEndpoint[] = [];
  parsed.data.forEach((e, i) => {
    if (seen.has(e.name)) problems.push(`${where}: ${i}.name: the endpoint ${JSON.stringify(e.name)} is named twice`);
    seen.add(e.name);
    let apiKey: string | undefined;
    if (e.keyEnv !== undefined) {
      apiKey = env[e.keyEnv];
      // The variable is named, never its value.
      if (requireKeys && (apiKey === undefined || apiKey === '')) problems.push(`${where}: ${i}.keyEnv: the environment variable ${e.keyEnv} that holds the key of endpoint ${JSON.stringify(e.name)} is not set (got ${JSON.stringify(e.keyEnv)})`);
    }
    out.push({
      name: e.name,
      baseUrl: e.baseUrl,
      ...(apiKey !== undefined && apiKey !== '' && { apiKey }),
      ...(e.model !== undefined && { model: e.model }),
      limits: {
        ...(e.maxConcurrent !== undefined && { maxConcurrent: e.maxConcurrent }),
        ...(e.requestsPerMinute !== undefined && { requestsPerMinute: e.requestsPerMinute }),
        ...(e.tokensPerMinute !== undefined && { tokensPerMinute: e.tokensPerMinute }),
      },
      ...(e.capture !== undefined && { capture: e.capture }),
    });
  });
  if (problems.length > 0) throw new EndpointTableError(problems);
  return out;
}

/** Parse the text of a table: JSON, or (for a file) YAML. The text itself is never echoed. */
function parseText(text: string, where: string, yaml: boolean): unknown {
  try {
    return yaml ? parseYaml(text) : JSON.parse(text);
  } catch (err) {
    // A parser's message quotes the text around the fault: only its line is said.
    const line = (err as { linePos?: Array<{ line: number }> }).linePos?.[0]?.line;
    throw new EndpointTableError([`${where}: not valid ${yaml ? 'JSON or YAML' : 'JSON'}${line !== undefined ? ` (line ${line})` : ''} (got a string of ${Buffer.byteLength(text)} bytes)`]);
  }
}

/**
 * The worker's whole table: FLEET_MODEL_ENDPOINTS or FLEET_MODEL_ENDPOINTS_FILE (not both), plus the
 * `default` endpoint of MODEL_BASE_URL when set (the table may then not name one `default` itself).
 */
export function loadEndpointTable(sources: EndpointSources, env: NodeJS.ProcessEnv, requireKeys = true): ModelEndpoint[] {
  if (sources.json !== undefined && sources.file !== undefined) {
    throw new EndpointTableError(['FLEET_MODEL_ENDPOINTS and FLEET_MODEL_ENDPOINTS_FILE are both set: set one of them']);
  }
  let table: ModelEndpoint[] = [];
  if (sources.json !== undefined) table = parseEndpointTable(parseText(sources.json, 'FLEET_MODEL_ENDPOINTS', false), 'FLEET_MODEL_ENDPOINTS', env, requireKeys);
  if (sources.file !== undefined) {
    let text: string;
    try {
      text = readFileSync(sources.file, 'utf8');
    } catch (err) {
      throw new EndpointTableError([`FLEET_MODEL_ENDPOINTS_FILE: cannot read ${JSON.stringify(sources.file)}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`]);
    }
    // JSON is YAML too; YAML's parser reads both.
    table = parseEndpointTable(parseText(text, `FLEET_MODEL_ENDPOINTS_FILE ${sources.file}`, true), `FLEET_MODEL_ENDPOINTS_FILE ${sources.file}`, env, requireKeys);
  }
  if (sources.legacy !== undefined) {
    const i = table.findIndex((e) => e.name === DEFAULT_ENDPOINT);
    if (i !== -1) {
      throw new EndpointTableError([`${sources.json !== undefined ? 'FLEET_MODEL_ENDPOINTS' : 'FLEET_MODEL_ENDPOINTS_FILE'}: ${i}.name: MODEL_BASE_URL already makes the endpoint "default"; unset MODEL_BASE_URL or name this one otherwise (got "default")`]);
    }
    table = [sources.legacy, ...table];
  }
  return table;
}

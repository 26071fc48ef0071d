// The OpenAPI document describes what the server sends about rewards: the batch summary (its float
// mean reward, pass threshold, per-metric means and pass@k) and the group event's per-episode metrics,
// and a real summary validates against the summary's schema, strictly.
import { describe, expect, it } from 'vitest';
import { BatchSummaryBody, openApiDocument } from '../../src/api/api-server.ts';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { summarize } from '../../src/results/batch-summary.ts';

function result(sample: number, reward: number | null, metrics?: Record<string, number>): EpisodeResult {
  return {
    episodeId: `b.t.${sample}`, batchId: 'b', taskId: 't', sample, status: reward === null ? 'error' : 'failed', reward, attempts: 1, workerId: 'w',
    ...(reward === null && { error: { kind: 'verifier' as const, code: 'reward_file_missing', message: 'none' } }),
    ...(metrics && { metrics }),
    timings: { totalMs: 5, verifyMs: 2 }, provenance: { taskDigest: 'd', image: 'i', agent: { kind: 'oracle' } }, startedAt: '', endedAt: '',
  };
}

describe('the API schemas of rewards', () => {
  it('a summary with float rewards, metrics and a threshold validates strictly against BatchSummary', () => {
    const summary = summarize('b', 4, [result(0, 0.25, { correctness: 0.5, style: 0 }), result(1, 0.75, { correctness: 1, style: 0.5 }), result(2, null)], 0.5);
    const parsed = BatchSummaryBody.safeParse(JSON.parse(JSON.stringify(summary)));
    expect(parsed.success, JSON.stringify(parsed.error?.issues)).toBe(true);
    expect(parsed.data).toMatchObject({ passThreshold: 0.5, meanReward: 0.5, metrics: { correctness: { mean: 0.75, n: 2 } }, passAt: { 1: 0.5 } });
    // A field the schema does not know (or one it lacks) fails: the document cannot drift from the summary silently.
    expect(BatchSummaryBody.safeParse({ ...summary, extra: 1 }).success).toBe(false);
    const { passThreshold: _, ...without } = summary;
    expect(BatchSummaryBody.safeParse(without).success).toBe(false);
  });

  it('the document names the summary on its route, and the group event carries metrics per episode', () => {
    const doc = openApiDocument() as {
      components: { schemas: Record<string, { properties: Record<string, unknown>; required?: string[] }> };
      paths: Record<string, { get?: { responses: Record<string, { content?: Record<string, { schema: { $ref: string } }> }> } }>;
    };
    const summary = doc.components.schemas.BatchSummary!;
    expect(summary.required).toEqual(expect.arrayContaining(['passThreshold', 'meanReward', 'metrics', 'passAt']));
    expect(summary.properties.meanReward).toEqual({ type: ['number', 'null'], description: expect.stringContaining('float') });
    expect(doc.paths['/v1/batches/{batchId}']!.get!.responses['200']!.content!['application/json']!.schema.$ref).toBe('#/components/schemas/BatchSummary');
    const group = doc.components.schemas.GroupEvent!;
    expect(group.required).toEqual(expect.arrayContaining(['rewards', 'metrics']));
    expect(group.properties.metrics).toMatchObject({ type: 'array', items: { anyOf: [{ type: 'object', additionalProperties: { type: 'number' } }, { type: 'null' }] } });
    expect(doc.components.schemas.EpisodeResult!.properties.metrics).toMatchObject({ type: 'object', additionalProperties: { type: 'number' } });
  });

  it('the result route declares both media types, every event shape and the start cursor 0', () => {
    const doc = openApiDocument() as {
      components: { schemas: Record<string, { properties: Record<string, { const?: string; anyOf?: unknown[] }>; required?: string[] }> };
      paths: Record<string, { get?: { parameters: { name: string; in: string; schema?: { default?: string }; description?: string }[]; responses: Record<string, { content?: Record<string, { schema: { oneOf?: { $ref: string }[] }; 'x-events'?: Record<string, { $ref: string }> }> }> } }>;
    };
    const route = doc.paths['/v1/batches/{batchId}/results']!.get!;
    const content = route.responses['200']!.content!;
    expect(Object.keys(content).sort()).toEqual(['application/x-ndjson', 'text/event-stream']);
    const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
    expect(content['application/x-ndjson']!.schema.oneOf).toEqual([ref('ResultEvent'), ref('GroupEvent'), ref('EndEvent'), ref('KeepAliveEvent')]);
    expect(content['text/event-stream']!['x-events']).toEqual({ result: ref('ResultEvent'), group: ref('GroupEvent'), end: ref('EndEvent') });
    const { schemas } = doc.components;
    expect(schemas.EndEvent!.properties.kind!.const).toBe('end');
    expect(schemas.EndEvent!.required).toEqual(['kind', 'summary']);
    expect(schemas.KeepAliveEvent!.properties.kind!.const).toBe('keep-alive');
    const after = route.parameters.find((p) => p.name === 'after')!;
    expect(after.schema?.default).toBe('0');
    expect(after.description).toContain('`0` (the default) is the start');
    expect(after.description).toContain('Last-Event-ID');
    expect(route.parameters.map((p) => `${p.in}:${p.name}`)).toEqual(expect.arrayContaining(['header:Last-Event-ID', 'header:Accept']));
    expect(route.responses['406']).toBeDefined();
    expect(doc.paths['/v1/batches']!.get!.responses['200']).toBeDefined();
  });
});

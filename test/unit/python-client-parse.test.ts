// The Python client's parsing, run by python3 from the source folder (no fleet): the stream parser
// takes an event only once it is whole (a connection cut mid-event leaves a partial line or an SSE
// event with no blank line, which is dropped), skips kinds it does not know, reads keep-alives; the
// decoder checks types and keeps the JSON as `raw`; an API error names its field and the value sent.
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const PACKAGE = path.join(import.meta.dirname, '../../clients/python');

function py(script: string): unknown {
  const out = execFileSync('python3', ['-c', `import json, sys\nsys.path.insert(0, ${JSON.stringify(PACKAGE)})\n${script}`], { encoding: 'utf8' });
  return JSON.parse(out);
}

const RESULT = { episodeId: 'b.t.0', batchId: 'b', taskId: 't', sample: 0, status: 'passed', reward: 0.5, attempts: 1, workerId: 'w', timings: { totalMs: 5 }, provenance: {}, startedAt: 's', endedAt: 'e', future: 1 };

describe('the Python client: parsing', () => {
  it('takes NDJSON lines only once their newline came, and drops the partial one a cut leaves', () => {
    const line = JSON.stringify({ kind: 'result', cursor: '1-0', result: RESULT });
    const got = py(`from rollout_fleet._wire import StreamParser, NDJSON
p = StreamParser(NDJSON)
line = ${JSON.stringify(line)}.encode()
out = []
out += [e.kind for e in p.feed(line[:10])]
out += [e.kind for e in p.feed(line[10:] + b"\\n" + b'{"kind":"keep-alive"}\\n{"kind":"someday"}\\n' + line[:25])]
fresh = StreamParser(NDJSON)
out.append([e.kind for e in fresh.feed(b'{"kind":"end","summary":null}\\n')])
ev = StreamParser(NDJSON).feed(line + b"\\n")[0]
print(json.dumps({"kinds": out, "reward": ev.result.reward, "raw_future": ev.result.raw["future"], "timings": ev.result.timings.total_ms}))`) as { kinds: unknown[]; reward: number; raw_future: number; timings: number };
    expect(got.kinds).toEqual(['result', 'keep-alive', ['end']]);
    expect(got.reward).toBe(0.5);
    expect(got.raw_future).toBe(1);
    expect(got.timings).toBe(5);
  });

  it('takes an SSE event at its blank line; a comment is a keep-alive; an event cut before its blank line is dropped', () => {
    const data = JSON.stringify({ kind: 'group', cursor: '1-0:g', taskId: 't', episodeIds: ['b.t.0'], rewards: [null], metrics: [null] });
    const got = py(`from rollout_fleet._wire import StreamParser, SSE
p = StreamParser(SSE)
text = ": keep-alive\\n\\nid: 1-0:g\\nevent: group\\ndata: " + ${JSON.stringify(data)} + "\\n\\nevent: other\\ndata: {}\\n\\nid: 2-0\\nevent: result\\ndata: {\\"kind\\":\\"result\\"}\\n"
print(json.dumps([type(e).__name__ + ":" + getattr(e, "cursor", "-") for e in p.feed(text.encode())]))`);
    expect(got).toEqual(['KeepAliveEvent:-', 'GroupEvent:1-0:g']);
  });

  it('refuses a body of the wrong shape, naming where', () => {
    const got = py(`from rollout_fleet.types import decode, EpisodeResult, DecodeError
r = dict(${JSON.stringify(RESULT)})
out = []
for bad in [dict(r, reward="high"), dict(r, sample=True), dict(r, status="won"), {k: v for k, v in r.items() if k != "workerId"}, dict(r, timings={"totalMs": None})]:
    try:
        decode(EpisodeResult, bad)
        out.append(None)
    except DecodeError as err:
        out.append(str(err))
print(json.dumps(out))`) as string[];
    expect(got[0]).toContain('body.reward: expected a number');
    expect(got[1]).toContain('body.sample: expected a whole number');
    expect(got[2]).toContain("body.status: expected one of 'passed'");
    expect(got[3]).toBe('body: missing workerId');
    expect(got[4]).toContain('body.timings.totalMs: expected a number');
  });

  it('reads an API error into status, field, message and the value sent (or the one the message quotes)', () => {
    const got = py(`from rollout_fleet.errors import FleetApiError
a = FleetApiError("POST", "/v1/batches", 400, b'{"error":{"field":"tasks.1","message":"request: tasks.1: not stored (got \\\\"ab\\\\")"}}', sent={"tasks": ["x", "ab"]})
b = FleetApiError("GET", "/r", 400, b'{"error":{"field":"after","message":"after: not a cursor (got \\\\"9-0\\\\")"}}')
c = FleetApiError("GET", "/r", 502, b"<html>bad gateway</html>")
print(json.dumps([[e.status, e.field, e.value, e.message, str(e)] for e in (a, b, c)]))`);
    expect(got).toEqual([
      [400, 'tasks.1', 'ab', 'request: tasks.1: not stored (got "ab")', 'POST /v1/batches: HTTP 400: request: tasks.1: not stored (got "ab") (field: tasks.1)'],
      [400, 'after', '9-0', 'after: not a cursor (got "9-0")', 'GET /r: HTTP 400: after: not a cursor (got "9-0") (field: after)'],
      [502, null, null, '<html>bad gateway</html>', 'GET /r: HTTP 502: <html>bad gateway</html>'],
    ]);
  });
});

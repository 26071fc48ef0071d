// BuildKit's progress entries, encoded here by hand in the protobuf wire format the engine sends
// (StatusResponse: vertexes = 1, logs = 3, warnings = 4), decode to a plain-text log with each
// step's name, output, cache hits and errors; the log keeps its end when it passes its cap.
import { describe, expect, it } from 'vitest';
import { BuildLog, decodeTrace } from '../../src/environments/buildkit-trace.ts';

const varint = (n: number): Buffer => {
  const out: number[] = [];
  do {
    let byte = n & 0x7f;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    out.push(byte);
  } while (n > 0);
  return Buffer.from(out);
};
const bytesField = (no: number, value: Buffer | string) => {
  const b = Buffer.isBuffer(value) ? value : Buffer.from(value);
  return Buffer.concat([varint((no << 3) | 2), varint(b.length), b]);
};
const varintField = (no: number, value: number) => Buffer.concat([varint(no << 3), varint(value)]);
const timestamp = bytesField(1, Buffer.concat([varintField(1, 1_796_000_000), varintField(2, 5)]));

function vertex(v: { digest: string; name: string; cached?: boolean; started?: boolean; completed?: boolean; error?: string }): Buffer {
  return bytesField(
    1,
    Buffer.concat([
      bytesField(1, v.digest),
      bytesField(3, v.name),
      ...(v.cached ? [varintField(4, 1)] : []),
      ...(v.started ? [bytesField(5, timestamp.subarray(2))] : []),
      ...(v.completed ? [bytesField(6, timestamp.subarray(2))] : []),
      ...(v.error ? [bytesField(7, v.error)] : []),
    ]),
  );
}
const log = (digest: string, msg: string) => bytesField(3, Buffer.concat([bytesField(1, digest), varintField(3, 1), bytesField(4, msg)]));
const warning = (text: string) => bytesField(4, Buffer.concat([bytesField(1, 'sha256:x'), varintField(2, 1), bytesField(3, text)]));
const trace = (...parts: Buffer[]) => ({ id: 'moby.buildkit.trace', aux: Buffer.concat(parts).toString('base64') });

describe('BuildKit trace', () => {
  it('decodes vertexes, logs and warnings', () => {
    const status = decodeTrace(trace(vertex({ digest: 'sha256:a', name: '[1/2] FROM base', started: true, completed: true, cached: true }), log('sha256:a', 'hello\n'), warning('careful')).aux);
    expect(status.vertexes).toEqual([{ digest: 'sha256:a', name: '[1/2] FROM base', cached: true, started: true, completed: true, error: '' }]);
    expect(status.logs.map((l) => [l.vertex, l.msg.toString()])).toEqual([['sha256:a', 'hello\n']]);
    expect(status.warnings).toEqual(['careful']);
  });

  it('refuses bytes that are not a StatusResponse', () => {
    expect(() => decodeTrace(Buffer.from([0x0a, 0x7f, 0x01]).toString('base64'))).toThrow(RangeError);
  });

  it('writes a plain-text log: each step once, its output numbered, cache hits, errors and the error line', () => {
    const buildLog = new BuildLog(1 << 20);
    buildLog.addLine(trace(vertex({ digest: 'sha256:a', name: '[1/2] FROM base', started: true })));
    buildLog.addLine(trace(vertex({ digest: 'sha256:a', name: '[1/2] FROM base', started: true, completed: true, cached: true })));
    buildLog.addLine(trace(vertex({ digest: 'sha256:b', name: '[2/2] RUN make', started: true }), log('sha256:b', 'compiling\r\nlinking\n')));
    buildLog.addLine(trace(vertex({ digest: 'sha256:b', name: '[2/2] RUN make', started: true, completed: true, error: 'exit code: 2' })));
    buildLog.addLine({ errorDetail: { message: 'executor failed running [make]: exit code: 2' }, error: 'executor failed running [make]: exit code: 2' });
    buildLog.addLine({ id: 'moby.buildkit.trace', aux: '!!not base64 protobuf!!' });
    buildLog.addLine({ stream: 'Successfully tagged x\n' });
    expect(buildLog.text()).toBe(
      [
        '#1 [1/2] FROM base',
        '#1 CACHED',
        '#2 [2/2] RUN make',
        '#2 compiling',
        '#2 linking',
        '#2 ERROR: exit code: 2',
        'ERROR: executor failed running [make]: exit code: 2',
        'Successfully tagged x',
        '',
      ].join('\n'),
    );
  });

  it('keeps the end of a log past its cap, saying how much was dropped', () => {
    const buildLog = new BuildLog(100);
    for (let i = 0; i < 50; i++) buildLog.append(`line ${String(i).padStart(3, '0')}\n`);
    const text = buildLog.text();
    expect(text).toMatch(/^\[\.\.\. \d+ earlier bytes of the build log dropped \.\.\.\]\n/);
    expect(text.endsWith('line 049\n')).toBe(true);
    expect(Buffer.byteLength(text.slice(text.indexOf('\n') + 1))).toBeLessThanOrEqual(100);
    expect(text).not.toContain('line 000');
  });
});

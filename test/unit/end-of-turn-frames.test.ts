// The end of the turn's framed stdout as the worker reads it: frames split anywhere across chunks come
// back whole and in order; a stream that is not frames (the engine's own words when an exec cannot
// start) breaks the reader once, and says what the stream began with.
import { describe, expect, it } from 'vitest';
import { FRAME, FrameReader, encodeFrame, jsonFrame, type FrameType } from '../../src/sandbox/end-of-turn/frames.ts';

function readAll(chunks: Buffer[]): { frames: Array<[FrameType, string]>; broken: string | undefined } {
  const frames: Array<[FrameType, string]> = [];
  const reader = new FrameReader((type, payload) => frames.push([type, payload.toString('utf8')]));
  for (const chunk of chunks) reader.push(chunk);
  return { frames, broken: reader.broken };
}

describe('the end of the turn\'s frames', () => {
  it('come back whole and in order however the stream is cut', () => {
    const stream = Buffer.concat([jsonFrame(FRAME.beside, { processes: [], more: 0 }), encodeFrame(FRAME.stdout, Buffer.from('hello')), encodeFrame(FRAME.stderr, Buffer.alloc(0))]);
    for (const size of [1, 2, 5, 7, stream.length]) {
      const chunks: Buffer[] = [];
      for (let at = 0; at < stream.length; at += size) chunks.push(stream.subarray(at, at + size));
      expect(readAll(chunks), `chunks of ${size}`).toEqual({
        frames: [[FRAME.beside, '{"processes":[],"more":0}'], [FRAME.stdout, 'hello'], [FRAME.stderr, '']],
        broken: undefined,
      });
    }
  });

  it('stops at what is not a frame, naming what the stream began with in printable text', () => {
    const engine = Buffer.from('OCI runtime exec failed: exec failed: unable to start container process\r\n\x00');
    const { frames, broken } = readAll([jsonFrame(FRAME.beside, { processes: [], more: 0 }), engine, encodeFrame(FRAME.stdout, Buffer.from('late'))]);
    expect(frames.map(([type]) => type)).toEqual([FRAME.beside]);
    expect(broken).toContain('"OCI runtime exec failed: exec failed: unable to start container process??');
    expect(broken).toMatch(/^a frame of type 0x4f /);
  });
});

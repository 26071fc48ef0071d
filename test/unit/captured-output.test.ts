import { describe, expect, it } from 'vitest';
import { OutputCapture } from '../../src/sandbox/captured-output.ts';

function feed(cap: number, chunks: string[]) {
  const c = new OutputCapture(cap);
  for (const ch of chunks) c.writable.write(Buffer.from(ch));
  return c.result();
}

describe('OutputCapture', () => {
  it('keeps everything under the cap', () => {
    expect(feed(100, ['abc', 'def'])).toEqual({ text: 'abcdef', totalBytes: 6, truncated: false, capBytes: 100 });
  });

  it('keeps the head and the tail over the cap and says how much it dropped', () => {
    const r = feed(10, ['0123456789', 'abcdefghij', 'KLMNO']);
    expect(r.truncated).toBe(true);
    expect(r.totalBytes).toBe(25);
    expect(r.text).toBe('01234\n[... 15 bytes not kept ...]\nKLMNO');
  });

  it('keeps the last bytes when the tail is fed in many small chunks', () => {
    const r = feed(4, ['ab', ...'cdefghij'.split('')]);
    expect(r.text).toBe('ab\n[... 6 bytes not kept ...]\nij');
  });
});

// The upload's entry count, walked over the tar's headers, against what tar-stream itself reports.
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { describe, expect, it } from 'vitest';
import { collectBytes } from '../../src/archive/tar-buffer.ts';
import { countTarEntries } from '../../src/tasks/task-upload.ts';

async function packed(entries: { name: string; body?: string; type?: 'file' | 'directory' }[]): Promise<Buffer> {
  const pack = tar.pack();
  const done = collectBytes(pack);
  for (const e of entries) {
    if (e.type === 'directory') pack.entry({ name: e.name, type: 'directory' });
    else pack.entry({ name: e.name, type: 'file' }, e.body ?? '');
  }
  pack.finalize();
  return done;
}

async function parsedCount(body: Buffer): Promise<number> {
  let n = 0;
  for await (const entry of Readable.from([body]).pipe(tar.extract())) {
    entry.resume();
    n += 1;
  }
  return n;
}

describe('countTarEntries', () => {
  it('counts what the parser reports: files of any size, folders, long names (PAX headers not counted)', async () => {
    const body = await packed([
      { name: 'task.toml', body: 'x'.repeat(513) },
      { name: 'environment', type: 'directory' },
      { name: `environment/${'deep/'.repeat(40)}long-name.txt`, body: 'y'.repeat(1024) },
      { name: 'tests/test.sh', body: '' },
      { name: 'instruction.md', body: 'z'.repeat(511) },
    ]);
    expect(await parsedCount(body)).toBe(5);
    expect(countTarEntries(body)).toBe(5);
  });

  it('stops one past the cap, and at bytes it cannot read', async () => {
    const body = await packed(Array.from({ length: 50 }, (_, i) => ({ name: `f${i}`, body: 'x' })));
    expect(countTarEntries(body, 11)).toBe(11);
    expect(countTarEntries(body)).toBe(50);
    const garbled = Buffer.from(body);
    garbled.write('not-octal!!!', 512 * 2 * 3 + 124, 'latin1'); // the fourth entry's size field
    expect(countTarEntries(garbled)).toBe(3);
    expect(countTarEntries(Buffer.alloc(0))).toBe(0);
  });
});

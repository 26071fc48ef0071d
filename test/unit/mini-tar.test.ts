// The end of the turn's own tar (src/sandbox/end-of-turn/mini-tar.ts) against tar-stream, the library
// the worker's side reads and writes with: what one writes, the other reads back exactly, long and
// non-ASCII names included; a damaged archive is refused, not half read.
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';
import { describe, expect, it } from 'vitest';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import { BLOCK, TAR_END, dataPadding, readTar, tarHeader } from '../../src/sandbox/end-of-turn/mini-tar.ts';

const LONG = `workspace/${'deep/'.repeat(30)}file-with-a-long-name.txt`;
const UNICODE = 'workspace/résumé-数据.txt';
const LONG_LINK = `../${'x'.repeat(150)}`;

async function readWithTarStream(bytes: Buffer) {
  const out: Array<{ name: string; type: string; mode: number; mtime: number; linkname: string | null; data: string }> = [];
  const extract = tar.extract();
  extract.on('entry', (h, stream, next) => {
    const chunks: Buffer[] = [];
    stream.on('data', (c: unknown) => chunks.push(c as Buffer));
    stream.on('end', () => {
      out.push({ name: h.name, type: h.type ?? '', mode: h.mode ?? 0, mtime: Math.floor((h.mtime?.getTime() ?? 0) / 1000), linkname: h.linkname ?? null, data: Buffer.concat(chunks).toString('utf8') });
      next();
    });
  });
  await pipeline(Readable.from([bytes]), extract);
  return out;
}

describe('the end of the turn\'s tar', () => {
  it('writes what tar-stream reads back exactly: folders, files, links, long and non-ASCII names, modes and times', async () => {
    const file = (name: string, data: string, mode = 0o644) => {
      const body = Buffer.from(data);
      return [tarHeader({ name, type: 'file', mode, uid: 1000, gid: 1000, mtime: 1_700_000_000, size: body.length }), body, dataPadding(body.length)];
    };
    const bytes = Buffer.concat([
      tarHeader({ name: 'workspace/', type: 'directory', mode: 0o755, uid: 1000, gid: 1000, mtime: 1_700_000_000, size: 0 }),
      ...file('workspace/a.txt', 'hello\n', 0o600),
      ...file(LONG, 'long\n'),
      ...file(UNICODE, 'unicode\n'),
      ...file('workspace/empty', ''),
      ...file('workspace/block.bin', 'b'.repeat(BLOCK)),
      tarHeader({ name: 'workspace/link', type: 'symlink', mode: 0o777, uid: 1000, gid: 1000, mtime: 0, size: 0, linkname: LONG_LINK }),
      TAR_END,
    ]);
    expect(bytes.length % BLOCK).toBe(0);
    const read = await readWithTarStream(bytes);
    expect(read.map((e) => [e.name, e.type, e.data])).toEqual([
      ['workspace/', 'directory', ''], ['workspace/a.txt', 'file', 'hello\n'], [LONG, 'file', 'long\n'], [UNICODE, 'file', 'unicode\n'],
      ['workspace/empty', 'file', ''], ['workspace/block.bin', 'file', 'b'.repeat(BLOCK)], ['workspace/link', 'symlink', ''],
    ]);
    expect(read[1]).toMatchObject({ mode: 0o600, mtime: 1_700_000_000 });
    expect(read.at(-1)!.linkname).toBe(LONG_LINK);
    // And its own reader agrees.
    expect(readTar(bytes).map((e) => [e.header.name, e.header.type, e.data.toString('utf8'), e.header.linkname ?? null])).toEqual([
      ['workspace/', 'directory', '', null], ['workspace/a.txt', 'file', 'hello\n', null], [LONG, 'file', 'long\n', null], [UNICODE, 'file', 'unicode\n', null],
      ['workspace/empty', 'file', '', null], ['workspace/block.bin', 'file', 'b'.repeat(BLOCK), null], ['workspace/link', 'symlink', '', LONG_LINK],
    ]);
  });

  it('reads what tar-stream writes (as the worker packs the tests): pax names, hard links, modes', async () => {
    const bytes = await tarBuffer((pack) => {
      pack.entry({ name: 'tests/', type: 'directory', mode: 0o755, mtime: new Date(0) });
      pack.entry({ name: 'tests/test.sh', mode: 0o755, mtime: new Date(5_000) }, 'exit 0\n');
      pack.entry({ name: `tests/${'n'.repeat(120)}.txt`, mode: 0o644 }, 'pax\n');
      pack.entry({ name: 'tests/again.sh', type: 'link', linkname: 'tests/test.sh' });
      pack.entry({ name: 'tests/sym', type: 'symlink', linkname: 'test.sh' });
    });
    const read = readTar(bytes);
    expect(read.map((e) => [e.header.name, e.header.type, e.data.toString('utf8'), e.header.linkname ?? null])).toEqual([
      ['tests/', 'directory', '', null], ['tests/test.sh', 'file', 'exit 0\n', null], [`tests/${'n'.repeat(120)}.txt`, 'file', 'pax\n', null],
      ['tests/again.sh', 'link', '', 'tests/test.sh'], ['tests/sym', 'symlink', '', 'test.sh'],
    ]);
    expect(read[1]!.header).toMatchObject({ mode: 0o755, mtime: 5 });
  });

  it('refuses a header with a bad checksum and an entry that runs past the archive', async () => {
    const bytes = await tarBuffer((pack) => {
      pack.entry({ name: 'tests/a', mode: 0o644 }, 'a'.repeat(600));
    });
    const damaged = Buffer.from(bytes);
    damaged[10] = damaged[10]! ^ 0xff;
    expect(() => readTar(damaged)).toThrow(/bad checksum/);
    expect(() => readTar(bytes.subarray(0, BLOCK + 100))).toThrow(/run past the archive/);
  });
});

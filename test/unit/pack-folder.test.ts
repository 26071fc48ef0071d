// The deterministic folder packer: byte for byte the archives the previous tar-stream packer wrote
// (task digests already recorded must stay valid), refusals before reading, the entry cap, links kept
// as links, executable bits, and files that change under the packer.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { appendFileSync, rmSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, symlink, truncate, utimes, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { describe, expect, it } from 'vitest';
import { packFolder, packFolderToBuffer, PackRefusal } from '../../src/archive/pack-folder.ts';
import { digestTask, packTask, TASK_PARTS } from '../../src/tasks/pack-task.ts';
import { EXAMPLES } from '../helpers/fleet.ts';
import { legacyPack } from './legacy-pack-folder.ts';

const PARTS = ['task.yaml', 'workspace', 'tests', 'solution'] as const;
const MAX = 32 * 1024 * 1024;

async function tempDir(): Promise<string> {
  return mkdtemp(path.join(os.tmpdir(), 'rf-packfolder-'));
}

/** Bytes that differ from file to file, so a misplaced block changes the digest. */
const bytesOf = (n: number, seed: number) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 31 + seed * 7) & 0xff));

/** A folder with every shape the packer handles differently. */
async function variedFolder(): Promise<string> {
  const root = await tempDir();
  await writeFile(path.join(root, 'task.yaml'), 'id: varied\n');
  const ws = path.join(root, 'workspace');
  await mkdir(path.join(ws, 'empty-dir'), { recursive: true });
  await mkdir(path.join(ws, 'nested', 'deeper', 'deepest'), { recursive: true });
  // Sizes around the 512-byte record and the 64 KiB block, and past it (written as its own chunk).
  for (const [i, n] of [0, 1, 511, 512, 513, 1023, 65_535, 65_536, 65_537, 200_000].entries()) {
    await writeFile(path.join(ws, `size-${n}.bin`), bytesOf(n, i));
  }
  // Enough small files to fill several blocks, in a folder of their own.
  for (let i = 0; i < 300; i++) await writeFile(path.join(ws, 'nested', `f${String(i).padStart(3, '0')}.txt`), `file ${i}\n`.repeat(i % 7));
  // Names sorted by UTF-16 code units: upper case before lower, dots and digits first.
  for (const name of ['B', 'a', 'A.txt', '.hidden', '0', 'z-last', 'Zed']) await writeFile(path.join(ws, name), name);
  // Executable bits, whatever the rest of the mode.
  await writeFile(path.join(ws, 'run.sh'), '#!/bin/sh\n');
  await chmod(path.join(ws, 'run.sh'), 0o700);
  await writeFile(path.join(ws, 'group-x'), 'x');
  await chmod(path.join(ws, 'group-x'), 0o610);
  await writeFile(path.join(ws, 'private'), 'p');
  await chmod(path.join(ws, 'private'), 0o600);
  await chmod(path.join(ws, 'nested', 'deeper'), 0o700);
  // Links: relative, absolute, dangling, to a folder (not followed), a target too long for ustar, not ASCII.
  await symlink('../task.yaml', path.join(ws, 'link-rel'));
  await symlink('/etc/hostname', path.join(ws, 'link-abs'));
  await symlink('does-not-exist', path.join(ws, 'link-dangling'));
  await symlink('nested', path.join(ws, 'link-dir'));
  await symlink(`${'t'.repeat(150)}/target`, path.join(ws, 'link-long'));
  await symlink('café', path.join(ws, 'link-utf8'));
  // Names: over 100 bytes with folders (ustar prefix), one part over 100 (PAX), not ASCII (PAX).
  const longDir = path.join(ws, 'd'.repeat(60), 'e'.repeat(60));
  await mkdir(longDir, { recursive: true });
  await writeFile(path.join(longDir, 'inside-a-long-path.txt'), 'long');
  await writeFile(path.join(ws, 'n'.repeat(120)), 'one part over 100 bytes');
  await writeFile(path.join(ws, 'naïve-名前.txt'), 'utf-8 name');
  await mkdir(path.join(ws, 'dossier-été'));
  await writeFile(path.join(ws, 'dossier-été', 'x'), 'in a folder with a UTF-8 name');
  // tests/ as a link, solution/ missing: a part may be anything but a special file, or absent.
  await mkdir(path.join(root, 'real-tests'));
  await symlink('real-tests', path.join(root, 'tests'));
  // Not a part: never packed.
  await writeFile(path.join(root, 'notes.txt'), 'not packed');
  return root;
}

async function entriesOf(archive: Buffer): Promise<Array<{ name: string; type: string; mode: number; size: number; linkname: string | null }>> {
  const out: Array<{ name: string; type: string; mode: number; size: number; linkname: string | null }> = [];
  for await (const entry of Readable.from([archive]).pipe(tar.extract())) {
    const h = entry.header;
    out.push({ name: h.name, type: h.type ?? '', mode: h.mode ?? -1, size: h.size ?? -1, linkname: h.linkname ?? null });
    entry.resume();
  }
  return out;
}

async function refusal(work: Promise<unknown>): Promise<PackRefusal> {
  const err: unknown = await work.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(PackRefusal);
  return err as PackRefusal;
}

describe('packFolder', () => {
  it('writes byte for byte the archive the previous packer wrote, on a folder of every shape', async () => {
    const root = await variedFolder();
    const before = await legacyPack(root, PARTS, MAX);
    const now = await packFolderToBuffer(root, PARTS, { maxBytes: MAX });
    expect(now.size).toBe(before.archive.length);
    // Where they differ, if they do: the first differing offset says which header or file.
    const firstDiff = now.archive.findIndex((b, i) => b !== before.archive[i]);
    expect(firstDiff).toBe(-1);
    expect(Buffer.compare(now.archive, before.archive)).toBe(0);
    expect(now.digest).toBe(before.digest);
    // System tar reads it too, PAX names and all.
    const listed = execFileSync('tar', ['-tf', '-'], { input: now.archive }).toString().split('\n');
    expect(listed).toContain(`workspace/${'n'.repeat(120)}`);
    expect(listed).toContain('workspace/naïve-名前.txt');
    expect(listed).toContain(`workspace/${'d'.repeat(60)}/${'e'.repeat(60)}/inside-a-long-path.txt`);
    expect(listed).not.toContain('notes.txt');
    expect(now.entries).toBe(listed.filter((l) => l !== '').length);
  });

  it('gives the digests recorded for the example tasks before it existed', async () => {
    // Computed with the previous packTask on 2026-12-02 (commit 107e061): stored tasks name these.
    const recorded: Record<string, string> = {
      'fix-greeting': '04cf26ca7fedef34bc8db919b5a996701ee07cc88b9db7b67bc0bf8ea77a7a35',
      'js-median': '8958f12a213a0b9e289edbab32ba2da128ca76d5327a9fa1d99b42f2261b21a7',
      'reverse-lines': '7a7f68c84cc0653c272721d396888a962cb3471f4314b9ecf4008ec8d0c7a9d4',
      'set-port': '4bb59c720eb7f96a0f42185c2f2bdf36c7157c9745bd78b50a341b990c2a5e48',
      'sum-column': '9093bb8122b3b36de30c0534dbe41c2c5a033b1a76792031f17157b033fde327',
    };
    for (const [name, digest] of Object.entries(recorded)) {
      const dir = path.join(EXAMPLES, 'tasks', name);
      expect(await digestTask(dir), name).toBe(digest);
      const packed = await packTask(dir);
      expect(packed.digest, name).toBe(digest);
      expect(createHash('sha256').update(packed.archive).digest('hex'), name).toBe(digest);
    }
    // The fleet's own parts come first, as before Harbor's were added after them: old digests hold.
    expect([...TASK_PARTS].slice(0, PARTS.length)).toEqual([...PARTS]);
  });

  it('is deterministic: the same bytes whatever the timestamps and the order files were made in; chunks add up to the archive', async () => {
    const a = await tempDir();
    const b = await tempDir();
    await mkdir(path.join(a, 'workspace', 'sub'), { recursive: true });
    await mkdir(path.join(b, 'workspace', 'sub'), { recursive: true });
    const names = Array.from({ length: 200 }, (_, i) => `sub/file-${i}`);
    for (const n of names) await writeFile(path.join(a, 'workspace', n), n.repeat(50));
    for (const n of [...names].reverse()) await writeFile(path.join(b, 'workspace', n), n.repeat(50));
    await utimes(path.join(b, 'workspace', 'sub', 'file-7'), new Date(2001, 1, 1), new Date(2001, 1, 1));
    await utimes(path.join(b, 'workspace', 'sub'), new Date(1999, 1, 1), new Date(1999, 1, 1));
    const chunks: Buffer[] = [];
    const streamed = await packFolder(a, PARTS, { maxBytes: MAX, onChunk: (c) => chunks.push(Buffer.from(c)) });
    const pa = await packFolderToBuffer(a, PARTS, { maxBytes: MAX });
    const pb = await packFolderToBuffer(b, PARTS, { maxBytes: MAX });
    expect(Buffer.compare(pa.archive, pb.archive)).toBe(0);
    expect(pb.digest).toBe(pa.digest);
    expect(chunks.length).toBeGreaterThan(1);
    expect(Buffer.compare(Buffer.concat(chunks), pa.archive)).toBe(0);
    expect(streamed).toEqual({ digest: pa.digest, size: pa.archive.length, entries: 202 });
    expect(createHash('sha256').update(pa.archive).digest('hex')).toBe(pa.digest);
    // One byte changed: another digest.
    await writeFile(path.join(b, 'workspace', 'sub', 'file-7'), 'changed');
    expect((await packFolder(b, PARTS, { maxBytes: MAX })).digest).not.toBe(pa.digest);
  });

  it('keeps links as links (never followed) and modes as 0755 or 0644 by the executable bit', async () => {
    const root = await variedFolder();
    const entries = await entriesOf((await packFolderToBuffer(root, PARTS, { maxBytes: MAX })).archive);
    const byName = new Map(entries.map((e) => [e.name, e]));
    expect(byName.get('workspace/link-rel')).toMatchObject({ type: 'symlink', linkname: '../task.yaml', mode: 0o777, size: 0 });
    expect(byName.get('workspace/link-abs')).toMatchObject({ type: 'symlink', linkname: '/etc/hostname' });
    expect(byName.get('workspace/link-dangling')).toMatchObject({ type: 'symlink', linkname: 'does-not-exist' });
    expect(byName.get('workspace/link-long')).toMatchObject({ type: 'symlink', linkname: `${'t'.repeat(150)}/target` });
    expect(byName.get('workspace/link-utf8')).toMatchObject({ type: 'symlink', linkname: 'café' });
    // A link to a folder is a link: nothing below it is packed.
    expect(byName.get('workspace/link-dir')).toMatchObject({ type: 'symlink', linkname: 'nested' });
    expect(entries.some((e) => e.name.startsWith('workspace/link-dir/'))).toBe(false);
    // A part that is a link is packed as the link, not the folder it names.
    expect(byName.get('tests')).toMatchObject({ type: 'symlink', linkname: 'real-tests' });
    expect(byName.get('workspace/run.sh')).toMatchObject({ type: 'file', mode: 0o755 });
    expect(byName.get('workspace/group-x')).toMatchObject({ type: 'file', mode: 0o755 });
    expect(byName.get('workspace/private')).toMatchObject({ type: 'file', mode: 0o644 });
    expect(byName.get('workspace/nested/deeper/')).toMatchObject({ type: 'directory', mode: 0o755 });
    expect(byName.get('workspace/size-200000.bin')).toMatchObject({ type: 'file', size: 200_000 });
    // Depth first, children sorted by UTF-16 code units.
    const top = entries.map((e) => e.name).filter((n) => /^workspace\/[^/]+\/?$/.test(n));
    expect(top.slice(0, 7)).toEqual(['workspace/.hidden', 'workspace/0', 'workspace/A.txt', 'workspace/B', 'workspace/Zed', 'workspace/a', `workspace/${'d'.repeat(60)}/`]);
  });

  it('refuses a FIFO and a socket, naming them, before any chunk is written', async () => {
    const root = await tempDir();
    await mkdir(path.join(root, 'workspace'));
    await writeFile(path.join(root, 'workspace', 'a.txt'), 'a');
    execFileSync('mkfifo', [path.join(root, 'workspace', 'pipe')]);
    const chunks: Buffer[] = [];
    const fifo = await refusal(packFolder(root, PARTS, { maxBytes: MAX, onChunk: (c) => chunks.push(c) }));
    expect(fifo.kind).toBe('special_file');
    expect(fifo.message).toContain(path.join(root, 'workspace', 'pipe'));
    expect(fifo.message).toContain('FIFO, socket or device');
    expect(chunks).toEqual([]);
    rmSync(path.join(root, 'workspace', 'pipe'));

    const server = net.createServer();
    const socketPath = path.join(root, 'workspace', 'sock');
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    try {
      const sock = await refusal(packFolder(root, PARTS, { maxBytes: MAX }));
      expect(sock.kind).toBe('special_file');
      expect(sock.details.path).toBe(socketPath);
      // packTask says it in a task's words.
      await expect(packTask(root)).rejects.toMatchObject({ code: 'invalid_task', message: expect.stringContaining(`${socketPath}: not a regular file, folder or symlink`) });
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it('refuses an archive too large from the sizes alone, without reading the files', async () => {
    const root = await tempDir();
    await mkdir(path.join(root, 'workspace'));
    // Sparse: 64 GiB to read if it were read at all.
    await writeFile(path.join(root, 'workspace', 'huge.bin'), '');
    await truncate(path.join(root, 'workspace', 'huge.bin'), 64 * 1024 ** 3);
    const started = performance.now();
    const err = await refusal(packFolder(root, PARTS, { maxBytes: MAX }));
    expect(performance.now() - started).toBeLessThan(5_000);
    expect(err.kind).toBe('too_large');
    expect(err.details.size).toBeGreaterThan(64 * 1024 ** 3);
    expect(err.message).toContain(`larger than ${MAX} bytes`);
    await expect(digestTask(root)).rejects.toMatchObject({ code: 'invalid_task', message: expect.stringContaining('make a task archive larger than') });
    // Just under the cap packs; one byte over is refused (1024 end + 512 header + the padded data).
    await truncate(path.join(root, 'workspace', 'huge.bin'), 4096);
    const exact = 1024 + 512 + 512 + 4096;
    expect((await packFolder(root, PARTS, { maxBytes: exact })).size).toBe(exact);
    expect((await refusal(packFolder(root, PARTS, { maxBytes: exact - 1 }))).kind).toBe('too_large');
  });

  it('caps the entries: refused with the folder and the cap named, stopping the walk there; at the cap it packs', async () => {
    const root = await tempDir();
    await mkdir(path.join(root, 'workspace', 'sub'), { recursive: true });
    for (let i = 0; i < 8; i++) await writeFile(path.join(root, 'workspace', 'sub', `f${i}`), '');
    // workspace/, sub/ and 8 files: 10 entries.
    expect((await packFolder(root, PARTS, { maxBytes: MAX, maxEntries: 10 })).entries).toBe(10);
    await writeFile(path.join(root, 'workspace', 'one-more'), '');
    const err = await refusal(packFolder(root, PARTS, { maxBytes: MAX, maxEntries: 10 }));
    expect(err.kind).toBe('too_many_entries');
    expect(err.details).toMatchObject({ count: 11, limit: 10 });
    expect(err.message).toBe(`${root}: more than 10 entries (files, folders and links) to pack`);
  });

  it('refuses a file that grew, shrank, or became a link or a FIFO after it was measured, without hanging', async () => {
    // The first chunk is handed over once 64 KiB are written, after every file was measured and
    // before the last one is read: the moment to change it.
    const root = await tempDir();
    await mkdir(path.join(root, 'workspace'));
    for (let i = 0; i < 100; i++) await writeFile(path.join(root, 'workspace', `a${String(i).padStart(3, '0')}`), bytesOf(1000, i));
    const last = path.join(root, 'workspace', 'zz-last');
    const cases: Array<{ how: string; change: () => void; expect: RegExp }> = [
      { how: 'grew', change: () => appendFileSync(last, 'more'), expect: /zz-last: grew while it was packed \(10 bytes measured, more read\)/ },
      { how: 'shrank', change: () => truncateSync(last, 3), expect: /zz-last: shrank while it was packed \(10 bytes measured, 3 read\)/ },
      { how: 'link', change: () => { rmSync(last); symlinkSync('a000', last); }, expect: /zz-last: vanished or changed while it was packed/ },
      { how: 'fifo', change: () => { rmSync(last); execFileSync('mkfifo', [last]); }, expect: /zz-last: shrank while it was packed \(10 bytes measured, 0 read\)/ },
    ];
    for (const c of cases) {
      rmSync(last, { force: true });
      writeFileSync(last, '0123456789');
      let changed = false;
      const err = await refusal(packFolder(root, PARTS, {
        maxBytes: MAX,
        onChunk: () => {
          if (changed) return;
          changed = true;
          c.change();
        },
      }));
      expect(changed, c.how).toBe(true);
      expect(err.kind, c.how).toBe('changed');
      expect(err.message, c.how).toMatch(c.expect);
    }
    // The same in a task's words.
    rmSync(last, { force: true });
    writeFileSync(last, '0123456789');
    await writeFile(path.join(root, 'task.yaml'), 'id: t\n');
    expect((await packTask(root)).digest).toMatch(/^[0-9a-f]{64}$/);
  });

  it('skips missing parts, and checks its arguments', async () => {
    const root = await tempDir();
    const empty = await packFolderToBuffer(root, PARTS, { maxBytes: MAX });
    expect(empty.archive).toEqual(Buffer.alloc(1024));
    expect(empty.entries).toBe(0);
    await expect(packFolder('relative/dir', PARTS, { maxBytes: MAX })).rejects.toThrow(TypeError);
    await expect(packFolder(root, PARTS, { maxBytes: 10 })).rejects.toThrow(/maxBytes: expected an integer from 1024 up, got 10/);
    await expect(packFolder(root, PARTS, { maxBytes: MAX, maxEntries: -1 })).rejects.toThrow(/maxEntries/);
  });
});

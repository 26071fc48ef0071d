// Runtime generations are deterministic: identical inputs give identical archive bytes and the same
// generation id, on the builder thread as on the main thread; any changed byte, mode or path changes
// the id; an input changed between hashing and archiving fails the build.
import { chmod, cp, mkdtemp, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { afterAll, describe, expect, it } from 'vitest';
import { collectBytes } from '../../src/archive/tar-buffer.ts';
import { FleetError } from '../../src/errors/fleet-error.ts';
import { hashRuntimeInputs, runtimeArchive } from '../../src/runtime/build-archive.ts';
import { stopRuntimeBuilder } from '../../src/runtime/build-off-thread.ts';
import { checkRuntimeInputs, defaultRuntimeInputs, type RuntimeInput } from '../../src/runtime/runtime-inputs.ts';
import { FORMAT_VERSION } from '../../src/runtime/runtime-manifest.ts';

afterAll(stopRuntimeBuilder);

/** A small fake runtime: two files on disk and an inline launcher. */
async function fakeRuntime(): Promise<{ dir: string; inputs: RuntimeInput[] }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-runtime-unit-'));
  await writeFile(path.join(dir, 'tool'), '#!/bin/sh\necho tool\n');
  await writeFile(path.join(dir, 'data.bin'), Buffer.alloc(3 * 1024 * 1024 + 17, 7)); // spans several read chunks
  return {
    dir,
    inputs: [
      { path: 'lib/data.bin', mode: 0o644, source: path.join(dir, 'data.bin') },
      { path: 'bin/tool', mode: 0o755, source: path.join(dir, 'tool') },
      { path: 'bin/run', mode: 0o755, content: '#!/bin/sh\nexec tool "$@"\n' },
    ],
  };
}

async function build(inputs: RuntimeInput[], onMainThread = false) {
  const hashed = await hashRuntimeInputs(inputs, { onMainThread });
  const archive = runtimeArchive(inputs, hashed, { onMainThread, digest: true });
  return { hashed, bytes: await collectBytes(archive.stream), summary: await archive.summary };
}

async function headers(archive: Buffer): Promise<tar.Header[]> {
  const out: tar.Header[] = [];
  for await (const entry of Readable.from([archive]).pipe(tar.extract())) {
    out.push(entry.header);
    entry.resume();
  }
  return out;
}

describe('runtime archive', () => {
  it('gives identical bytes and id for identical inputs, whatever their location, timestamps or thread', async () => {
    const a = await fakeRuntime();
    const bDir = await mkdtemp(path.join(os.tmpdir(), 'rf-runtime-unit-'));
    await cp(a.dir, bDir, { recursive: true });
    await utimes(path.join(bDir, 'tool'), new Date(2001, 1, 1), new Date(2001, 1, 1));
    const bInputs = a.inputs.map((i) => ('source' in i ? { ...i, source: path.join(bDir, path.basename(i.source)) } : i)).reverse();

    const [x, y, z] = [await build(a.inputs), await build(bInputs), await build(a.inputs, true)];
    expect(x.hashed.generationId).toMatch(/^[0-9a-f]{64}$/);
    expect(y.hashed.generationId).toBe(x.hashed.generationId);
    expect(z.hashed.generationId).toBe(x.hashed.generationId);
    expect(Buffer.compare(x.bytes, y.bytes)).toBe(0);
    expect(Buffer.compare(x.bytes, z.bytes)).toBe(0);
    expect(x.summary.bytes).toBe(x.bytes.length);
    expect(y.summary.sha256).toBe(x.summary.sha256);
    expect(x.hashed.manifest.formatVersion).toBe(FORMAT_VERSION);
  });

  it('lays out sorted entries owned by root, mtime 0, folders and executables 0755, files 0644', async () => {
    const { inputs } = await fakeRuntime();
    const list = await headers((await build(inputs)).bytes);
    expect(list.map((h) => [h.name, h.type, h.mode, h.uid, h.gid, h.mtime?.getTime()])).toEqual([
      ['bin/', 'directory', 0o755, 0, 0, 0],
      ['bin/run', 'file', 0o755, 0, 0, 0],
      ['bin/tool', 'file', 0o755, 0, 0, 0],
      ['lib/', 'directory', 0o755, 0, 0, 0],
      ['lib/data.bin', 'file', 0o644, 0, 0, 0],
    ]);
  });

  it('changes the id when one byte, a mode, a path or the inline content changes', async () => {
    const { dir, inputs } = await fakeRuntime();
    const ids = new Set([(await hashRuntimeInputs(inputs)).generationId]);
    const variants: RuntimeInput[][] = [
      inputs.map((i) => (i.path === 'bin/tool' ? { ...i, mode: 0o644 as const } : i)),
      inputs.map((i) => (i.path === 'bin/tool' ? { ...i, path: 'bin/tool2' } : i)),
      inputs.map((i) => (i.path === 'bin/run' ? { ...i, content: '#!/bin/sh\nexec tool  "$@"\n' } : i)),
    ];
    for (const v of variants) ids.add((await hashRuntimeInputs(v)).generationId);
    await writeFile(path.join(dir, 'data.bin'), Buffer.concat([Buffer.alloc(3 * 1024 * 1024 + 16, 7), Buffer.from([8])]));
    ids.add((await hashRuntimeInputs(inputs)).generationId);
    expect(ids.size).toBe(5);
  });

  it('fails the archive when an input changed after it was hashed', async () => {
    const { dir, inputs } = await fakeRuntime();
    const hashed = await hashRuntimeInputs(inputs);
    await writeFile(path.join(dir, 'tool'), '#!/bin/sh\necho TOOL\n'); // same size, other bytes
    const archive = runtimeArchive(inputs, hashed);
    const read = (async () => {
      for await (const chunk of archive.stream) void chunk;
    })();
    await expect(read).rejects.toThrow(/bin\/tool changed while its generation was being built/);
    await expect(archive.summary).rejects.toBeInstanceOf(FleetError);
  });

  it('names an unreadable input', async () => {
    const inputs: RuntimeInput[] = [{ path: 'bin/x', mode: 0o755, source: '/nonexistent/rf-runtime-x' }];
    const err = await hashRuntimeInputs(inputs).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FleetError);
    expect(err).toMatchObject({ code: 'runtime_unavailable', message: expect.stringContaining('/nonexistent/rf-runtime-x') });
  });

  it('rejects inputs with unsafe paths, duplicates, bad modes or a file where a folder is needed', () => {
    const ok = { mode: 0o644 as const, content: 'x' };
    expect(() => checkRuntimeInputs([{ ...ok, path: '../etc/passwd' }])).toThrow(/inputs\[0\]\.path/);
    expect(() => checkRuntimeInputs([{ ...ok, path: '/abs' }])).toThrow(/inputs\[0\]\.path/);
    expect(() => checkRuntimeInputs([{ ...ok, path: 'a' }, { ...ok, path: 'a' }])).toThrow(/used twice/);
    expect(() => checkRuntimeInputs([{ ...ok, path: 'a' }, { ...ok, path: 'a/b' }])).toThrow(/is a file and also a folder/);
    expect(() => checkRuntimeInputs([{ ...ok, path: 'a', mode: 0o777 as never }])).toThrow(/inputs\[0\]\.mode/);
    expect(() => checkRuntimeInputs([{ path: 'a', mode: 0o644, source: 'relative' }])).toThrow(/inputs\[0\]\.source/);
    expect(() => checkRuntimeInputs([{ ...ok, path: '.rollout-fleet-ready' }])).toThrow(/reserved/);
  });

  it('collects node, its loader and libraries, the launcher and extra files by default', async () => {
    const { dir } = await fakeRuntime();
    await chmod(path.join(dir, 'tool'), 0o755);
    const inputs = await defaultRuntimeInputs([
      { source: path.join(dir, 'tool'), path: 'agent/tool' },
      { source: path.join(dir, 'data.bin'), path: 'agent/data.bin' },
    ]);
    const byPath = Object.fromEntries(inputs.map((i) => [i.path, i]));
    expect(byPath['bin/node.real']).toMatchObject({ mode: 0o755, source: expect.stringMatching(/rollout-fleet-runtime\/node-[0-9a-f]{16}$/) });
    expect(byPath['bin/node']).toMatchObject({ mode: 0o755, content: expect.stringContaining('exec "${0%/*}/node.real"') });
    expect(byPath['lib/ld-linux-x86-64.so.2']).toMatchObject({ mode: 0o755 });
    expect(byPath['lib/libc.so.6']).toMatchObject({ mode: 0o644 });
    expect(byPath['agent/tool']).toMatchObject({ mode: 0o755 });
    expect(byPath['agent/data.bin']).toMatchObject({ mode: 0o644 });
  });
});

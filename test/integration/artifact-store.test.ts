// The artifact store's contract, the same tests against both implementations: a folder, and S3 (the
// tests' S3 server, s3rver, behind a proxy that can hold or refuse connections). Then what only one
// of them has: the folder's temp files and links, S3's pagination, a store that is down, a wrong key.
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { inspect } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ArtifactStore } from '../../src/artifacts/artifact-store.ts';
import { ArtifactStoreError } from '../../src/artifacts/artifacts-location.ts';
import { FolderStore } from '../../src/artifacts/folder-store.ts';
import { openArtifactStore } from '../../src/artifacts/open-store.ts';
import { S3Store } from '../../src/artifacts/s3-store.ts';
import { startS3Server, type S3TestServer } from '../helpers/s3-server.ts';
import { waitFor } from '../helpers/fleet.ts';

let server: S3TestServer;
let tmp: string;
const stores: S3Store[] = [];
let seq = 0;

beforeAll(async () => {
  server = await startS3Server();
  tmp = await mkdtemp(path.join(os.tmpdir(), 'artifact-store-'));
});

afterAll(async () => {
  for (const s of stores) s.destroy();
  await server?.stop();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

/** A store of the kind, empty: its own folder, or its own prefix of the bucket. */
const kinds: { kind: string; make: () => Promise<ArtifactStore> }[] = [
  {
    kind: 'folder',
    make: async () => new FolderStore(path.join(tmp, `store-${++seq}`)),
  },
  {
    kind: 's3',
    make: async () => {
      const store = S3Store.fromUrl(`s3://${server.bucket}/run-${++seq}/artifacts`, server.env);
      stores.push(store);
      return store;
    },
  },
];

const signal = () => AbortSignal.timeout(30_000);
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

function bytesOf(n: number, seed = 7): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * seed + (i >> 11)) & 255;
  return b;
}

async function rejection(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (err) {
    return err as Error;
  }
  throw new Error('expected a rejection');
}

describe.each(kinds)('artifact store contract: $kind', ({ make }) => {
  let store: ArtifactStore;
  beforeAll(async () => {
    store = await make();
  });

  it('gets back the bytes it put, every byte value, and a string as UTF-8', async () => {
    const all = Uint8Array.from({ length: 256 }, (_, i) => i);
    await store.put('rt/binary.bin', all, { signal: signal() });
    expect(await store.get('rt/binary.bin', { signal: signal() })).toEqual(all);
    await store.put('rt/text.json', '{"hé":"✓"}', { signal: signal(), contentType: 'application/json' });
    expect(Buffer.from((await store.get('rt/text.json', { signal: signal() }))!).toString('utf8')).toBe('{"hé":"✓"}');
    await store.put('rt/empty', new Uint8Array(0), { signal: signal() });
    expect(await store.get('rt/empty', { signal: signal() })).toEqual(new Uint8Array(0));
  });

  it('replaces an object on put', async () => {
    await store.put('ow/latest.json', 'first, and longer than the second', { signal: signal() });
    await store.put('ow/latest.json', 'second', { signal: signal() });
    expect(Buffer.from((await store.get('ow/latest.json', { signal: signal() }))!).toString()).toBe('second');
    expect(await store.list('ow/', { signal: signal() })).toEqual([{ key: 'ow/latest.json', bytes: 6 }]);
  });

  it('answers undefined for a missing key, from get and open', async () => {
    expect(await store.get('missing/nothing.json', { signal: signal() })).toBeUndefined();
    expect(await store.open('missing/nothing.json', { signal: signal() })).toBeUndefined();
  });

  it('streams a 5 MB object in pieces from open, and refuses it to get past maxBytes naming the key', async () => {
    const big = bytesOf(5 * 1024 * 1024);
    await store.put('big/workspace.tar', big, { signal: signal() });
    const stream = await store.open('big/workspace.tar', { signal: signal() });
    expect(stream).toBeDefined();
    const hash = createHash('sha256');
    let chunks = 0;
    let bytes = 0;
    for await (const chunk of stream! as AsyncIterable<Buffer>) {
      hash.update(chunk);
      chunks++;
      bytes += chunk.length;
    }
    expect(bytes).toBe(big.length);
    expect(chunks).toBeGreaterThan(1);
    expect(hash.digest('hex')).toBe(sha(big));
    expect(sha((await store.get('big/workspace.tar', { signal: signal(), maxBytes: big.length }))!)).toBe(sha(big));
    const err = await rejection(store.get('big/workspace.tar', { signal: signal(), maxBytes: 1024 * 1024 }));
    expect(err).toBeInstanceOf(ArtifactStoreError);
    expect(err.message).toContain('"big/workspace.tar"');
    expect(err.message).toMatch(/1048576/);
  });

  it('lists recursively, sorted by key, with sizes; a string prefix; nothing under a prefix is []', async () => {
    const keys = ['ls/b/2.txt', 'ls/a.txt', 'ls/b/1.txt', 'ls/b/c/deep.txt', 'ls/b-side.txt', 'ls/bc.txt', 'ls2/other.txt'];
    for (const [i, key] of keys.entries()) await store.put(key, 'x'.repeat(i + 1), { signal: signal() });
    const sorted = [...keys].filter((k) => k.startsWith('ls/')).sort();
    expect((await store.list('ls/', { signal: signal() })).map((o) => o.key)).toEqual(sorted);
    expect(await store.list('ls/b/', { signal: signal() })).toEqual([
      { key: 'ls/b/1.txt', bytes: 3 },
      { key: 'ls/b/2.txt', bytes: 1 },
      { key: 'ls/b/c/deep.txt', bytes: 4 },
    ]);
    // Like S3: a prefix that is not a folder matches keys that start with it.
    expect((await store.list('ls/b', { signal: signal() })).map((o) => o.key)).toEqual(['ls/b-side.txt', 'ls/b/1.txt', 'ls/b/2.txt', 'ls/b/c/deep.txt', 'ls/bc.txt']);
    expect(await store.list('nothing/here/', { signal: signal() })).toEqual([]);
    const everything = (await store.list('', { signal: signal() })).map((o) => o.key);
    expect(everything).toEqual([...everything].sort());
    expect(everything).toEqual(expect.arrayContaining(['ls/a.txt', 'ls2/other.txt', 'rt/binary.bin']));
  });

  it('deletes a folder prefix and a single key; nothing there is not an error', async () => {
    for (const key of ['del/ep-1/1/checkpoint.json', 'del/ep-1/2/checkpoint.json', 'del/ep-1/2/workspace.tar', 'del/ep-10/1/checkpoint.json', 'del/keep.json', 'del/drop.json']) {
      await store.put(key, key, { signal: signal() });
    }
    await store.deletePrefix('del/ep-1/', { signal: signal() });
    expect((await store.list('del/', { signal: signal() })).map((o) => o.key)).toEqual(['del/drop.json', 'del/ep-10/1/checkpoint.json', 'del/keep.json']);
    await store.deletePrefix('del/drop.json', { signal: signal() });
    expect((await store.list('del/', { signal: signal() })).map((o) => o.key)).toEqual(['del/ep-10/1/checkpoint.json', 'del/keep.json']);
    expect(await store.get('del/drop.json', { signal: signal() })).toBeUndefined();
    await store.deletePrefix('del/never-was/', { signal: signal() });
    await store.deletePrefix('del/never-was.json', { signal: signal() });
  });

  it('refuses keys with bad characters or . and .. segments with a TypeError naming the key, in every call', async () => {
    const bad = ['../escape', 'a/../../b', '/etc/passwd', 'a//b', 'a b', '.hidden', 'a/./b', 'a\\b', 'ä', 'a\nb', ''];
    for (const key of bad) {
      const calls = [
        () => store.put(key, 'x', { signal: signal() }),
        () => store.get(key, { signal: signal() }),
        () => store.open(key, { signal: signal() }),
        () => store.deletePrefix(key, { signal: signal() }),
        ...(key === '' ? [] : [() => store.list(key, { signal: signal() })]),
      ];
      for (const call of calls) {
        const err = await rejection(call());
        expect(err, key).toBeInstanceOf(TypeError);
        expect(err.message, key).toContain(JSON.stringify(key));
      }
    }
    // A folder is no object: put, get and open take a key.
    expect(await rejection(store.put('a/folder/', 'x', { signal: signal() }))).toBeInstanceOf(TypeError);
  });

  it('rejects every call with the reason of an already aborted signal', async () => {
    const ctrl = new AbortController();
    const reason = new Error('phase over');
    ctrl.abort(reason);
    const s = ctrl.signal;
    for (const call of [() => store.put('ab/x', 'x', { signal: s }), () => store.get('rt/binary.bin', { signal: s }), () => store.open('rt/binary.bin', { signal: s }), () => store.list('', { signal: s }), () => store.deletePrefix('rt/', { signal: s })]) {
      expect(await rejection(call())).toBe(reason);
    }
    expect(await store.get('rt/binary.bin', { signal: signal() })).toBeDefined();
  });

  it('stops an open stream when its signal aborts', async () => {
    await store.put('ab/stream.bin', bytesOf(2 * 1024 * 1024), { signal: signal() });
    const ctrl = new AbortController();
    const stream = (await store.open('ab/stream.bin', { signal: ctrl.signal }))!;
    const err = await rejection((async () => {
      for await (const _ of stream) ctrl.abort(new Error('phase over'));
    })());
    expect(err.name).toBe('AbortError');
    expect(stream.destroyed).toBe(true);
  });
});

describe('folder store', () => {
  it('lists no temp file of a write in progress, and removes the folder of a deleted prefix', async () => {
    const root = path.join(tmp, 'folder-specific');
    const store = new FolderStore(root);
    await store.put('ep/1/checkpoint.json', '{}', { signal: signal() });
    // What writeFileAtomic leaves while it writes: `.<name>.<hex>.tmp` beside the file.
    await writeFile(path.join(root, 'ep', '1', '.checkpoint.json.0a1b2c3d.tmp'), 'partial');
    await writeFile(path.join(root, 'ep', '.workspace.tar.deadbeef.tmp'), 'partial');
    expect(await store.list('', { signal: signal() })).toEqual([{ key: 'ep/1/checkpoint.json', bytes: 2 }]);
    await store.deletePrefix('ep/1/', { signal: signal() });
    expect(await readdir(path.join(root, 'ep'))).toEqual(['.workspace.tar.deadbeef.tmp']);
    await store.deletePrefix('ep/', { signal: signal() });
    expect(await readdir(root)).toEqual([]);
  });

  it('never follows a link out of its root', async () => {
    const root = path.join(tmp, 'folder-links');
    const outside = path.join(tmp, 'outside');
    await mkdir(path.join(root, 'ev'), { recursive: true });
    await mkdir(outside, { recursive: true });
    await writeFile(path.join(outside, 'secret.txt'), 'not yours');
    await symlink(path.join(outside, 'secret.txt'), path.join(root, 'ev', 'link.txt'));
    await symlink(outside, path.join(root, 'dirlink'));
    const store = new FolderStore(root);
    for (const call of [
      () => store.get('ev/link.txt', { signal: signal() }),
      () => store.open('ev/link.txt', { signal: signal() }),
      () => store.put('dirlink/new.txt', 'x', { signal: signal() }),
      () => store.get('dirlink/secret.txt', { signal: signal() }),
      () => store.list('dirlink/', { signal: signal() }),
      () => store.deletePrefix('dirlink/', { signal: signal() }),
    ]) {
      const err = await rejection(call());
      expect(err).toBeInstanceOf(TypeError);
      expect(err.message).toMatch(/inside/);
    }
    // A listing of the root does not descend into a link either.
    expect(await store.list('', { signal: signal() })).toEqual([]);
    expect(await readdir(outside)).toEqual(['secret.txt']);
  });
});

describe('S3 store', () => {
  it('pages through more than 1000 keys in list, and deletes them in batches of 1000', async () => {
    const store = S3Store.fromUrl(`s3://${server.bucket}/paging`, server.env);
    stores.push(store);
    const keys = Array.from({ length: 1005 }, (_, i) => `many/${String(i).padStart(4, '0')}.json`);
    for (let i = 0; i < keys.length; i += 25) await Promise.all(keys.slice(i, i + 25).map((k) => store.put(k, '{}', { signal: signal() })));
    const listed = await store.list('many/', { signal: signal() });
    expect(listed.map((o) => o.key)).toEqual(keys);
    await store.deletePrefix('many/', { signal: signal() });
    expect(await store.list('many/', { signal: signal() })).toEqual([]);
  });

  it('fails a put and a get held by a server that does not answer within a second of the abort', async () => {
    const store = S3Store.fromUrl(`s3://${server.bucket}/held`, server.env);
    stores.push(store);
    await store.put('ready.json', '{}', { signal: signal() });
    server.pause();
    // A client with no connection yet, so each held call opens one the proxy counts as it holds it.
    const held = S3Store.fromUrl(`s3://${server.bucket}/held`, server.env);
    stores.push(held);
    try {
      for (const start of [(s: AbortSignal) => held.put('held.json', '{}', { signal: s }), (s: AbortSignal) => held.get('ready.json', { signal: s })]) {
        const ctrl = new AbortController();
        const reason = new Error('phase over');
        const before = server.heldConnections();
        const call = start(ctrl.signal);
        let settled = false;
        void call.then(() => (settled = true), () => (settled = true));
        // The request has reached the held proxy: it cannot be answered until the abort.
        await waitFor('the call to reach the held server', async () => server.heldConnections() > before, 10_000, 20);
        expect(settled).toBe(false);
        const t0 = performance.now();
        ctrl.abort(reason);
        expect(await rejection(call)).toBe(reason);
        expect(performance.now() - t0).toBeLessThan(1000);
      }
    } finally {
      await server.resume();
    }
    expect(Buffer.from((await store.get('ready.json', { signal: signal() }))!).toString()).toBe('{}');
  });

  it('fails every call of a store that is down with an error naming the operation and key, never the secret', async () => {
    const store = S3Store.fromUrl(`s3://${server.bucket}/down`, server.env);
    stores.push(store);
    await server.down();
    try {
      const calls: [string, string, () => Promise<unknown>][] = [
        ['PutObject', 'ep/evidence.txt', () => store.put('ep/evidence.txt', 'x', { signal: signal() })],
        ['GetObject', 'ep/result.json', () => store.get('ep/result.json', { signal: signal() })],
        ['GetObject', 'ep/workspace.tar', () => store.open('ep/workspace.tar', { signal: signal() })],
        ['ListObjectsV2', 'ep/', () => store.list('ep/', { signal: signal() })],
        ['ListObjectsV2', 'ep/old/', () => store.deletePrefix('ep/old/', { signal: signal() })],
      ];
      for (const [operation, key, call] of calls) {
        const t0 = performance.now();
        const err = await rejection(call());
        // The SDK's 3 attempts with backoff, against refused connections.
        expect(performance.now() - t0).toBeLessThan(5000);
        expect(err).toBeInstanceOf(ArtifactStoreError);
        expect(err.message).toContain(`${operation} of ${JSON.stringify(key)}`);
        expect(err.message).toContain('ECONNREFUSED');
        expect(err.message).not.toContain(server.secretAccessKey);
        expect(inspect(err, { depth: 6 })).not.toContain(server.secretAccessKey);
      }
    } finally {
      await server.resume();
    }
  });

  it('names the operation and key when the key pair is wrong, and shows neither secret', async () => {
    const wrong = `wrong-${server.secretAccessKey.slice(7)}`;
    const store = S3Store.fromUrl(`s3://${server.bucket}/auth`, { ...server.env, AWS_SECRET_ACCESS_KEY: wrong });
    stores.push(store);
    for (const [operation, call] of [
      ['PutObject', () => store.put('a/b.json', '{}', { signal: signal() })],
      ['GetObject', () => store.get('a/b.json', { signal: signal() })],
      ['ListObjectsV2', () => store.list('a/', { signal: signal() })],
    ] as const) {
      const err = await rejection(call());
      expect(err).toBeInstanceOf(ArtifactStoreError);
      expect(err.message).toMatch(new RegExp(`${operation} of "a/(b.json)?".*SignatureDoesNotMatch \\(HTTP 403\\)`));
      for (const secret of [wrong, server.secretAccessKey]) {
        expect(err.message).not.toContain(secret);
        expect(inspect(err, { depth: 6 })).not.toContain(secret);
      }
    }
  });

  it('takes a missing bucket for an error, not for a missing object', async () => {
    const store = S3Store.fromUrl('s3://no-such-bucket/x', server.env);
    stores.push(store);
    const err = await rejection(store.get('a.json', { signal: signal() }));
    expect(err).toBeInstanceOf(ArtifactStoreError);
    expect(err.message).toMatch(/GetObject of "a.json".*NoSuchBucket/);
  });
});

describe('openArtifactStore', () => {
  it('opens S3 for s3://, a folder for an absolute path, the data folder when unset; names a bad value', () => {
    const s3 = openArtifactStore('s3://fleet-artifacts/runs', '/data', server.env);
    expect([s3.kind, s3.location]).toEqual(['s3', 's3://fleet-artifacts/runs/']);
    (s3 as S3Store).destroy();
    const folder = openArtifactStore('/mnt/artifacts/', '/data');
    expect([folder.kind, folder.location]).toEqual(['folder', '/mnt/artifacts']);
    for (const unset of [undefined, '']) {
      const dflt = openArtifactStore(unset, '/data/fleet');
      expect([dflt.kind, dflt.location]).toEqual(['folder', '/data/fleet']);
    }
    expect(() => openArtifactStore('artifacts', '/data')).toThrow(/^FLEET_ARTIFACTS: must be .* \(got "artifacts"\)$/);
  });
});

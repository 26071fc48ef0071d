// The evidence store's attempt numbering for attempts Redis could not number: never a folder in use.
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { EvidenceStore } from '../../src/evidence/evidence-store.ts';

describe('EvidenceStore.unusedAttempt', () => {
  const dirs: string[] = [];
  afterAll(async () => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));

  it('skips past every attempt folder of the episode, and takes the floor it is given when free', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-evidence-'));
    dirs.push(dataDir);
    const store = new EvidenceStore(dataDir);
    expect(await store.unusedAttempt('b.t.0', 1)).toBe(1);
    for (const name of ['attempt-1', 'attempt-3', 'salvaged-abc', 'attempt-x']) await mkdir(path.join(dataDir, 'evidence', 'b.t.0', name), { recursive: true });
    expect(await store.unusedAttempt('b.t.0', 1)).toBe(4);
    expect(await store.unusedAttempt('b.t.0', 7)).toBe(7);
    expect(await store.unusedAttempt('b.t.1', 2)).toBe(2);
  });
});

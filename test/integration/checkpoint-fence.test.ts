// The fence: once an episode has its result, its checkpoints are removed and stay removed. A writer's
// job that runs late (a slow queue, a writer on another host) writes nothing; one that was writing when
// the result came removes what it wrote. For both stores: the folder store, and the object store
// (here over a folder of objects; the two-host test runs it on the S3 test server).
import { mkdtemp } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkpointProcessor } from '../../queues/checkpoints/processor.ts';
import { FolderStore } from '../../src/artifacts/folder-store.ts';
import { Checkpoint, CheckpointOffer } from '../../src/checkpoints/checkpoint.ts';
import type { CheckpointStorage } from '../../src/checkpoints/checkpoint-storage.ts';
import { FolderCheckpointStore } from '../../src/checkpoints/folder-checkpoint-store.ts';
import { newStagedKey, stageCheckpoint } from '../../src/checkpoints/checkpoint-staging.ts';
import { ObjectCheckpointStore } from '../../src/checkpoints/object-checkpoint-store.ts';
import { checkpointFenceKey } from '../../src/redis/redis-keys.ts';
import { silentLog, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';
import { offerOf, sha256, workspaceTar } from '../helpers/checkpoints.ts';

describe.each(['folder', 'object'] as const)('checkpoint fence (%s store)', (kind) => {
  let env: FleetEnv;
  let store: CheckpointStorage;
  let n = 0;

  beforeAll(async () => {
    env = await startFleetEnv();
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-fence-'));
    store = kind === 'folder' ? new FolderCheckpointStore(new FolderStore(dir)) : new ObjectCheckpointStore(new FolderStore(dir), env.client, env.prefix);
  });
  afterAll(async () => {
    await env?.close();
  });

  async function job(episodeId: string, seq: number): Promise<Job> {
    const tar = await workspaceTar(4_096, seq);
    const offer = CheckpointOffer.parse({ ...offerOf(episodeId, seq), createdAt: new Date().toISOString() });
    const checkpoint = Checkpoint.parse({ ...offer, workspace: { captured: true, file: 'workspace.tar', bytes: tar.length, sha256: sha256(tar) } });
    const stagedKey = newStagedKey(env.prefix, `${episodeId}.cp${seq}`);
    await stageCheckpoint(env.client, stagedKey, checkpoint, tar, 60_000);
    return { id: `${episodeId}.cp${seq}`, data: { episodeId, seq, stagedKey, createdAt: checkpoint.createdAt } } as unknown as Job;
  }

  it('writes nothing for an episode that already has its result', async () => {
    const episodeId = `fence-${kind}.t.${n++}`;
    const process = checkpointProcessor({ store, redis: env.client, prefix: env.prefix, log: silentLog });
    expect(await process(await job(episodeId, 1))).toMatchObject({ outcome: 'written', latest: 1 });
    // The result: fence, then remove (as the episodes processor does).
    await env.client.set(checkpointFenceKey(env.prefix, episodeId), '1');
    await store.remove(episodeId);
    // A late job of the same episode, staged before the result.
    expect(await process(await job(episodeId, 2))).toMatchObject({ outcome: 'fenced' });
    expect(await store.seqs(episodeId)).toEqual([]);
    expect(await store.latest(episodeId)).toBeUndefined();
  });

  it('removes again what a writer wrote while the result came', async () => {
    const episodeId = `fence-${kind}.t.${n++}`;
    // The result lands between the writer's fence check and its write: the store's write sets it.
    const racing: CheckpointStorage = {
      keep: store.keep,
      write: async (cp, tar) => {
        await env.client.set(checkpointFenceKey(env.prefix, episodeId), '1');
        await store.remove(episodeId);
        return store.write(cp, tar);
      },
      latest: (e) => store.latest(e),
      read: (e, s) => store.read(e, s),
      seqs: (e) => store.seqs(e),
      remove: (e) => store.remove(e),
    };
    const process = checkpointProcessor({ store: racing, redis: env.client, prefix: env.prefix, log: silentLog });
    expect(await process(await job(episodeId, 1))).toMatchObject({ outcome: 'fenced' });
    expect(await store.seqs(episodeId)).toEqual([]);
  });
});

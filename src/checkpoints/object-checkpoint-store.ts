// Durable checkpoints in the artifact store every host reads (FLEET_ARTIFACTS=s3://...), so a retry on
// any host resumes where the episode was, whichever host's writer wrote it. Layout under
// checkpoints/<episode>/: <seq, 8 digits>/workspace.tar then <seq>/checkpoint.json, the JSON last (a seq
// is complete once its checkpoint.json exists; objects appear whole). The newest seq is also kept in
// Redis (only ever raised, atomically), so readers need not list; older seqs beyond `keep` are deleted.
import { PassThrough, type Readable } from 'node:stream';
import type { Redis } from 'ioredis';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { luaScript } from '../redis/lua-script.ts';
import { checkpointLatestKey } from '../redis/redis-keys.ts';
import { CHECKPOINT_JSON, Checkpoint, WORKSPACE_TAR, seqFolderName } from './checkpoint.ts';
import { pointedOrNewest, type CheckpointStorage, type CheckpointWriteResult, type StoredCheckpoint } from './checkpoint-storage.ts';

/** Longest a checkpoint's Redis pointer outlives its last update (the longest episode deadline and then some). */
const POINTER_TTL_SEC = 8 * 24 * 3600;
/** Every store call gets this long (the writer's job is retried; a reader's phase has its own deadline). */
const CALL_MS = 60_000;
const MAX_CHECKPOINT_JSON_BYTES = 64 * 1024 * 1024;

/** Raise the pointer to a seq unless it is already there or higher; the pointer afterwards (src/redis/lua/checkpoint-raise-pointer-1.lua). */
const RAISE_POINTER = luaScript<[pointer: string], [seq: number, ttlSec: number], number>('checkpoint-raise-pointer-1');

const seqOf = (key: string, base: string): number | undefined => {
  const rest = key.slice(base.length);
  const match = /^(\d{8,})\/checkpoint\.json$/.exec(rest);
  return match ? Number(match[1]) : undefined;
};

export class ObjectCheckpointStore implements CheckpointStorage {
  readonly keep: number;

  constructor(
    private readonly store: ArtifactStore,
    private readonly redis: Redis,
    private readonly prefix: string,
    opts: { keep?: number } = {},
  ) {
    const keep = opts.keep ?? 5;
    if (!Number.isInteger(keep) || keep < 1) throw new TypeError(`Expected \`keep\` to be an integer from 1 up, got \`${keep}\` (${typeof keep})`);
    this.keep = keep;
  }

  private base(episodeId: string): string {
    return `checkpoints/${episodeId}/`;
  }

  private signal(): AbortSignal {
    return AbortSignal.timeout(CALL_MS);
  }

  async write(input: Checkpoint, workspaceTar?: Uint8Array): Promise<CheckpointWriteResult> {
    const checkpoint = Checkpoint.parse(input);
    const { episodeId, seq, workspace } = checkpoint;
    if (workspace.captured && workspaceTar?.length !== workspace.bytes) {
      throw new TypeError(`workspaceTar: expected ${workspace.bytes} bytes as the checkpoint says, got ${workspaceTar?.length ?? 'none'}`);
    }
    const dir = `${this.base(episodeId)}${seqFolderName(seq)}/`;
    const kept = await this.seqs(episodeId);
    if (kept.includes(seq)) return { outcome: 'already-written', latest: await this.raise(episodeId, seq), dir };
    if (kept.filter((s) => s > seq).length >= this.keep) return { outcome: 'superseded', latest: kept.at(-1) ?? -1 };
    if (workspace.captured) await this.store.put(`${dir}${WORKSPACE_TAR}`, workspaceTar!, { signal: this.signal(), contentType: 'application/x-tar' });
    await this.store.put(`${dir}${CHECKPOINT_JSON}`, JSON.stringify(checkpoint), { signal: this.signal(), contentType: 'application/json' });
    const latest = await this.raise(episodeId, seq);
    // The newest `keep` stay (the one the pointer names always among them); older ones go.
    const prune = [...kept, seq].sort((a, b) => a - b).slice(0, -this.keep).filter((s) => s !== latest);
    await Promise.all(prune.map((s) => this.store.deletePrefix(`${this.base(episodeId)}${seqFolderName(s)}/`, { signal: this.signal() })));
    return { outcome: 'written', latest, dir };
  }

  private async raise(episodeId: string, seq: number): Promise<number> {
    return Number(await RAISE_POINTER.run(this.redis, [checkpointLatestKey(this.prefix, episodeId)], [seq, POINTER_TTL_SEC]));
  }

  async latest(episodeId: string): Promise<StoredCheckpoint | undefined> {
    const pointer = await this.redis.get(checkpointLatestKey(this.prefix, episodeId));
    return pointedOrNewest(this, episodeId, pointer === null ? undefined : Number(pointer));
  }

  async read(episodeId: string, seq: number): Promise<StoredCheckpoint | undefined> {
    const dir = `${this.base(episodeId)}${seqFolderName(seq)}/`;
    const bytes = await this.store.get(`${dir}${CHECKPOINT_JSON}`, { signal: this.signal(), maxBytes: MAX_CHECKPOINT_JSON_BYTES });
    if (bytes === undefined) return undefined;
    const checkpoint = Checkpoint.parse(JSON.parse(Buffer.from(bytes).toString('utf8')));
    if (!checkpoint.workspace.captured) return { seq, dir, checkpoint };
    const key = `${dir}${WORKSPACE_TAR}`;
    return { seq, dir, checkpoint, workspaceTar: { path: key, bytes: checkpoint.workspace.bytes, open: () => this.openLater(key) } };
  }

  /** A stream now of an object fetched as it is read (the interface's open is synchronous). */
  private openLater(key: string): Readable {
    const out = new PassThrough();
    this.store.open(key, { signal: this.signal() }).then(
      (stream) => {
        if (stream === undefined) out.destroy(new Error(`checkpoint object ${key} is gone`));
        else stream.on('error', (err) => out.destroy(err)).pipe(out);
      },
      (err: unknown) => out.destroy(err as Error),
    );
    return out;
  }

  async seqs(episodeId: string): Promise<number[]> {
    const base = this.base(episodeId);
    const keys = await this.store.list(base, { signal: this.signal() });
    return keys.map((k) => seqOf(k.key, base)).filter((s): s is number => s !== undefined).sort((a, b) => a - b);
  }

  async remove(episodeId: string): Promise<void> {
    await this.store.deletePrefix(this.base(episodeId), { signal: this.signal() });
    await this.redis.del(checkpointLatestKey(this.prefix, episodeId));
  }
}

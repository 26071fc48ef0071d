// Durable checkpoints in the folder artifact store (FolderStore: the data folder, or FLEET_ARTIFACTS=/path).
// Reads go through the store; writes assemble whole seq folders, which the store's per-file puts cannot.
// Layout under <root>/checkpoints/<episode>/ (key checkpoints/<episode>/<seq>/checkpoint.json):
//   00000007/checkpoint.json, 00000007/workspace.tar   one folder per seq, complete or absent
//   latest.json                                        { "seq": 7 }: the newest, never moves back
//   .tmp-*, .trash-*                                   in flight or abandoned; readers ignore them
// A folder is assembled under a temp name (files fsynced), renamed into place (the folder appears
// whole or not at all; a second writer of the same seq finds it there), then the parent is fsynced and
// latest.json replaced (temp + fsync + rename) under a per-episode lock. Pruning renames a folder away
// before deleting it, so a reader never meets a half-deleted one.
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, open, readFile, readdir, rename, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { z } from 'zod';
import type { FolderStore } from '../artifacts/folder-store.ts';
import { createDurable, fillAndSync, fsyncDir } from '../files/atomic-write.ts';
import { CHECKPOINT_JSON, Checkpoint, SEQ_FOLDER, WORKSPACE_TAR, seqFolderName } from './checkpoint.ts';
import { pointedOrNewest, type CheckpointStorage, type CheckpointWriteResult, type StoredCheckpoint } from './checkpoint-storage.ts';
import { processEpisodeLock, type EpisodeLock, type ReleaseLock } from './episode-lock.ts';

const LATEST_JSON = 'latest.json';
/** A checkpoint.json read gets this long (a local disk; a mounted one may stall). */
const READ_MS = 60_000;
const LatestPointer = z.object({ seq: z.number().int().min(0) });
type LatestPointer = z.infer<typeof LatestPointer>;

/** Temp folders name their writer, so one whose writer is dead can go at once (same host only). */
const HOST_TAG = createHash('sha256').update(os.hostname()).digest('hex').slice(0, 8);
const TEMP_NAME = /^\.tmp-(?:\d+|latest)-([0-9a-f]{8})-(\d+)-[0-9a-f]+$/;
const tempName = (what: string | number) => `.tmp-${what}-${HOST_TAG}-${process.pid}-${randomBytes(4).toString('hex')}`;

export interface FolderCheckpointStoreOptions {
  /** Checkpoints kept per episode: the newest ones. @default 5 */
  keep?: number;
  /** Serializes latest.json updates of an episode. @default processEpisodeLock() (enough for one writer process) */
  lock?: EpisodeLock;
  /** A temp folder this old is removed even when its writer may still live. @default 600000 */
  staleTempMs?: number;
}

export type { CheckpointWriteResult, StoredCheckpoint, StoredWorkspaceTar } from './checkpoint-storage.ts';

const isMissing = (err: unknown) => (err as NodeJS.ErrnoException).code === 'ENOENT';

/** Settle every one, then throw the first failure: nothing is left running behind a clean-up. */
async function allOrFirstError(work: Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(work)).find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
}

const pointerJson = (seq: number) => JSON.stringify({ seq, updatedAt: new Date().toISOString() });

/** A latest.json written and fsynced under a temp name, ready to be renamed into place. */
interface PreparedPointer {
  seq: number;
  file: string;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export class FolderCheckpointStore implements CheckpointStorage {
  readonly keep: number;
  private readonly lock: EpisodeLock;
  private readonly staleTempMs: number;

  private readonly root: string;
  /** Episode folders known to exist (bounded: forgotten wholesale past 10,000). */
  private readonly known = new Set<string>();

  constructor(private readonly store: FolderStore, opts: FolderCheckpointStoreOptions = {}) {
    this.root = store.root;
    const keep = opts.keep ?? 5;
    if (!Number.isInteger(keep) || keep < 1) throw new TypeError(`Expected \`keep\` to be an integer from 1 up, got \`${keep}\` (${typeof keep})`);
    this.keep = keep;
    this.lock = opts.lock ?? processEpisodeLock();
    this.staleTempMs = opts.staleTempMs ?? 600_000;
  }

  folder(episodeId: string): string {
    return path.join(this.root, 'checkpoints', episodeId);
  }

  /**
   * Persist one checkpoint (with its workspace tar when `checkpoint.workspace.captured`). Idempotent:
   * a seq already on disk is left as it is. Resolves once the checkpoint and latest.json are durable.
   */
  async write(input: Checkpoint, workspaceTar?: Uint8Array): Promise<CheckpointWriteResult> {
    const checkpoint = Checkpoint.parse(input);
    const { episodeId, seq, workspace } = checkpoint;
    if (workspace.captured && workspaceTar?.length !== workspace.bytes) {
      throw new TypeError(`workspaceTar: expected ${workspace.bytes} bytes as the checkpoint says, got ${workspaceTar?.length ?? 'none'}`);
    }
    const dir = this.folder(episodeId);
    await this.ensureFolder(dir);
    const final = path.join(dir, seqFolderName(seq));
    const onDisk = await this.seqs(episodeId);
    let outcome: CheckpointWriteResult['outcome'] | undefined;
    if (onDisk.includes(seq)) outcome = 'already-written';
    else if (onDisk.filter((s) => s > seq).length >= this.keep) outcome = 'superseded';
    // The lock is taken while the folder is written, so waiting for it costs no extra time.
    const held = this.lock.acquire(episodeId);
    held.catch(() => undefined);
    let prepared: PreparedPointer | undefined;
    try {
      if (outcome === undefined) ({ outcome, prepared } = await this.writeFolder(dir, final, checkpoint, workspace.captured ? workspaceTar : undefined));
    } catch (err) {
      held.then((release) => release(), () => undefined);
      this.known.delete(dir); // in case the folder was removed under us: the retry creates it again
      throw err;
    }
    let release: ReleaseLock | undefined;
    try {
      release = await held;
      const latest = await this.publish(dir, prepared);
      prepared = undefined;
      return { outcome, latest, ...(outcome !== 'superseded' && { dir: final }) };
    } finally {
      release?.();
      if (prepared) await rm(prepared.file, { force: true }).catch(() => undefined);
    }
  }

  /** The checkpoint latest.json points at (or, without one, the newest folder), or undefined. */
  async latest(episodeId: string): Promise<StoredCheckpoint | undefined> {
    return pointedOrNewest(this, episodeId, (await this.readPointer(this.folder(episodeId)))?.seq);
  }

  /** One checkpoint, or undefined when that seq is not (or no longer) on disk. */
  async read(episodeId: string, seq: number): Promise<StoredCheckpoint | undefined> {
    const dir = path.join(this.folder(episodeId), seqFolderName(seq));
    const bytes = await this.store.get(`checkpoints/${episodeId}/${seqFolderName(seq)}/${CHECKPOINT_JSON}`, { signal: AbortSignal.timeout(READ_MS) });
    if (bytes === undefined) return undefined;
    const checkpoint = Checkpoint.parse(JSON.parse(Buffer.from(bytes).toString('utf8')));
    if (!checkpoint.workspace.captured) return { seq, dir, checkpoint };
    const tarPath = path.join(dir, WORKSPACE_TAR);
    const tarBytes = checkpoint.workspace.bytes;
    return { seq, dir, checkpoint, workspaceTar: { path: tarPath, bytes: tarBytes, open: () => createReadStream(tarPath) } };
  }

  /** Remove the episode's folder (the episode is over). */
  async remove(episodeId: string): Promise<void> {
    const dir = this.folder(episodeId);
    this.known.delete(dir);
    await rm(dir, { recursive: true, force: true });
  }

  /** The seqs on disk, ascending. */
  async seqs(episodeId: string): Promise<number[]> {
    const names = await readdir(this.folder(episodeId)).catch((err: unknown) => {
      if (isMissing(err)) return [] as string[];
      throw err;
    });
    return names.filter((n) => SEQ_FOLDER.test(n)).map(Number).sort((a, b) => a - b);
  }

  private async ensureFolder(dir: string): Promise<void> {
    if (this.known.has(dir)) return;
    if (this.known.size >= 10_000) this.known.clear();
    const first = await mkdir(dir, { recursive: true });
    this.known.add(dir);
    if (first === undefined) return;
    // Make the new folders' names durable: fsync the parent of every folder just created.
    const parents: string[] = [];
    for (let d = dir; d !== first; d = path.dirname(d)) parents.push(path.dirname(d));
    parents.push(path.dirname(first));
    for (const d of parents.reverse()) await fsyncDir(d);
  }

  /**
   * Assemble the seq folder under a temp name and rename it into place; meanwhile prepare the
   * latest.json that would point at it. Returns the prepared pointer when the folder was written.
   */
  private async writeFolder(dir: string, final: string, checkpoint: Checkpoint, workspaceTar: Uint8Array | undefined): Promise<{ outcome: 'written' | 'already-written'; prepared?: PreparedPointer }> {
    const tmp = path.join(dir, tempName(checkpoint.seq));
    const pointer: PreparedPointer = { seq: checkpoint.seq, file: path.join(dir, tempName('latest')) };
    let renamed = false;
    let handedOver = false;
    await mkdir(tmp);
    try {
      const json = await open(path.join(tmp, CHECKPOINT_JSON), 'wx');
      const tar = workspaceTar && (await open(path.join(tmp, WORKSPACE_TAR), 'wx').catch(async (err: unknown) => {
        await json.close();
        throw err;
      }));
      // The files' names exist now: fsync the folder while their contents are written and fsynced
      // (in parallel, so the fsyncs overlap), and while the would-be latest.json is prepared.
      await allOrFirstError([
        fillAndSync(json, JSON.stringify(checkpoint)),
        ...(tar && workspaceTar ? [fillAndSync(tar, workspaceTar)] : []),
        fsyncDir(tmp),
        createDurable(pointer.file, pointerJson(checkpoint.seq)),
      ]);
      try {
        await rename(tmp, final);
        renamed = true;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'ENOTEMPTY' || code === 'EEXIST') return { outcome: 'already-written' }; // another writer won
        throw err;
      }
      await fsyncDir(dir);
      handedOver = true;
      return { outcome: 'written', prepared: pointer };
    } finally {
      if (!renamed) await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
      if (!handedOver) await rm(pointer.file, { force: true }).catch(() => undefined);
    }
  }

  private async readPointer(dir: string): Promise<LatestPointer | undefined> {
    try {
      return LatestPointer.parse(JSON.parse(await readFile(path.join(dir, LATEST_JSON), 'utf8')));
    } catch (err) {
      if (isMissing(err)) return undefined;
      throw err;
    }
  }

  /**
   * Under the episode's lock: point latest.json at the newest folder if that is newer than where it
   * points (so a writer that died between rename and publish is caught up by the next one), prune
   * beyond `keep`, clear abandoned temp folders. Returns the seq latest.json points at. A prepared
   * pointer is used when it names the newest folder, and removed otherwise.
   */
  private async publish(dir: string, prepared: PreparedPointer | undefined): Promise<number> {
    let used = false;
    let latest: number;
    let names: string[];
    let seqs: number[];
    try {
      names = await readdir(dir);
      seqs = names.filter((n) => SEQ_FOLDER.test(n)).map(Number).sort((a, b) => a - b);
      latest = (await this.readPointer(dir))?.seq ?? -1;
      const newest = seqs.at(-1) ?? -1;
      if (newest > latest) {
        const file = prepared?.seq === newest ? prepared.file : path.join(dir, tempName('latest'));
        if (file !== prepared?.file) await createDurable(file, pointerJson(newest));
        used = file === prepared?.file;
        await rename(file, path.join(dir, LATEST_JSON)).catch(async (err: unknown) => {
          await rm(file, { force: true }).catch(() => undefined);
          throw err;
        });
        await fsyncDir(dir);
        latest = newest;
      }
    } finally {
      if (prepared && !used) await rm(prepared.file, { force: true }).catch(() => undefined);
    }
    const prune = seqs.slice(0, Math.max(0, seqs.length - this.keep)).filter((s) => s !== latest);
    await Promise.all(prune.map(async (s) => {
      const trash = path.join(dir, `.trash-${seqFolderName(s)}-${randomBytes(4).toString('hex')}`);
      await rename(path.join(dir, seqFolderName(s)), trash).catch(() => undefined);
    }));
    await this.sweep(dir, prune.length > 0 ? await readdir(dir) : names);
    return latest;
  }

  private async sweep(dir: string, names: string[]): Promise<void> {
    const now = Date.now();
    await Promise.all(names.filter((n) => n.startsWith('.')).map(async (name) => {
      const full = path.join(dir, name);
      let stale = name.startsWith('.trash-');
      if (!stale && name.startsWith('.tmp-')) {
        const owner = TEMP_NAME.exec(name);
        const deadOwner = owner !== null && owner[1] === HOST_TAG && !processAlive(Number(owner[2]));
        stale = deadOwner || (await stat(full).then((s) => now - s.mtimeMs > this.staleTempMs, () => false));
      }
      if (stale) await rm(full, { recursive: true, force: true }).catch(() => undefined);
    }));
  }
}

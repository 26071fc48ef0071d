// Evidence that any host can read: an attempt's evidence folder, written on the host that ran it, is
// copied into the artifact store (FLEET_ARTIFACTS) under the same relative path. Close gives it its
// share of the close reserve; what is not copied by then stays in the host's outbox (a marker file per
// folder under FLEET_DATA_DIR/outbox/) and the worker's background publisher copies it later, also
// after a restart. When the store is the data folder itself (the default), there is nothing to copy.
import { mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { setMaxListeners } from 'node:events';
import path from 'node:path';
import type { Logger } from 'pino';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';

const OUTBOX = 'outbox';

/** Whether the store is the data folder itself (evidence written there is already published). */
export function storeIsDataDir(store: ArtifactStore, dataDir: string): boolean {
  return store.kind === 'folder' && path.resolve(store.location) === path.resolve(dataDir);
}

async function filesUnder(root: string, rel: string): Promise<string[]> {
  // Only a folder that is not there is empty: any other error (EMFILE, EACCES) must not pass for "nothing to copy".
  const entries = await readdir(path.join(root, rel), { withFileTypes: true }).catch((err: unknown) => {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  });
  const out: string[] = [];
  for (const e of entries) {
    // A key segment never starts with `.` (checkKey): dot files and dot folders (a workspace's .git,
    // .solution) stay on the host only; one such key failed the whole folder, which then never left the outbox.
    if (e.name.startsWith('.')) continue;
    const child = `${rel}/${e.name}`;
    if (e.isDirectory()) out.push(...(await filesUnder(root, child)));
    else if (e.isFile()) out.push(child);
  }
  return out;
}

const markerName = (rel: string) => rel.replaceAll('/', '__');

export class EvidencePublisher {
  constructor(
    private readonly store: ArtifactStore,
    private readonly dataDir: string,
    private readonly log: Logger,
  ) {}

  /** Nothing to copy: the store is the data folder. */
  get local(): boolean {
    return storeIsDataDir(this.store, this.dataDir);
  }

  /**
   * Copy `rel` (a folder under the data folder, e.g. `evidence/<episode>/attempt-2`) into the store.
   * It is put in the outbox first, and leaves it once every file is copied; a failure (or `signal`)
   * leaves it there for `drainOutbox`.
   */
  async publish(rel: string, signal: AbortSignal): Promise<{ files: number; bytes: number }> {
    if (this.local) return { files: 0, bytes: 0 };
    // Every file's call listens to it, 8 at a time, each with the SDK's own listeners.
    setMaxListeners(0, signal);
    const marker = path.join(this.dataDir, OUTBOX, markerName(rel));
    await mkdir(path.dirname(marker), { recursive: true });
    await writeFile(marker, rel);
    let bytes = 0;
    const files = await filesUnder(this.dataDir, rel);
    // A few at a time: a workspace snapshot may hold many small files.
    for (let i = 0; i < files.length; i += 8) {
      await Promise.all(files.slice(i, i + 8).map(async (file) => {
        signal.throwIfAborted();
        const body = await readFile(path.join(this.dataDir, file));
        bytes += body.length;
        await this.store.put(file, body, { signal });
      }));
    }
    await rm(marker, { force: true });
    return { files: files.length, bytes };
  }

  /** `publish` of a folder given by its absolute path under the data folder. */
  publishPath(folder: string, signal: AbortSignal): Promise<{ files: number; bytes: number }> {
    return this.publish(path.relative(this.dataDir, folder).split(path.sep).join('/'), signal);
  }

  /** Copy every folder still in the outbox (each under its own deadline); returns how many went. */
  async drainOutbox(callTimeoutMs: number): Promise<number> {
    if (this.local) return 0;
    const markers = await readdir(path.join(this.dataDir, OUTBOX)).catch(() => [] as string[]);
    let done = 0;
    for (const name of markers) {
      const rel = await readFile(path.join(this.dataDir, OUTBOX, name), 'utf8').catch(() => undefined);
      if (rel === undefined || markerName(rel) !== name || !/^evidence\/[^/]+\/[^/]+$/.test(rel)) {
        await rm(path.join(this.dataDir, OUTBOX, name), { force: true });
        continue;
      }
      try {
        const copied = await this.publish(rel, AbortSignal.timeout(callTimeoutMs));
        done += 1;
        this.log.info({ folder: rel, ...copied }, 'evidence published from the outbox');
      } catch (err) {
        this.log.warn({ folder: rel, err: String(err) }, 'evidence still not published; it stays in the outbox');
      }
    }
    return done;
  }
}

// Publish a file under a name that says what it holds, at most once: concurrent processes (workers
// sharing a data folder) race to create it with link(2), and nobody ever replaces a published file,
// so a reader hashing it cannot see it change underneath.
import { link, rm, stat } from 'node:fs/promises';

/** Move the finished `tmp` to `target` unless `target` exists already; `tmp` is gone either way. */
export async function publishOnce(tmp: string, target: string): Promise<void> {
  try {
    await link(tmp, target);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  } finally {
    await rm(tmp, { force: true });
  }
}

export async function exists(file: string): Promise<boolean> {
  return stat(file).then(() => true, () => false);
}

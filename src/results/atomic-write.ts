// Write a file so that readers see the old content or the new, never a torn one: temp file, fsync,
// rename, fsync of the folder.
import { randomBytes } from 'node:crypto';
import { mkdir, open, rename } from 'node:fs/promises';
import path from 'node:path';

export async function writeFileAtomic(file: string, data: string | Uint8Array): Promise<void> {
  const dir = path.dirname(file);
  await mkdir(dir, { recursive: true });
  const tmp = path.join(dir, `.${path.basename(file)}.${randomBytes(4).toString('hex')}.tmp`);
  const fh = await open(tmp, 'w');
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, file);
  const dh = await open(dir, 'r');
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

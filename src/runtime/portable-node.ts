// The node binary of the runtime, made to run from the runtime's own folder in any x86_64 image: its
// ELF interpreter and library path point into the mount path (patchelf), so it starts directly, its
// process.execPath is itself, and what spawns process.execPath (node --test, child_process.fork)
// works too. The copy is cached by the source binary's identity; patchelf's output is deterministic.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { FleetError } from '../errors/fleet-error.ts';
import { exists, publishOnce } from '../files/atomic-write.ts';
/** Where sandboxes see the runtime (read-only); the patched binary's interpreter and rpath point here. */
export const RUNTIME_MOUNT_PATH = '/opt/rollout-fleet';

export const RUNTIME_LOADER = `${RUNTIME_MOUNT_PATH}/lib/ld-linux-x86-64.so.2`;

/** A copy of `nodeBinary` whose interpreter and rpath are the runtime's; returns its path. */
export async function portableNodeBinary(cacheDir: string, nodeBinary = process.execPath): Promise<string> {
  const st = await stat(nodeBinary);
  const identity = createHash('sha256').update(`${nodeBinary}\0${st.size}\0${st.mtimeMs}\0${st.ino}\0${RUNTIME_MOUNT_PATH}`).digest('hex').slice(0, 16);
  const out = path.join(cacheDir, `node-${identity}`);
  if (await exists(out)) return out;
  await mkdir(cacheDir, { recursive: true });
  const tmp = `${out}.${process.pid}.${Date.now()}.tmp`;
  try {
    await promisify(execFile)('patchelf', ['--set-interpreter', RUNTIME_LOADER, '--set-rpath', `${RUNTIME_MOUNT_PATH}/lib`, '--output', tmp, nodeBinary], { timeout: 60_000 });
  } catch (err) {
    throw new FleetError('runtime_unavailable', `patchelf of ${nodeBinary} failed (is patchelf installed? the README's set-up installs it): ${(err as Error).message}`, { cause: err });
  }
  await publishOnce(tmp, out);
  return out;
}

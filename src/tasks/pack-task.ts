// Packs a task folder into a deterministic tar: the same folder gives byte-identical archives on any
// machine (sorted entries, fixed mtime, uid, gid and modes), so its sha256 names the task's content
// and every episode records exactly what it ran. A folder too big for the store, or of too many
// entries, is refused from its listing and sizes before a byte is read; digestTask hashes without
// keeping the archive, so a batch of many big tasks is checked in the memory of one. The packing
// itself is src/archive/pack-folder.ts; this file says which parts, which limits, and in which words.
import { packFolder, packFolderToBuffer, PackRefusal } from '../archive/pack-folder.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { printable } from '../errors/printable.ts';

/** What of a task folder goes into its archive: the fleet's format, then Harbor's (absent parts are skipped). */
export const TASK_PARTS = ['task.yaml', 'workspace', 'tests', 'solution', 'task.toml', 'instruction.md', 'environment', 'steps'] as const;

/** Task archives live in Redis; keep them small (images are for big environments). */
export const MAX_TASK_ARCHIVE_BYTES = 32 * 1024 * 1024;

/**
 * Files, folders and links one task archive may hold. Each takes a 512-byte header, so 32 MiB holds
 * at most 65,534 empty ones anyway; a tree of more than this is refused from its listing, before any
 * file is measured or read (a 100,000-file workspace/ in under a second, bench/pack-folder.ts), with
 * a message that names the folder and the cap rather than a size.
 */
export const MAX_TASK_ENTRIES = 50_000;

export interface PackedTask {
  /** sha256 of the archive bytes, hex. */
  digest: string;
  archive: Buffer;
}

const LIMITS = { maxBytes: MAX_TASK_ARCHIVE_BYTES, maxEntries: MAX_TASK_ENTRIES } as const;

function tooLarge(dir: string, size: number): FleetError {
  return new FleetError(
    'invalid_task',
    `${printable(dir)}: workspace/, tests/ and solution/ make a task archive larger than ${MAX_TASK_ARCHIVE_BYTES} bytes (at least ${size} bytes; put big files in the image)`,
  );
}

/** The packer's refusal in a task's words. */
function refused(dir: string, err: unknown): unknown {
  if (!(err instanceof PackRefusal)) return err;
  switch (err.kind) {
    case 'too_large':
      return tooLarge(dir, err.details.size ?? MAX_TASK_ARCHIVE_BYTES + 1);
    case 'too_many_entries':
      return new FleetError(
        'invalid_task',
        `${printable(dir)}: workspace/, tests/ and solution/ hold more than ${MAX_TASK_ENTRIES} entries (files, folders and links), the most a task archive may hold (put big trees in the image)`,
        { cause: err },
      );
    case 'special_file':
      return new FleetError('invalid_task', `${printable(err.details.path ?? dir)}: not a regular file, folder or symlink (a FIFO, socket or device cannot be packed)`, { cause: err });
    case 'changed':
    case 'unreadable':
      // A file changed, vanished or could not be read while it was packed.
      return new FleetError('invalid_task', `${printable(dir)}: cannot pack the task: ${printable(err.message)}`, { cause: err });
  }
}

/** Pack the task folder at `dir` (absolute). */
export async function packTask(dir: string): Promise<PackedTask> {
  try {
    const { digest, archive } = await packFolderToBuffer(dir, TASK_PARTS, LIMITS);
    return { digest, archive };
  } catch (err) {
    throw refused(dir, err);
  }
}

/** The digest packTask would give, without keeping the archive in memory. */
export async function digestTask(dir: string): Promise<string> {
  try {
    return (await packFolder(dir, TASK_PARTS, LIMITS)).digest;
  } catch (err) {
    throw refused(dir, err);
  }
}

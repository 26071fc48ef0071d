// The canonical manifest of a generation's inputs (path, mode, size, sha256 of each file, the format
// version), the generation id (the sha256 of that manifest: same inputs, same id; any changed byte,
// mode, path or format, a new id), and the archive plan that follows from it.
import { createHash } from 'node:crypto';
import type { FileDigest, PlannedEntry } from './archive-protocol.ts';
import type { RuntimeInput, RuntimeInputs, RuntimeMode } from './runtime-inputs.ts';

/**
 * Version of the archive layout (entry order, headers, folders, the launcher contract). Bump it when
 * the bytes an unchanged input set produces would change: every generation id changes with it.
 */
export const FORMAT_VERSION = 1;

export interface ManifestEntry {
  path: string;
  mode: RuntimeMode;
  size: number;
  /** Hex sha256 of the content. */
  sha256: string;
}

export interface RuntimeManifest {
  formatVersion: number;
  /** Sorted by path (UTF-16 code unit order; paths are ASCII, so byte order). */
  files: ManifestEntry[];
}

export interface HashedInputs {
  generationId: string;
  manifest: RuntimeManifest;
  /** Total bytes of the input files (not of the archive). */
  inputBytes: number;
  /** Stat identity of each host file when it was hashed, by runtime path (not part of the id). */
  identities: Record<string, string>;
}

const byPath = (a: { path: string }, b: { path: string }): number => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);

/** The manifest's canonical text: fixed key order, files sorted by path, no whitespace. */
export function canonicalManifest(manifest: RuntimeManifest): string {
  const files = [...manifest.files].sort(byPath).map(({ path, mode, size, sha256 }) => ({ path, mode, size, sha256 }));
  return JSON.stringify({ formatVersion: manifest.formatVersion, files });
}

/** Combine the inputs with their digests (same order) into the manifest and the generation id. */
export function manifestOf(inputs: RuntimeInputs, digests: readonly FileDigest[]): HashedInputs {
  if (digests.length !== inputs.length) throw new TypeError(`expected ${inputs.length} digests, got ${digests.length}`);
  const files = inputs
    .map((input, i) => ({ path: input.path, mode: input.mode, size: digests[i]!.size, sha256: digests[i]!.sha256 }))
    .sort(byPath);
  const manifest = { formatVersion: FORMAT_VERSION, files };
  const identities: Record<string, string> = {};
  inputs.forEach((input, i) => {
    const identity = digests[i]!.identity;
    if (identity !== undefined) identities[input.path] = identity;
  });
  // A few hundred bytes of text: hashing it on the main thread costs microseconds.
  const generationId = createHash('sha256').update(canonicalManifest(manifest)).digest('hex');
  return { generationId, manifest, inputBytes: files.reduce((sum, f) => sum + f.size, 0), identities };
}

/**
 * Every entry of the archive, in order: sorted paths, each folder (0755) before what it holds (its
 * path is a prefix of theirs), files with their manifest mode, size and sha256, host files with the
 * stat identity they had when hashed.
 */
export function archivePlan(inputs: RuntimeInputs, hashed: HashedInputs): PlannedEntry[] {
  const { manifest } = hashed;
  const byInputPath = new Map<string, RuntimeInput>(inputs.map((i) => [i.path, i]));
  const dirs = new Set<string>();
  for (const f of manifest.files) {
    const parts = f.path.split('/');
    for (let n = 1; n < parts.length; n++) dirs.add(parts.slice(0, n).join('/'));
  }
  const entries: Array<{ path: string; entry: PlannedEntry }> = [...dirs].map((path) => ({
    path,
    entry: { type: 'directory', name: path, mode: 0o755 },
  }));
  for (const f of manifest.files) {
    const input = byInputPath.get(f.path);
    if (input === undefined) throw new TypeError(`manifest file ${f.path} is not among the inputs`);
    const from = 'source' in input ? { source: input.source, identity: hashed.identities[f.path] } : { content: input.content };
    entries.push({ path: f.path, entry: { type: 'file', name: f.path, mode: f.mode, size: f.size, sha256: f.sha256, ...from } });
  }
  return entries.sort(byPath).map((e) => e.entry);
}

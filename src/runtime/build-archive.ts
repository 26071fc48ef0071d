// Hash a generation's inputs and stream its deterministic archive. Both run in the builder thread
// (build-off-thread.ts) by default; `onMainThread` runs the very same code here, for comparisons.
import { PassThrough } from 'node:stream';
import { FleetError } from '../errors/fleet-error.ts';
import { hashFiles, writeArchive } from './archive-ops.ts';
import type { FileSource } from './archive-protocol.ts';
import type { UploadTarget } from '../sandbox/archive-upload.ts';
import type { ArchiveSummary } from './archive-protocol.ts';
import { archiveOffThread, hashFilesOffThread, uploadOffThread, type ArchiveStream } from './build-off-thread.ts';
import { checkRuntimeInputs, type RuntimeInputs } from './runtime-inputs.ts';
import { archivePlan, manifestOf, type HashedInputs } from './runtime-manifest.ts';

export interface BuildOptions {
  /** Run on this thread instead of the builder thread (benchmarks and tests only). @default false */
  onMainThread?: boolean;
}

export interface ArchiveOptions extends BuildOptions {
  /** Also compute the archive's sha256 (an extra pass over every byte; tests and benchmarks). @default false */
  digest?: boolean;
}

/** Read every input once: the manifest and the generation id. */
export async function hashRuntimeInputs(inputs: RuntimeInputs, opts: BuildOptions = {}): Promise<HashedInputs> {
  checkRuntimeInputs(inputs);
  const files: FileSource[] = inputs.map((i) => ('source' in i ? { source: i.source } : { content: i.content }));
  try {
    const digests = opts.onMainThread ? await hashFiles(files) : await hashFilesOffThread(files);
    return manifestOf(inputs, digests);
  } catch (err) {
    if (err instanceof FleetError) throw err;
    throw new FleetError('runtime_unavailable', `runtime inputs: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * The generation's tar, streamed: entries sorted, folders 0755, files 0644 or 0755, all root's, mtime 0.
 * A host file whose stat identity changed since hashing, or whose size differs, fails the stream
 * rather than ship bytes that do not match the generation id.
 */
export function runtimeArchive(inputs: RuntimeInputs, hashed: HashedInputs, opts: ArchiveOptions = {}): ArchiveStream {
  const plan = archivePlan(inputs, hashed);
  const digest = opts.digest ?? false;
  if (!opts.onMainThread) return archiveOffThread(plan, digest);
  const stream = new PassThrough({ highWaterMark: 4 * 1024 * 1024 });
  const summary = writeArchive(plan, stream, { digest }).catch((err: unknown) => {
    const error = new FleetError('runtime_unavailable', `runtime builder: ${(err as Error).message}`, { cause: err });
    stream.destroy(error);
    throw error;
  });
  summary.catch(() => undefined);
  return { stream, summary };
}

/**
 * Build the generation's archive in the builder thread and stream it from there straight into
 * `target` (a container path), the way `tar -c | docker cp -` would: the bytes never pass through this
 * thread. Same layout and checks as runtimeArchive. Aborting `signal` stops the build and the upload.
 */
export function uploadRuntimeArchive(inputs: RuntimeInputs, hashed: HashedInputs, target: UploadTarget, signal: AbortSignal): Promise<ArchiveSummary> {
  return uploadOffThread(archivePlan(inputs, hashed), target, signal);
}

// Hash a generation's inputs and stream its deterministic archive. Both run in the builder thread
// (build-off-thread.ts) by default; `onMainThread` runs the very same code here, for comparisons.
import { PassThrough } from 'node:stream';
import { FleetError } from '../errors/fleet-error.ts';
import { hashFiles, writeArchive } from './archive-ops.js';
import type { FileSource } from './archive-protocol.ts';
import { archiveOffThread, hashFilesOffThread, type ArchiveStream } from './build-off-thread.ts';
import { checkRuntimeInputs, type RuntimeInputs } from './runtime-inputs.ts';
import { archivePlan, manifestOf, type HashedInputs, type RuntimeManifest } from './runtime-manifest.ts';

export interface BuildOptions {
  /** Run on this thread instead of the builder thread (benchmarks and tests only). @default false */
  onMainThread?: boolean;
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
 * Each file is checked against the manifest as it streams: an input changed since hashing fails the
 * stream rather than ship bytes that do not match the generation id.
 */
export function runtimeArchive(inputs: RuntimeInputs, manifest: RuntimeManifest, opts: BuildOptions = {}): ArchiveStream {
  const plan = archivePlan(inputs, manifest);
  if (!opts.onMainThread) return archiveOffThread(plan);
  const stream = new PassThrough({ highWaterMark: 4 * 1024 * 1024 });
  const summary = writeArchive(plan, stream).catch((err: unknown) => {
    const error = new FleetError('runtime_unavailable', `runtime builder: ${(err as Error).message}`, { cause: err });
    stream.destroy(error);
    throw error;
  });
  summary.catch(() => undefined);
  return { stream, summary };
}

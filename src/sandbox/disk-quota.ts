// Whether the engine can cap a sandbox's writable layer itself (StorageOpt size: overlay2 on xfs with
// pquota, devicemapper, ...). Learnt once per engine from its answer to the first sandbox that asks:
// an engine that refuses is remembered and asked no more; the caller then watches the layer instead.
import type Docker from 'dockerode';
import { FleetError } from '../errors/fleet-error.ts';
import { dockerStatusOf } from './docker-client.ts';

/** Engines (by client) that refused StorageOpt size. */
const refused = new WeakSet<Docker>();

/** The StorageOpt to ask for, or undefined when this engine is known to refuse it. */
export function createDiskQuota(docker: Docker, diskMb: number): Record<string, string> | undefined {
  return refused.has(docker) ? undefined : { size: `${diskMb}M` };
}

/**
 * Whether `err` (from creating a container with a StorageOpt) is the engine saying it cannot enforce
 * one, e.g. "--storage-opt is supported only for overlay over xfs with 'pquota' mount option".
 * Remembered for the engine; any other error is not about the quota.
 */
export function diskQuotaRefused(docker: Docker, err: unknown): boolean {
  const status = dockerStatusOf(err);
  const message = err instanceof FleetError ? err.message : String((err as { message?: unknown } | undefined)?.message ?? err);
  const isRefusal = (status === 400 || status === 500) && /storage-?opt|quota|storage option|size option/i.test(message);
  if (isRefusal) refused.add(docker);
  return isRefusal;
}

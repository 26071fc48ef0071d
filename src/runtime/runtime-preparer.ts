// A worker's runtime generation on demand: its inputs (the portable node, its libraries, the extra
// files such as the bundled sandbox programs) are gathered once per process and kept, a failed
// gathering is tried again on the next call; the generation last prepared is remembered for the host facts.
import path from 'node:path';
import { prepareRuntime, type RuntimeDeps, type RuntimeGeneration } from './prepare-runtime.ts';
import { defaultRuntimeInputs, type ExtraFile, type RuntimeInputs } from './runtime-inputs.ts';

export interface RuntimePreparerOptions extends RuntimeDeps {
  /** The worker's data folder: the runtime's sources are cached in its `runtime-src`. */
  dataDir: string;
  /**
   * The extra files every generation carries, put under the cache folder given (the worker passes the
   * sandbox programs: the runtime does not know the agents it carries).
   */
  extraFiles: (cacheDir: string) => Promise<ExtraFile[]>;
  /**
   * Where the patched node binary is cached (FLEET_RUNTIME_CACHE), shared by every data folder that
   * names it. @default the data folder's `runtime-src`
   */
  runtimeCacheDir?: string;
  /** Deadline of each Docker call of a preparation. */
  callTimeoutMs: number;
}

export interface RuntimePreparer {
  /** Reuse or install the runtime generation (EpisodeDeps.prepareRuntime); `signal` stops the wait. */
  prepare(signal?: AbortSignal): Promise<RuntimeGeneration>;
  /** The id of the generation last prepared; undefined before the first. */
  generation(): string | undefined;
}

export function runtimePreparer(opts: RuntimePreparerOptions): RuntimePreparer {
  const { docker, redis, prefix, log, callTimeoutMs } = opts;
  const deps: RuntimeDeps = { docker, redis, prefix, log, ...(opts.volumeScope !== undefined && { volumeScope: opts.volumeScope }) };
  const cacheDir = path.join(opts.dataDir, 'runtime-src');
  // The sandbox programs stay in the data folder (small, bundled per build); the ~95 MB node copy may be shared.
  const nodeCacheDir = opts.runtimeCacheDir ?? cacheDir;
  let inputs: Promise<RuntimeInputs> | undefined;
  const runtimeInputs = () => {
    inputs ??= (async () => defaultRuntimeInputs(await opts.extraFiles(cacheDir), { cacheDir: nodeCacheDir }))();
    inputs.catch(() => (inputs = undefined));
    return inputs;
  };
  let generation: string | undefined;
  return {
    prepare: async (signal) => {
      const prepared = await prepareRuntime(deps, await runtimeInputs(), { callTimeoutMs, ...(signal && { signal }) });
      generation = prepared.generationId;
      return prepared;
    },
    generation: () => generation,
  };
}

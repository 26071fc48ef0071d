// The programs the runtime generation carries into every sandbox, each bundled (with what it imports)
// into one ESM file run by the runtime's node: the reference agent, the model forwarder that gives
// any agent a loopback address for the model, and the end of the agent's turn (sweep's successor:
// the workspace out, the tests in, the verifier; src/sandbox/end-of-turn/); beside them the keep-alive
// of Harbor sandboxes (src/sandbox/keep-alive.ts). A bundle is deterministic and named by its hash,
// published once and never rewritten, so an unchanged program keeps its file identity and the runtime
// generation is not rebuilt.
import { createHash } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { build } from 'esbuild';
import { exists, publishOnce } from '../files/atomic-write.ts';
import { PACKAGE_ROOT, siblingModule } from '../package-paths.ts';
import type { ExtraFile } from '../runtime/runtime-inputs.ts';
import { KEEP_ALIVE_PATH, keepAliveProgram } from '../sandbox/keep-alive.ts';
import { END_OF_TURN_PATH } from '../sandbox/end-of-turn/end-of-turn.ts';

/** Where the bundled reference agent sits inside the runtime generation. */
export const REFERENCE_AGENT_PATH = 'agent/reference-agent.mjs';
/** Where the model forwarder sits inside the runtime generation. */
export const MODEL_FORWARDER_PATH = 'agent/model-forwarder.mjs';

// Each from its TypeScript source, or its compiled .js under dist/ (a different bundle, so a different generation).
// The end of the turn is CommonJS: node starts it about 5-10 ms sooner than an ES module (on every
// episode's path, in a sandbox of half a CPU), and its dependencies' require needs no banner.
const PROGRAMS = [
  { entry: siblingModule(import.meta.url, 'reference/agent-main'), name: 'reference-agent', path: REFERENCE_AGENT_PATH, format: 'esm' },
  { entry: siblingModule(import.meta.url, 'gateway/forwarder-main'), name: 'model-forwarder', path: MODEL_FORWARDER_PATH, format: 'esm' },
  { entry: siblingModule(import.meta.url, '../sandbox/end-of-turn/end-of-turn-main'), name: 'end-of-turn', path: END_OF_TURN_PATH, format: 'cjs' },
] as const;

/** Bundle `entry` into `dir` as <name>-<hash>.mjs or .cjs (once) and return its path. */
async function bundle(entry: string, name: string, dir: string, format: 'esm' | 'cjs'): Promise<string> {
  const result = await build({
    entryPoints: [entry],
    // Paths in the bundle's comments are relative to this, so the bytes do not depend on the cwd.
    absWorkingDir: PACKAGE_ROOT,
    bundle: true,
    platform: 'node',
    format,
    target: 'node20',
    write: false,
    legalComments: 'none',
    // CommonJS dependencies (tar-stream's streamx) require node's builtins: an ESM bundle has no require of its own.
    ...(format === 'esm' && { banner: { js: "import { createRequire as __rfCreateRequire } from 'node:module'; const require = __rfCreateRequire(import.meta.url);" } }),
    logLevel: 'silent',
  });
  const bytes = result.outputFiles[0]?.contents;
  if (bytes === undefined) throw new Error(`esbuild produced no output for ${name}`);
  return publish(bytes, name, dir, format === 'esm' ? '.mjs' : '.cjs');
}

/** Write `bytes` into `dir` as <name>-<hash> (once) and return its path. */
async function publish(bytes: Uint8Array, name: string, dir: string, extension: string): Promise<string> {
  const outFile = path.join(dir, `${name}-${createHash('sha256').update(bytes).digest('hex').slice(0, 16)}${extension}`);
  if (await exists(outFile)) return outFile;
  await mkdir(dir, { recursive: true });
  const tmp = `${outFile}.${process.pid}.${Date.now()}.tmp`;
  await writeFile(tmp, bytes);
  await publishOnce(tmp, outFile);
  return outFile;
}

/** Every sandbox program bundled into `dir`, and the keep-alive, as extra files of the runtime generation. */
export async function sandboxPrograms(dir: string): Promise<ExtraFile[]> {
  const bundles = await Promise.all(PROGRAMS.map(async (p) => ({ source: await bundle(p.entry, p.name, dir, p.format), path: p.path, mode: 0o644 as const })));
  return [...bundles, { source: await publish(keepAliveProgram(), 'keep-alive', dir, ''), path: KEEP_ALIVE_PATH, mode: 0o755 }];
}

// Bundles the reference agent (agent-main.ts and what it imports) into one ESM file for the runtime
// generation. The bundle is deterministic; the file is rewritten only when its bytes change, so an
// unchanged agent keeps its file identity and the runtime generation is not re-hashed or rebuilt.
import { mkdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
import { writeFileAtomic } from '../../results/atomic-write.ts';

const ENTRY = fileURLToPath(new URL('./agent-main.ts', import.meta.url));
/** Paths in the bundle's comments are relative to this, so the bytes do not depend on the cwd. */
const REPO_ROOT = fileURLToPath(new URL('../../..', import.meta.url));

/** Write the bundle to `outFile` (if it changed) and return its path. */
export async function bundleReferenceAgent(outFile: string): Promise<string> {
  const result = await build({
    entryPoints: [ENTRY],
    absWorkingDir: REPO_ROOT,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    write: false,
    legalComments: 'none',
    logLevel: 'silent',
  });
  const bytes = result.outputFiles[0]?.contents;
  if (bytes === undefined) throw new Error('esbuild produced no output for the reference agent');
  const current = await readFile(outFile).catch(() => undefined);
  if (current === undefined || !current.equals(bytes)) {
    await mkdir(path.dirname(outFile), { recursive: true });
    await writeFileAtomic(outFile, bytes);
  }
  return outFile;
}

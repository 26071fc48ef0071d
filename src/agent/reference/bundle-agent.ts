// Bundles the reference agent (agent-main.ts and what it imports) into one ESM file for the runtime
// generation. The bundle is deterministic and named by its hash, published once and never rewritten,
// so an unchanged agent keeps its file identity and the runtime generation is not rebuilt.
import { createHash } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { build } from 'esbuild';
import { exists, publishOnce } from '../../files/atomic-write.ts';
import { PACKAGE_ROOT, siblingModule } from '../../package-paths.ts';

/** agent-main.ts from the sources, its compiled agent-main.js from dist/ (a different bundle, so a different generation). */
const ENTRY = siblingModule(import.meta.url, 'agent-main');

/** Write the bundle into `dir` as reference-agent-<hash>.mjs (once) and return its path. */
export async function bundleReferenceAgent(dir: string): Promise<string> {
  const result = await build({
    entryPoints: [ENTRY],
    // Paths in the bundle's comments are relative to this, so the bytes do not depend on the cwd.
    absWorkingDir: PACKAGE_ROOT,
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
  const outFile = path.join(dir, `reference-agent-${createHash('sha256').update(bytes).digest('hex').slice(0, 16)}.mjs`);
  if (await exists(outFile)) return outFile;
  await mkdir(dir, { recursive: true });
  const tmp = `${outFile}.${process.pid}.${Date.now()}.tmp`;
  await writeFile(tmp, bytes);
  await publishOnce(tmp, outFile);
  return outFile;
}

// vitest global set-up: brings dist/ up to date before any test runs, because tests that start the
// CLI as a process (workers, the checkpoint writer, the model stub, the CLI tests) run the compiled
// bin, as users do. The build is incremental: about a second when nothing changed.
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export default function buildDist(): void {
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  execFileSync(process.execPath, [tsc, '-p', path.join(ROOT, 'tsconfig.build.json')], { cwd: ROOT, stdio: 'inherit' });
}

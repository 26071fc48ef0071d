// vitest global set-up: brings dist/ up to date before any test runs, because tests that start the
// CLI as a process (workers, the checkpoint writer, the model stub, the CLI tests) run the compiled
// bin, as users do. It runs package.json's build, the one definition of dist/ (tsc, then the Redis
// scripts copied beside the compiled modules). The build is incremental: about a second when nothing
// changed.
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export default function buildDist(): void {
  execFileSync('npm', ['run', '--silent', 'build'], { cwd: ROOT, stdio: 'inherit' });
}

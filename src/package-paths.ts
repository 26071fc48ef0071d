// Where this package's own files are, whether it runs compiled (dist/src/..., the bin, the Docker
// image) or from its TypeScript sources (tsx, vitest). Code that spawns one of its own modules, or
// reads a file of the package, resolves it here instead of counting `../` from its own location,
// which differs by one level between the two.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker, type WorkerOptions } from 'node:worker_threads';

function findPackageRoot(from: string): string {
  for (let dir = from; ; dir = path.dirname(dir)) {
    if (existsSync(path.join(dir, 'package.json'))) return dir;
    if (path.dirname(dir) === dir) throw new Error(`no package.json above ${from}`);
  }
}

/** The folder holding package.json, examples/ and (once built) dist/. */
export const PACKAGE_ROOT = findPackageRoot(path.dirname(fileURLToPath(import.meta.url)));

/**
 * The module `baseName` next to the module of `importMetaUrl`, with that module's own extension:
 * `.ts` beside a source file, `.js` beside its compiled output.
 */
export function siblingModule(importMetaUrl: string, baseName: string): string {
  const here = fileURLToPath(importMetaUrl);
  return path.join(path.dirname(here), `${baseName}${path.extname(here)}`);
}

/**
 * The node flags a new process needs to run `entry`: none for compiled JavaScript; for a TypeScript
 * source (development and tests only), the tsx loader, resolved from this package so the flag works
 * whatever the child's working folder.
 */
export function execArgvFor(entry: string): string[] {
  if (path.extname(entry) !== '.ts') return [];
  return ['--import', pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href];
}

/**
 * A worker thread running `entry`, started without the parent's flags. Compiled JavaScript starts as
 * it is. A TypeScript source (tests, benchmarks through tsx) is loaded through tsx's require hook,
 * because Node 20 does not apply `--import tsx` loader hooks inside a worker thread; that costs about
 * 0.3 s per thread start, which only development pays.
 */
export function startThread(entry: string, options: Omit<WorkerOptions, 'eval' | 'execArgv'>): Worker {
  if (path.extname(entry) !== '.ts') return new Worker(entry, { ...options, execArgv: [] });
  const tsxApi = createRequire(import.meta.url).resolve('tsx/cjs/api');
  const boot = `require(${JSON.stringify(tsxApi)}).require(${JSON.stringify(entry)}, ${JSON.stringify(entry)});`;
  return new Worker(boot, { ...options, eval: true, execArgv: [] });
}

// The file-level import graph of the repository's own code, read with the TypeScript parser (not a
// regex, so multi-line and type-only imports are all seen), and the cycles in it. Used by the
// import-cycles test; runnable on its own to print file and folder cycles:
// `npx tsx test/helpers/import-graph.ts`.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

export const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** Repository-relative path (with `/`) -> the repository-relative files it imports. */
export type ImportGraph = Map<string, string[]>;

const SOURCE = /\.(ts|js)$/;

function listSources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const full = path.join(dir, name);
    if (statSync(full).isDirectory()) return listSources(full);
    return SOURCE.test(name) && !name.endsWith('.d.ts') ? [full] : [];
  });
}

export interface ImportSpecifier {
  specifier: string;
  /** A lazy `import('...')`, evaluated when that code runs, after every module has loaded. */
  dynamic: boolean;
}

/**
 * Every module specifier of a file: static imports and re-exports (type-only ones included: a type
 * cycle is still a design cycle) and dynamic `import('...')` with a literal argument.
 */
export function importSpecifiers(file: string, text: string): ImportSpecifier[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, false);
  const found: ImportSpecifier[] = [];
  const visit = (node: ts.Node): void => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      found.push({ specifier: node.moduleSpecifier.text, dynamic: false });
    } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
      const [arg] = node.arguments;
      if (arg && ts.isStringLiteralLike(arg)) found.push({ specifier: arg.text, dynamic: true });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

export interface ImportGraphOptions {
  /**
   * Count lazy `import('...')` as edges too. Off by default: a cycle through a lazy import cannot meet
   * a half-initialised module (the CLI's command table loads each command that way, and the command
   * reads its options back from the table).
   * @default false
   */
  dynamic?: boolean;
}

/** The graph of the sources under `roots` (repository-relative folders); only relative imports are edges. */
export function importGraph(roots: readonly string[], opts: ImportGraphOptions = {}): ImportGraph {
  const graph: ImportGraph = new Map();
  for (const root of roots) {
    for (const full of listSources(path.join(REPO_ROOT, root))) {
      const from = path.relative(REPO_ROOT, full).split(path.sep).join('/');
      const targets = importSpecifiers(full, readFileSync(full, 'utf8'))
        .filter(({ specifier, dynamic }) => specifier.startsWith('.') && (opts.dynamic === true || !dynamic))
        .map(({ specifier }) => path.posix.normalize(path.posix.join(path.posix.dirname(from), specifier)));
      graph.set(from, [...new Set(targets)]);
    }
  }
  return graph;
}

/**
 * One cycle per back edge of a depth-first search: empty exactly when the graph has no cycle (not
 * every elementary cycle is listed, but fixing those listed and running again finds the rest). Each
 * is a path that starts and ends at the same node, rotated to start at its smallest node, so a cycle
 * reads the same whichever node the search entered it by.
 */
export function findCycles(graph: ReadonlyMap<string, readonly string[]>): string[][] {
  const cycles = new Map<string, string[]>();
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (node: string): void => {
    state.set(node, 'open');
    stack.push(node);
    for (const next of graph.get(node) ?? []) {
      if (!graph.has(next)) continue;
      const seen = state.get(next);
      if (seen === 'open') {
        const loop = stack.slice(stack.indexOf(next));
        const start = loop.indexOf([...loop].sort()[0]!);
        const rotated = [...loop.slice(start), ...loop.slice(0, start)];
        cycles.set(rotated.join(' -> '), [...rotated, rotated[0]!]);
      } else if (seen === undefined) {
        visit(next);
      }
    }
    stack.pop();
    state.set(node, 'done');
  };
  for (const node of [...graph.keys()].sort()) if (!state.has(node)) visit(node);
  return [...cycles.values()];
}

/**
 * The folder of a file (`src/cli/main.ts` -> `src/cli`). A queue's contract and processor count as two
 * (`queues/episodes/contract`): domain code is meant to use contracts and be used by processors.
 */
export const folderOf = (file: string): string => {
  const parts = file.split('/');
  return parts[0] === 'queues' ? `queues/${parts[1]}/${path.posix.basename(file).replace(/\.[jt]s$/, '')}` : parts.slice(0, 2).join('/');
};

/** The graph collapsed to folders; an import within one folder is no edge. */
export function folderGraph(graph: ImportGraph): Map<string, string[]> {
  const folders = new Map<string, Set<string>>();
  for (const [from, targets] of graph) {
    const f = folderOf(from);
    const out = folders.get(f) ?? new Set<string>();
    for (const t of targets) if (folderOf(t) !== f) out.add(folderOf(t));
    folders.set(f, out);
  }
  return new Map([...folders].map(([f, out]) => [f, [...out].sort()]));
}

// Run directly: print the file and folder cycles of src/ and queues/ (with --dynamic, lazy imports
// count too); with --edges, every import that crosses a folder (to see which files make a folder cycle).
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const graph = importGraph(['src', 'queues'], { dynamic: process.argv.includes('--dynamic') });
  const fileCycles = findCycles(graph);
  process.stdout.write(`file cycles: ${fileCycles.length}\n`);
  for (const c of fileCycles) process.stdout.write(`  ${c.join(' -> ')}\n`);
  const folderCycles = findCycles(folderGraph(graph));
  process.stdout.write(`folder cycles (DFS back edges): ${folderCycles.length}\n`);
  for (const c of folderCycles) process.stdout.write(`  ${c.join(' -> ')}\n`);
  if (process.argv.includes('--edges')) {
    for (const [from, targets] of graph) {
      for (const t of targets) if (folderOf(t) !== folderOf(from)) process.stdout.write(`  ${from} -> ${t}\n`);
    }
  }
}

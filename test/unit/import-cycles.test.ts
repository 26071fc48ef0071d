// The shape of the code, checked on every run: no file of src/ or queues/ reaches itself through its
// static imports (type-only ones included; lazy `import()` is not counted, see import-graph.ts), queue
// contracts only re-export their jobs' definitions from src/, and the layers below the composition root do not reach up into
// queue processors or contracts they must not know. A new cycle or a wrong-way import fails here,
// naming the files.
import { describe, expect, it } from 'vitest';
import { findCycles, folderGraph, importGraph } from '../helpers/import-graph.ts';

const graph = importGraph(['src', 'queues']);
const files = [...graph.keys()];
const importsOf = (file: string) => graph.get(file) ?? [];

/** Who may import queues/ (its processors above all): the worker, which wires processors to BullMQ workers, and the CLI. */
const mayImportQueues = (file: string) => file.startsWith('src/worker/') || file.startsWith('src/cli/');

describe('imports', () => {
  it('are all found and resolved (the checks below would be blind otherwise)', () => {
    expect(files.length).toBeGreaterThan(50);
    expect(files.filter((f) => f.startsWith('queues/') && f.endsWith('/contract.ts')).length).toBeGreaterThanOrEqual(4);
    const unresolved = files.flatMap((f) => importsOf(f).filter((t) => !graph.has(t)).map((t) => `${f} -> ${t}`));
    expect(unresolved).toEqual([]);
  });

  it('form no cycle between files of src/ and queues/', () => {
    expect(findCycles(graph).map((c) => c.join(' -> '))).toEqual([]);
  });

  it('form no cycle between folders (a queue contract and its processor counted apart)', () => {
    expect(findCycles(folderGraph(graph)).map((c) => c.join(' -> '))).toEqual([]);
  });

  it('of a queue contract only re-export the definition of its job from src/', () => {
    const wrong = files
      .filter((f) => /^queues\/[^/]+\/contract\.ts$/.test(f))
      .flatMap((contract) => importsOf(contract).filter((t) => !/^src\/[^/]+\/[a-z-]+-job\.ts$/.test(t)).map((t) => `${contract} -> ${t}`));
    expect(wrong).toEqual([]);
  });

  it('of queues/ come, in src/, only from the worker (the composition of processors) and the CLI', () => {
    const wrong = files
      .filter((f) => f.startsWith('src/') && !mayImportQueues(f))
      .flatMap((f) => importsOf(f).filter((t) => t.startsWith('queues/')).map((t) => `${f} -> ${t}`));
    expect(wrong).toEqual([]);
  });

  it('of the CLI come from nowhere in src/ but the CLI itself', () => {
    const wrong = files
      .filter((f) => f.startsWith('src/') && !f.startsWith('src/cli/'))
      .flatMap((f) => importsOf(f).filter((t) => t.startsWith('src/cli/')).map((t) => `${f} -> ${t}`));
    expect(wrong).toEqual([]);
  });

  it('of config never reach into queues/', () => {
    const wrong = files.filter((f) => f.startsWith('src/config/')).flatMap((f) => importsOf(f).filter((t) => t.startsWith('queues/')).map((t) => `${f} -> ${t}`));
    expect(wrong).toEqual([]);
  });

  it('of a queue processor come only from the composition root', () => {
    const wrong = files
      .filter((f) => f.startsWith('src/') && !mayImportQueues(f))
      .flatMap((f) => importsOf(f).filter((t) => /^queues\/[^/]+\/processor\.ts$/.test(t)).map((t) => `${f} -> ${t}`));
    expect(wrong).toEqual([]);
  });
});

describe('findCycles', () => {
  it('finds a cycle however the search enters it, and none in a graph without one', () => {
    const cyclic = new Map([['a', ['b']], ['b', ['c']], ['c', ['a', 'd']], ['d', []]]);
    expect(findCycles(cyclic)).toEqual([['a', 'b', 'c', 'a']]);
    const entered = new Map([['x', ['c']], ['c', ['a']], ['a', ['b']], ['b', ['c']]]);
    expect(findCycles(entered)).toEqual([['a', 'b', 'c', 'a']]);
    expect(findCycles(new Map([['a', ['b', 'c']], ['b', ['c']], ['c', []]]))).toEqual([]);
  });
});

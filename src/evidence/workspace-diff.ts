// The workspace diff against the initial workspace: what the agent changed, as a unified diff of text
// files plus a list of added, removed and modified paths. Reads only what safe extraction kept.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { createTwoFilesPatch } from 'diff';
import type { ExtractReport } from './safe-extract.ts';

export interface WorkspaceChanges {
  added: string[];
  removed: string[];
  modified: string[];
  /** Unified diff of text files; binary or truncated files are named, not diffed. */
  diff: string;
}

const isText = (b: Buffer) => !b.subarray(0, 8192).includes(0);

export async function diffWorkspace(initial: Map<string, Buffer>, finalDir: string, report: ExtractReport, maxDiffBytes: number): Promise<WorkspaceChanges> {
  const changes: WorkspaceChanges = { added: [], removed: [], modified: [], diff: '' };
  const parts: string[] = [];
  const finals = new Map(report.files.map((f) => [f.path, f]));
  const notCaptured = new Set(report.skipped.map((s) => s.path));
  const paths = [...new Set([...initial.keys(), ...finals.keys(), ...notCaptured])].sort();
  for (const p of paths) {
    const before = initial.get(p);
    const kept = finals.get(p);
    const after = kept === undefined ? undefined : await readFile(path.join(finalDir, p));
    if (before !== undefined && after !== undefined && kept!.size === kept!.keptBytes && before.equals(after)) continue;
    if (kept === undefined && notCaptured.has(p)) {
      parts.push(`File ${p} was not captured (see the extraction report)\n`);
      continue;
    }
    if (before === undefined) changes.added.push(p);
    else if (after === undefined) changes.removed.push(p);
    else changes.modified.push(p);
    if (kept !== undefined && kept.size > kept.keptBytes) parts.push(`File ${p} is too large to diff (${kept.size} bytes)\n`);
    else if ((before && !isText(before)) || (after && !isText(after))) parts.push(`Binary file ${p} differs\n`);
    else parts.push(createTwoFilesPatch(`a/${p}`, `b/${p}`, before?.toString('utf8') ?? '', after?.toString('utf8') ?? ''));
  }
  const text = parts.join('');
  changes.diff = text.length > maxDiffBytes ? `${text.slice(0, maxDiffBytes)}\n[... diff cut at ${maxDiffBytes} bytes ...]\n` : text;
  return changes;
}

// The workspace as the agent left it, kept in the attempt's evidence folder (`workspace/`): extracted
// from a tar of the workdir as hostile input, under the snapshot's caps. Verify keeps the sweep's copy
// early with it; close keeps the engine's copy with it when there was none.
import { rm } from 'node:fs/promises';
import path from 'node:path';
import { Readable } from 'node:stream';
import type { Logger } from 'pino';
import type { EvidenceStore } from './evidence-store.ts';
import { extractSafely, type ExtractLimits, type ExtractReport } from './safe-extract.ts';

export interface WorkspaceCopyDeps {
  evidence: EvidenceStore;
  /** Caps of the workspace snapshot kept as evidence. */
  snapshotLimits: ExtractLimits;
  log: Logger;
}

/** The attempt whose evidence the copy belongs to. */
export interface AttemptRef {
  episodeId: string;
  attempt: number;
}

export const workspaceFolder = (deps: Pick<WorkspaceCopyDeps, 'evidence'>, of: AttemptRef) => path.join(deps.evidence.folder(of.episodeId, of.attempt), 'workspace');

/** Extracts a tar of the workdir (named as getArchive names it) into the attempt's evidence, as hostile. */
export async function keepWorkspace(deps: Omit<WorkspaceCopyDeps, 'log'>, of: AttemptRef, tar: Readable, stop?: AbortSignal): Promise<ExtractReport> {
  return extractSafely(tar, workspaceFolder(deps, of), { ...deps.snapshotLimits, strip: 1 }, stop);
}

/**
 * A Harbor task's /logs (the agent's, the verifier's and the published artifacts: test-stdout.txt,
 * oracle.txt, reward files), kept in the attempt's evidence as `logs/`, under the snapshot's caps.
 */
export async function keepHarborLogs(deps: Omit<WorkspaceCopyDeps, 'log'>, of: AttemptRef, tar: Readable, stop?: AbortSignal): Promise<ExtractReport> {
  return extractSafely(tar, path.join(deps.evidence.folder(of.episodeId, of.attempt), 'logs'), { ...deps.snapshotLimits, strip: 1 }, stop);
}

/**
 * /logs as the end-of-turn exec copied it after the verifier, kept as keepHarborLogs keeps the engine's
 * copy. Undefined when it could not be kept: its folder is emptied for the engine's copy.
 */
export function keepHarborLogsEarly(deps: WorkspaceCopyDeps, of: AttemptRef, tar: Buffer): Promise<ExtractReport | undefined> {
  return keepHarborLogs(deps, of, Readable.from([tar])).catch(async (err: unknown) => {
    deps.log.warn({ err: String(err) }, 'the end of the turn\'s copy of /logs could not be kept; close asks the engine');
    await rm(path.join(deps.evidence.folder(of.episodeId, of.attempt), 'logs'), { recursive: true, force: true });
    return undefined;
  });
}

/**
 * The sweep's copy of the workspace, extracted while the verifier runs (so its bytes are not held
 * until close). Undefined when it could not be kept: its folder is emptied for the engine's copy.
 */
export function keepWorkspaceEarly(deps: WorkspaceCopyDeps, of: AttemptRef, tar: Buffer): Promise<ExtractReport | undefined> {
  return keepWorkspace(deps, of, Readable.from([tar])).catch(async (err: unknown) => {
    deps.log.warn({ err: String(err) }, 'the sweep\'s workspace copy could not be kept; close asks the engine');
    await rm(workspaceFolder(deps, of), { recursive: true, force: true });
    return undefined;
  });
}

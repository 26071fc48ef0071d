// Evidence of one episode attempt, kept before anything is removed: the agent's and the verifier's
// captured output and the container's final state, under FLEET_DATA_DIR/evidence/<episode>/attempt-<n>/.
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { writeFileAtomic } from '../files/atomic-write.ts';
import type { CapturedOutput } from '../sandbox/captured-output.ts';

export class EvidenceStore {
  constructor(private readonly dataDir: string) {}

  folder(episodeId: string, attempt: number): string {
    return path.join(this.dataDir, 'evidence', episodeId, `attempt-${attempt}`);
  }

  /**
   * The lowest attempt number from `atLeast` up that no attempt folder of the episode on this host
   * uses: for an attempt that could not be numbered by Redis, so it never overwrites another's evidence.
   */
  async unusedAttempt(episodeId: string, atLeast: number): Promise<number> {
    const names = await readdir(path.join(this.dataDir, 'evidence', episodeId)).catch(() => [] as string[]);
    const used = names.map((n) => /^attempt-(\d+)$/.exec(n)?.[1]).filter((n) => n !== undefined).map(Number);
    return Math.max(atLeast, ...used.map((n) => n + 1));
  }

  /** Where the reaper puts what it saved of an orphaned sandbox. */
  salvageFolder(episodeId: string, containerId: string): string {
    return path.join(this.dataDir, 'evidence', episodeId, `salvaged-${containerId.slice(0, 12)}`);
  }

  /** Write captured output as `<name>.stdout.txt` / `<name>.stderr.txt`, truncation noted in the file. */
  async writeOutput(episodeId: string, attempt: number, name: string, out: { stdout: CapturedOutput; stderr: CapturedOutput }): Promise<void> {
    const dir = this.folder(episodeId, attempt);
    await Promise.all(
      (['stdout', 'stderr'] as const).map((stream) => writeFileAtomic(path.join(dir, `${name}.${stream}.txt`), out[stream].text)),
    );
  }

  async writeText(episodeId: string, attempt: number, name: string, text: string): Promise<void> {
    await writeFileAtomic(path.join(this.folder(episodeId, attempt), name), text);
  }

  async writeJson(episodeId: string, attempt: number, name: string, value: unknown): Promise<void> {
    await writeFileAtomic(path.join(this.folder(episodeId, attempt), `${name}.json`), `${JSON.stringify(value, null, 2)}\n`);
  }
}

// Durable checkpoints on disk: FLEET_DATA_DIR/checkpoints/<episode>/<seq>.json written atomically,
// plus latest.json pointing at the highest seq; the last `keep` checkpoints are kept.
import { readFile, readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { writeFileAtomic } from '../results/atomic-write.ts';

const SEQ_FILE = /^(\d{8})\.json$/;

export class CheckpointStore {
  constructor(
    private readonly dataDir: string,
    private readonly keep = 5,
  ) {}

  folder(episodeId: string): string {
    return path.join(this.dataDir, 'checkpoints', episodeId);
  }

  /** Persist one checkpoint; returns its file and the seq latest.json now points at. */
  async write(episodeId: string, seq: number, body: unknown): Promise<{ file: string; latest: number }> {
    const dir = this.folder(episodeId);
    const file = path.join(dir, `${String(seq).padStart(8, '0')}.json`);
    await writeFileAtomic(file, JSON.stringify(body));
    const seqs = await this.seqs(episodeId);
    const latest = Math.max(...seqs);
    await writeFileAtomic(path.join(dir, 'latest.json'), JSON.stringify({ seq: latest }));
    await Promise.all(seqs.slice(0, Math.max(0, seqs.length - this.keep)).map((s) =>
      rm(path.join(dir, `${String(s).padStart(8, '0')}.json`), { force: true })));
    return { file, latest };
  }

  /** The latest durable checkpoint of an episode, or undefined. */
  async latest(episodeId: string): Promise<{ seq: number; body: unknown } | undefined> {
    const dir = this.folder(episodeId);
    const pointer = await readFile(path.join(dir, 'latest.json'), 'utf8').catch(() => undefined);
    if (pointer === undefined) return undefined;
    const { seq } = JSON.parse(pointer) as { seq: number };
    const body: unknown = JSON.parse(await readFile(path.join(dir, `${String(seq).padStart(8, '0')}.json`), 'utf8'));
    return { seq, body };
  }

  private async seqs(episodeId: string): Promise<number[]> {
    const names = await readdir(this.folder(episodeId)).catch(() => [] as string[]);
    return names.flatMap((n) => {
      const m = SEQ_FILE.exec(n);
      return m ? [Number(m[1])] : [];
    }).sort((a, b) => a - b);
  }
}

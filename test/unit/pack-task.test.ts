// Task archives are deterministic: same content, same bytes and digest; any content change, new digest.
import { cp, mkdtemp, utimes, writeFile, chmod } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { describe, expect, it } from 'vitest';
import { packTask } from '../../src/tasks/pack-task.ts';
import { TaskArchive } from '../../src/tasks/task-archive.ts';
import { EXAMPLES } from '../helpers/fleet.ts';

async function copyTask(name: string): Promise<string> {
  const dir = path.join(await mkdtemp(path.join(os.tmpdir(), 'rf-pack-')), name);
  await cp(path.join(EXAMPLES, 'tasks', name), dir, { recursive: true });
  return dir;
}

describe('packTask', () => {
  it('gives identical bytes for identical content, whatever the timestamps', async () => {
    const a = await copyTask('fix-greeting');
    const b = await copyTask('fix-greeting');
    await utimes(path.join(b, 'workspace', 'greet.sh'), new Date(2001, 1, 1), new Date(2001, 1, 1));
    const [pa, pb] = await Promise.all([packTask(a), packTask(b)]);
    expect(pa.digest).toMatch(/^[0-9a-f]{64}$/);
    expect(pb.digest).toBe(pa.digest);
    expect(Buffer.compare(pa.archive, pb.archive)).toBe(0);
  });

  it('changes the digest when a byte, a file or the executable bit changes', async () => {
    const dir = await copyTask('fix-greeting');
    const seen = new Set([(await packTask(dir)).digest]);
    await writeFile(path.join(dir, 'workspace', 'greet.sh'), 'echo "Hola, $1"\n');
    seen.add((await packTask(dir)).digest);
    await writeFile(path.join(dir, 'tests', 'extra.txt'), 'x');
    seen.add((await packTask(dir)).digest);
    await chmod(path.join(dir, 'tests', 'extra.txt'), 0o755);
    seen.add((await packTask(dir)).digest);
    expect(seen.size).toBe(4);
  });

  it('reads back parts rebased to a sandbox folder, owned by the sandbox user', async () => {
    const packed = await packTask(path.join(EXAMPLES, 'tasks', 'set-port'));
    const archive = await TaskArchive.fromBuffer(packed.archive, packed.digest);
    expect(archive.has('solution')).toBe(true);
    expect(archive.readText('workspace/app.conf')).toContain('port = 80');
    const entries: { name: string; uid: number | undefined }[] = [];
    for await (const entry of Readable.from([await archive.partAsTar('workspace', '/srv/app', { uid: 1000, gid: 1000 })]).pipe(tar.extract())) {
      entries.push({ name: entry.header.name, uid: entry.header.uid });
      entry.resume();
    }
    expect(entries).toEqual([{ name: 'srv/app/', uid: 1000 }, { name: 'srv/app/app.conf', uid: 1000 }]);
    // An archive that does not match the digest a job names is refused.
    await expect(TaskArchive.fromBuffer(packed.archive, '0'.repeat(64))).rejects.toMatchObject({ code: 'task_archive_missing' });
  });
});

// A sandbox image whose shell is the host's dash (as in Debian-based images), not busybox's ash, which
// runs its own applets whatever PATH says: here `tar` and `head` are looked up in PATH, and the first
// folder of the sandbox's PATH, /usr/local/bin, is the sandbox user's (as in images that give their user
// /usr/local for installs). Built offline from host files, for tests of what an agent can plant there.
import { execFileSync } from 'node:child_process';
import { readFileSync, realpathSync } from 'node:fs';
import { Readable } from 'node:stream';
import type Docker from 'dockerode';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';

/** The folder first in the sandbox's PATH, owned by uid 1000 here. */
export const WRITABLE_PATH_DIR = '/usr/local/bin';

export async function buildDashImage(docker: Docker, image: string): Promise<void> {
  const dash = realpathSync('/bin/dash');
  // ldd names each library as "name => /path (addr)" or "/path (addr)"; the vdso has no file.
  const libs = [...execFileSync('ldd', [dash], { encoding: 'utf8' }).matchAll(/(\/\S+) \(0x/g)].map((m) => m[1]!);
  const applets = execFileSync('/bin/busybox', ['--list'], { encoding: 'utf8' }).split('\n').filter((a) => a !== '' && a !== 'sh' && a !== 'busybox');
  const archive = await tarBuffer((pack) => {
    const dir = (name: string, mode = 0o755, uid = 0) => pack.entry({ name, type: 'directory', mode, uid, gid: uid });
    const file = (name: string, from: string) => pack.entry({ name, mode: 0o755 }, readFileSync(from));
    const made = new Set(['bin/', 'etc/', 'workspace/', 'usr/', 'usr/local/']);
    for (const d of made) dir(d);
    dir('tmp/', 0o1777);
    dir(`${WRITABLE_PATH_DIR.slice(1)}/`, 0o755, 1000);
    file('bin/busybox', '/bin/busybox');
    file('bin/sh', dash);
    for (const applet of applets) pack.entry({ name: `bin/${applet}`, type: 'symlink', linkname: 'busybox' });
    for (const lib of libs) {
      const parts = lib.split('/').slice(1, -1);
      for (let i = 1; i <= parts.length; i++) {
        const d = `${parts.slice(0, i).join('/')}/`;
        if (!made.has(d)) dir(d);
        made.add(d);
      }
      file(lib.slice(1), realpathSync(lib));
    }
    pack.entry({ name: 'etc/passwd', mode: 0o644 }, 'root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/workspace:/bin/sh\n');
    pack.entry({ name: 'etc/group', mode: 0o644 }, 'root:x:0:\nagent:x:1000:\n');
  });
  const stream = await docker.importImage(Readable.from([archive]) as never, { repo: image.split(':')[0], tag: image.split(':')[1], changes: ['WORKDIR /workspace'] } as never);
  await new Promise<void>((resolve, reject) => docker.modem.followProgress(stream as unknown as NodeJS.ReadableStream, (err: Error | null) => (err ? reject(err) : resolve())));
}

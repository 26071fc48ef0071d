// Attacks on the workspace evidence, written black-box (from the README's promises on evidence, the
// sweep and the sandbox, without reading the fleet's code): hostile command agents (uid 1000, busybox
// sandbox; one in a dash image whose /usr/local/bin is the agent's) leave behind a workspace built to
// break the copy kept after the episode (the evidence workspace, `workspace.diff`, `evidence.json`).
//
// The promises checked, for every episode:
// - it ends with a result in one attempt, graded on the real workspace (the verifier checks the
//   hostile content is really there, so a reward 1 means the sandbox held it while the fleet coped);
// - `evidence.json` is there with `workspace.takenAt` set ("agent-stopped": the sweep's copy, taken
//   once nothing of the agent's runs; "close": the engine's copy after the verifier, when the sweep's
//   cannot be taken);
// - the extracted workspace holds only folders and regular files (no link created, no FIFO, socket or
//   device), no file with a second name (hard link), at most 4 MiB a file, 16 MiB and 2,000 files in
//   all (on disk too: a sparse file must not come back as 2 GB of blocks), and every kept path is
//   inside the attempt's folder;
// - nothing is written outside the episode's evidence folder (a canary folder on the host and a scan
//   of the data folder and /tmp for the attack's token);
// - processes the agent left behind cannot change the workspace after the copy: the verifier sees what
//   the evidence shows;
// - the worker takes the next episode afterwards.
//
// Found at bcbdf2f (these cases failed there, every run; fixed since: a file kept in part is named in
// `extraction.skipped` with what was kept, and the copy is read at most 32x the 16 MiB cap and not
// past the close reserve's evidence share less 3 s, the rest said not read):
// - a file past 4 MiB (30 MB, 4 MiB + 1 byte, a sparse 1,900 MiB or 16 GiB, a forged entry) is kept in
//   the evidence workspace cut to its first 4 MiB and is not in `extraction.skipped` (which stays
//   empty; only `truncated: true` for the whole copy): it looks like a complete 4 MiB file;
// - a sparse file is read whole at close (about 100 MB/s here): 1,900 MiB under the default limits takes
//   14 to 27 s of the 30 s close reserve, and 16 GiB (a task granting 64 GB of disk) uses it all, so the
//   attempt's folder has no evidence.json and no workspace.diff, and its workspace lacks the answer.
//
// Each mechanism first proves itself inside the sandbox where that makes sense (`rehearsal=ok` in the
// agent's output, as in verify-evasion.test.ts), so a passing case means the fleet held, not that the
// attack was broken.
import { randomBytes } from 'node:crypto';
import { lstat, mkdir, readFile, readdir, realpath, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { buildDashImage, WRITABLE_PATH_DIR } from '../helpers/dash-image.ts';
import { docker, enqueueFile, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch, type ScratchTask } from '../helpers/scratch-tasks.ts';

const MiB = 1024 * 1024;
const CAP_TOTAL = 16 * MiB;
const CAP_FILE = 4 * MiB;
const CAP_FILES = 2000;

const TOKEN = randomBytes(6).toString('hex');
const CANARY = path.join(os.tmpdir(), `rf-canary-${TOKEN}`);
const VICTIM = 'victim.txt';
const VICTIM_TEXT = `victim ${TOKEN}\n`;
const DASH_IMAGE = `rollout-fleet/sandbox-test:evidence-attacks-${process.pid}`;

/** Silence and detach: nothing of a daemon holds the agent's stdio. */
const Q = '</dev/null >/dev/null 2>&1';

// A writer left running: appends a numbered line every 2 ms, ignoring every catchable stop signal.
const WRITER = [
  'trap "" TERM HUP INT QUIT USR1 USR2 PIPE',
  'n=0; while :; do n=$((n+1)); echo "line $n" >> "$F"; usleep 2000; done',
].join('\n') + '\n';

// A relay race (each generation a fork and an exec, never the same process twice) appending a line per
// generation: survives a sweep that signals a list of pids taken once.
const RELAY_WRITER = [
  'trap "" TERM HUP INT QUIT USR1 USR2 PIPE',
  'echo "gen $$" >> "$F"',
  'usleep 3000',
  'sh /workspace/relay.sh </dev/null >/dev/null 2>&1 &',
].join('\n') + '\n';

// Waits for a `tar` of the sandbox user to appear and go (the workspace copy), then rewrites $T with
// the answer: the workspace changes after the copy, before the verifier reads it. Builtins only in its
// loop (no fork), so it sees a tar that lives a few milliseconds.
const AFTER_COPY = [
  'trap "" TERM HUP INT QUIT USR1 USR2 PIPE',
  'seen=',
  'while :; do',
  '  t=',
  '  for p in /proc/[0-9]*; do',
  '    read -r c < "$p/comm" || continue',
  '    case "$c" in tar) t=1; break;; esac',
  '    read -r c < "$p/cmdline" || true',
  '    case "$c" in tar*|/bin/tar*|/usr/bin/tar*) t=1; break;; esac',
  '  done 2>/dev/null',
  '  if [ -n "$t" ]; then seen=1; elif [ -n "$seen" ]; then echo fixed > "$T"; echo after-copy > "$T.who"; exit 0; fi',
  'done',
].join('\n') + '\n';

interface Attack {
  what: string;
  agent: string;
  /** The verifier (run in the workdir; exit 0 = reward 1). */
  verify?: string;
  limits?: string;
  image?: string;
  rehearsed?: boolean;
  files?: Record<string, string>;
}

const PLAIN_VERIFY = 'grep -qx fixed state.txt';

const ATTACKS: Record<string, Attack> = {
  control: { what: 'an honest agent (the verifier can pass)', agent: 'echo fixed > state.txt\n' },
  'big-files': {
    what: 'a 30 MB file, one of 4 MiB + 1 byte and one of exactly 4 MiB',
    agent: [
      'echo fixed > state.txt',
      'dd if=/dev/zero of=big.bin bs=1048576 count=30 2>/dev/null',
      'head -c 4194305 /dev/urandom > over4.bin',
      'head -c 4194304 /dev/urandom > exact4.bin',
      '[ "$(stat -c %s big.bin)" = 31457280 ] && [ "$(stat -c %s over4.bin)" = 4194305 ] && echo rehearsal=ok',
    ].join('\n') + '\n',
    verify: `${PLAIN_VERIFY} && [ "$(stat -c %s big.bin)" = 31457280 ] && [ "$(stat -c %s over4.bin)" = 4194305 ]`,
    rehearsed: true,
  },
  'sparse-1900m': {
    what: 'a 1,900 MiB sparse file (no blocks in the sandbox, under the default diskMb even by its apparent size; 1,900 MiB in any tar)',
    agent: [
      'echo fixed > state.txt',
      'truncate -s 1900M sparse.bin',
      'echo after > zz-after.txt',
      '[ "$(stat -c %s sparse.bin)" = 1992294400 ] && [ "$(du -k sparse.bin | cut -f1)" -lt 1024 ] && echo rehearsal=ok',
    ].join('\n') + '\n',
    verify: `${PLAIN_VERIFY} && [ "$(stat -c %s sparse.bin)" = 1992294400 ]`,
    rehearsed: true,
  },
  'sparse-16g': {
    what: 'a 16 GiB sparse file in a task that grants 64 GB of disk: the engine\'s copy at close is longer than the whole close reserve',
    agent: [
      'echo fixed > state.txt',
      'truncate -s 16G sparse.bin',
      '[ "$(stat -c %s sparse.bin)" = 17179869184 ] && [ "$(du -k sparse.bin | cut -f1)" -lt 1024 ] && echo rehearsal=ok',
    ].join('\n') + '\n',
    verify: `${PLAIN_VERIFY} && [ "$(stat -c %s sparse.bin)" = 17179869184 ]`,
    limits: '{ memoryMb: 128, cpus: 0.5, pids: 64, diskMb: 65536 }',
    rehearsed: true,
  },
  'many-files': {
    what: '5,000 small files',
    agent: [
      'echo fixed > state.txt',
      'mkdir many && cd many && i=0; while [ $i -lt 5000 ]; do echo $i > f$i; i=$((i+1)); done; cd ..',
      '[ "$(ls many | wc -l)" = 5000 ] && echo rehearsal=ok',
    ].join('\n') + '\n',
    verify: `${PLAIN_VERIFY} && [ "$(ls many | wc -l)" = 5000 ]`,
    rehearsed: true,
  },
  'odd-names': {
    what: 'names with a newline, invalid UTF-8, ANSI escapes, 255 bytes; a path nested past PATH_MAX',
    agent: [
      'echo fixed > state.txt',
      'ok=1',
      'echo a > "$(printf \'new\\nline.txt\')" || ok=',
      'echo b > "$(printf \'bad\\377\\376utf8.txt\')" || ok=',
      'echo c > "$(printf \'esc\\033[31mred\\033[0m.txt\')" || ok=',
      'echo d > "$(printf \'L%.0s\' $(seq 255))" || ok=',
      'echo e > " leading space" && echo f > -dash.txt && echo g > "back\\\\slash" || ok=',
      // 44 levels of 91 characters: 4,072 characters from / in the sandbox (under PATH_MAX), past it
      // under the evidence folder on the host.
      'D=$(printf \'D%.0s\' $(seq 91))',
      'mkdir nest && cd nest && i=0; while [ $i -lt 44 ]; do mkdir $D && cd $D || ok=; i=$((i+1)); done; echo deep > deep.txt || ok=; cd /workspace',
      'echo after > zz-after.txt',
      '[ -n "$ok" ] && [ "$(ls | wc -l)" -ge 10 ] && echo rehearsal=ok',
    ].join('\n') + '\n',
    rehearsed: true,
  },
  'special-files': {
    what: 'a FIFO, a Unix socket, hard links (in and out of the workdir), symlinks to /tests, /proc, /etc/passwd, /, up and to itself',
    agent: [
      'echo fixed > state.txt',
      'mkfifo fifo',
      "/opt/rollout-fleet/bin/node -e \"require('net').createServer().listen('sock.s', () => process.exit(0))\"",
      'ln state.txt hard.txt',
      'echo outside > /tmp/outside.txt && ln /tmp/outside.txt hard-outside.txt',
      'ln -s /tests tests-link; ln -s /proc/self/root proc-root; ln -s /etc/passwd passwd-link; ln -s / root-link',
      'ln -s loop loop; ln -s ../../../../../../../../tmp up-link; mkdir d && ln -s ../state.txt d/back-link',
      '[ -p fifo ] && [ -S sock.s ] && [ -L tests-link ] && [ "$(stat -c %h state.txt)" = 2 ] && [ "$(stat -c %h hard-outside.txt)" = 2 ] && echo rehearsal=ok',
    ].join('\n') + '\n',
    verify: `${PLAIN_VERIFY} && [ -p fifo ] && [ -S sock.s ] && [ -L tests-link ]`,
    rehearsed: true,
  },
  'chmod-000': {
    what: 'a file and a folder of mode 000, a folder of mode 300 (the sandbox user cannot read them)',
    agent: [
      'echo fixed > state.txt',
      'echo y > nope.txt && chmod 000 nope.txt',
      'mkdir locked && echo x > locked/inner.txt && chmod 000 locked',
      'mkdir wonly && echo z > wonly/f.txt && chmod 300 wonly',
      'if ! cat nope.txt 2>/dev/null && ! ls locked 2>/dev/null && ! ls wonly 2>/dev/null; then echo rehearsal=ok; fi',
    ].join('\n') + '\n',
    rehearsed: true,
  },
  'workdir-000': {
    what: 'the workdir itself made unreadable and unsearchable (chmod 000 .)',
    agent: [
      'echo fixed > state.txt',
      'chmod 000 /workspace',
      'if ! ls /workspace 2>/dev/null && ! cat /workspace/state.txt 2>/dev/null; then echo rehearsal=ok; fi',
    ].join('\n') + '\n',
    rehearsed: true,
  },
  'writers-left-running': {
    what: 'a TERM-ignoring writer and a relay race, both appending to the workspace, left running',
    agent: [
      'echo fixed > state.txt',
      `F=/workspace/grow.log setsid sh /workspace/writer.sh ${Q} &`,
      `F=/workspace/relay.log setsid sh /workspace/relay.sh ${Q} &`,
      'i=0; while [ $i -lt 100 ] && ! [ -s grow.log -a -s relay.log ]; do usleep 20000; i=$((i+1)); done',
      'a=$(stat -c %s grow.log); b=$(stat -c %s relay.log); usleep 300000',
      '[ "$(stat -c %s grow.log)" -gt "$a" ] && [ "$(stat -c %s relay.log)" -gt "$b" ] && echo rehearsal=ok',
    ].join('\n') + '\n',
    // The verifier reports the sizes it saw, and passes only if nothing grew during its second.
    verify: 'a=$(stat -c %s grow.log); b=$(stat -c %s relay.log); sleep 1; c=$(stat -c %s grow.log); d=$(stat -c %s relay.log); echo "seen grow=$a relay=$b later grow=$c relay=$d"; [ "$a" = "$c" ] && [ "$b" = "$d" ] && grep -qx fixed state.txt',
    files: { 'workspace/writer.sh': WRITER, 'workspace/relay.sh': RELAY_WRITER },
    rehearsed: true,
  },
  'after-copy-mutator': {
    what: 'a TERM-ignoring daemon that writes the answer once the workspace copy (a tar) has come and gone',
    agent: [
      'echo broken > state.txt',
      // 3 MB to copy, so the copy's tar lives a few milliseconds, in the rehearsal as for real.
      'head -c 3000000 /dev/urandom > pad.bin',
      // Rehearsal: the daemon against a decoy, triggered by a tar the agent runs itself.
      `echo broken > /tmp/decoy.txt; T=/tmp/decoy.txt setsid sh /workspace/after-copy.sh ${Q} &`,
      // (its reader dawdles, so the tar lives long enough for the daemon's pass over /proc under load)
      'usleep 100000; tar -cf - . | { usleep 300000; head -c 20000000; } >/dev/null',
      'i=0; while [ $i -lt 150 ] && ! grep -qx fixed /tmp/decoy.txt; do usleep 20000; i=$((i+1)); done',
      'grep -qx fixed /tmp/decoy.txt && echo rehearsal=ok',
      // For real: nothing the agent does runs tar again; only the fleet's copy can trigger it.
      `T=/workspace/state.txt setsid sh /workspace/after-copy.sh ${Q} &`,
      'usleep 200000',
    ].join('\n') + '\n',
    verify: 'sleep 1; echo "seen state=$(cat state.txt) who=$(cat state.txt.who 2>/dev/null)"; grep -qx fixed state.txt',
    files: { 'workspace/after-copy.sh': AFTER_COPY },
    rehearsed: true,
  },
};

// The forged tar: a node script the agent plants as /usr/local/bin/tar (first in the sandbox's PATH in
// the dash image), so that a sweep copying the workspace with the image's tar would hand this archive
// to the extractor. Every entry tries to escape the evidence folder, make links, or pass the caps. The
// end of the turn copies the workspace with the runtime's own node, so the forgery must change nothing;
// the extractor's own defence against such archives is tested in test/unit/safe-extract.test.ts.
function forgeJs(): string {
  return String.raw`
const fs = require('fs');
const CANARY = ${JSON.stringify(CANARY)}, TOKEN = ${JSON.stringify(TOKEN)};
// A tar of the workdir names its entries after it: workspace/state.txt.
const P = 'workspace/';
function header(name, o = {}) {
  const b = Buffer.alloc(512);
  const put = (v, off, len) => { (Buffer.isBuffer(v) ? v : Buffer.from(v, 'latin1')).copy(b, off, 0, len); };
  const size = o.size || 0;
  put(name, 0, 100);
  put((o.mode || 0o644).toString(8).padStart(7, '0') + '\0', 100, 8);
  put('0001750\0', 108, 8); put('0001750\0', 116, 8);
  put(size.toString(8).padStart(11, '0') + '\0', 124, 12);
  put('14000000000\0', 136, 12);
  put('        ', 148, 8);
  put(o.type || '0', 156, 1);
  put(o.linkname || '', 157, 100);
  put('ustar\0', 257, 6); put('00', 263, 2);
  let sum = 0; for (const x of b) sum += x;
  put(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8);
  return b;
}
function out(buf) {
  let off = 0;
  while (off < buf.length) {
    try { off += fs.writeSync(1, buf, off); } catch (e) { if (e.code !== 'EAGAIN') throw e; }
  }
}
const pad = (n) => Buffer.alloc((512 - (n % 512)) % 512);
function file(name, data, o = {}) {
  const d = Buffer.from(data);
  out(header(name, { ...o, size: d.length })); out(d); out(pad(d.length));
}
function entry(name, o) { out(header(name, o)); }
function pax(records, name) {
  let body = '';
  for (const [k, v] of records) {
    const rec = ' ' + k + '=' + v + '\n';
    let len = rec.length + 1; while (String(len).length + rec.length > len) len++;
    body += len + rec;
  }
  file('PaxHeaders/' + name, body, { type: 'x' });
}
function longname(name) { file('././@LongLink', name + '\0', { type: 'L' }); }

// Names as a tar of the workdir gives them, then the hostile ones.
file(P + '', '', { type: '5', mode: 0o755 });
file(P + 'forged-marker.txt', 'forged ' + TOKEN + '\n');
file(P + 'state.txt', 'fixed\n');
// Absolute and climbing names, straight, after a folder, through GNU long names and pax headers.
file(CANARY + '/abs-' + TOKEN + '.txt', 'abs\n');
for (let up = 1; up <= 12; up++) {
  file('../'.repeat(up) + 'up' + up + '-' + TOKEN + '.txt', 'up\n');
  file(P + '' + '../'.repeat(up) + 'dotup' + up + '-' + TOKEN + '.txt', 'up\n');
  file(P + 'x/' + '../'.repeat(up + 1) + 'xup' + up + '-' + TOKEN + '.txt', 'up\n');
}
file(P + 'sub/' + '../'.repeat(12) + CANARY.slice(1) + '/mid-' + TOKEN + '.txt', 'mid\n');
longname(P + '' + '../'.repeat(40) + CANARY.slice(1) + '/long-' + TOKEN + '.txt');
file(P + 'innocent-long.txt', 'long\n');
pax([['path', CANARY + '/pax-' + TOKEN + '.txt']], 'innocent-pax.txt');
file(P + 'innocent-pax.txt', 'pax\n');
pax([['path', P + '' + '../'.repeat(12) + 'paxup-' + TOKEN + '.txt']], 'innocent-pax2.txt');
file(P + 'innocent-pax2.txt', 'pax2\n');
pax([['linkpath', CANARY + '/victim.txt']], 'paxlink');
entry(P + 'paxlink', { type: '2', linkname: 'harmless' });
// Links out, then writes through them.
entry(P + 'lnk', { type: '2', linkname: CANARY });
file(P + 'lnk/through-' + TOKEN + '.txt', 'through\n');
entry(P + 'rel', { type: '2', linkname: '../'.repeat(12) + CANARY.slice(1) });
file(P + 'rel/through2-' + TOKEN + '.txt', 'through2\n');
entry(P + 'dirlink', { type: '2', linkname: CANARY });
entry(P + 'dirlink/newdir-' + TOKEN + '/', { type: '5', mode: 0o755 });
file(P + 'dirlink/newdir-' + TOKEN + '/f.txt', 'f\n');
entry(P + 'hl', { type: '1', linkname: CANARY + '/victim.txt' });
file(P + 'hl', 'overwritten via hard link ' + TOKEN + '\n');
entry(P + 'hl2', { type: '1', linkname: P + '' + '../'.repeat(12) + CANARY.slice(1) + '/victim.txt' });
file(P + 'hl2', 'overwritten via hard link 2 ' + TOKEN + '\n');
entry(P + 'hl3', { type: '1', linkname: P + 'forged-marker.txt' });
// A link pointing at the victim, then a regular file of the same name (an extractor that opens
// without O_NOFOLLOW writes through it).
entry(P + 'follow-me', { type: '2', linkname: CANARY + '/victim.txt' });
file(P + 'follow-me', 'followed ' + TOKEN + '\n');
// Devices, a FIFO, odd names, duplicates.
entry(P + 'dev-null', { type: '3' });
entry(P + 'blk', { type: '4' });
entry(P + 'fifo', { type: '6' });
entry(P + '.', { type: '5' });
entry(P + '..', { type: '5' });
file(P + 'dup.txt', 'first\n');
file(P + 'dup.txt', 'second\n');
// Past the caps: one file of 4 MiB + 1, then 2,100 small files.
out(header(P + 'over4.bin', { size: 4194305 }));
const mb = Buffer.alloc(1048576, 0x41);
for (let i = 0; i < 4; i++) out(mb);
out(Buffer.from('A')); out(pad(4194305));
for (let i = 0; i < 2100; i++) file(P + 'many/f' + i, 'x');
out(Buffer.alloc(1024));
`;
}

const PLANT_TAR = `#!/bin/sh\nexec /opt/rollout-fleet/bin/node /workspace/forge.js\n`;

ATTACKS['forged-tar'] = {
  what: 'a tar planted first in PATH that forges the sweep\'s copy: absolute, climbing, pax and long names, links out, devices, past the caps',
  image: DASH_IMAGE,
  agent: [
    'echo fixed > state.txt',
    `cp /workspace/plant-tar.sh ${WRITABLE_PATH_DIR}/tar && chmod +x ${WRITABLE_PATH_DIR}/tar`,
    // The planted tar is the one PATH finds, and it forges the archive.
    `[ "$(command -v tar)" = ${WRITABLE_PATH_DIR}/tar ] && n=$(tar -cf - . | grep -ac forged-marker) && [ "$n" -ge 1 ] && echo rehearsal=ok`,
  ].join('\n') + '\n',
  limits: '{ memoryMb: 256, cpus: 0.5, pids: 64 }',
  files: { 'workspace/forge.js': forgeJs(), 'workspace/plant-tar.sh': PLANT_TAR },
  rehearsed: true,
};

const RESERVES = { setupSec: 60, verifySec: 25, closeSec: 30 };
const CEILING_SEC = 45;

function task(id: string, a: Attack): ScratchTask {
  const deadlineSec = RESERVES.setupSec + RESERVES.verifySec + RESERVES.closeSec + CEILING_SEC;
  return {
    yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: ${JSON.stringify(a.verify ?? PLAIN_VERIFY)}\n  timeoutSec: 15\n` +
      `deadlineSec: ${deadlineSec}\nreserves: { setupSec: ${RESERVES.setupSec}, verifySec: ${RESERVES.verifySec}, closeSec: ${RESERVES.closeSec} }\n` +
      `limits: ${a.limits ?? '{ memoryMb: 128, cpus: 0.5, pids: 64 }'}\n` + (a.image ? `image: ${a.image}\n` : ''),
    files: { 'workspace/state.txt': 'broken\n', 'workspace/agent.sh': a.agent, 'tests/.keep': '', ...(a.files ?? {}) },
  };
}

interface Evidence {
  workspace: {
    takenAt?: string;
    added?: string[];
    modified?: string[];
    removed?: string[];
    extraction?: { skipped?: { path: string; reason: string }[]; [k: string]: unknown };
    [k: string]: unknown;
  };
  [k: string]: unknown;
}

interface Walked {
  files: { rel: string; size: number; blocks: number; nlink: number }[];
  dirs: string[];
  /** Anything neither a folder nor a regular file (a link, FIFO, socket, device). */
  others: { rel: string; mode: number }[];
  errors: string[];
  escaped: string[];
}

/** Every entry under `root` by lstat (links are never followed), with what could not be read. */
async function walk(root: string, within: string): Promise<Walked> {
  const w: Walked = { files: [], dirs: [], others: [], errors: [], escaped: [] };
  const realWithin = await realpath(within);
  const visit = async (rel: string): Promise<void> => {
    const abs = rel === '' ? root : path.join(root, rel);
    let names: string[];
    try {
      names = await readdir(abs);
    } catch (err) {
      w.errors.push(`${JSON.stringify(rel)}: ${(err as Error).message}`);
      return;
    }
    for (const name of names) {
      const r = rel === '' ? name : path.join(rel, name);
      const p = path.join(root, r);
      try {
        const st = await lstat(p);
        if (st.isDirectory()) {
          w.dirs.push(r);
          await visit(r);
        } else if (st.isFile()) {
          w.files.push({ rel: r, size: st.size, blocks: st.blocks * 512, nlink: st.nlink });
          const real = await realpath(p);
          if (!real.startsWith(realWithin + path.sep)) w.escaped.push(`${r} -> ${real}`);
        } else {
          w.others.push({ rel: r, mode: st.mode });
        }
      } catch (err) {
        w.errors.push(`${JSON.stringify(r)}: ${(err as Error).message}`);
      }
    }
  };
  await visit('');
  return w;
}

/** Every path under `root` (no link followed) whose name contains `needle`. */
async function findNamed(root: string, needle: string, skip: (abs: string) => boolean, depth = 6): Promise<string[]> {
  const found: string[] = [];
  const visit = async (dir: string, d: number): Promise<void> => {
    if (d < 0 || skip(dir)) return;
    let names: string[];
    try {
      names = await readdir(dir);
    } catch {
      return;
    }
    for (const name of names) {
      const p = path.join(dir, name);
      if (skip(p)) continue;
      if (name.includes(needle)) found.push(p);
      try {
        if ((await lstat(p)).isDirectory()) await visit(p, d - 1);
      } catch {
        // gone meanwhile
      }
    }
  };
  await visit(root, depth);
  return found;
}

describe('attacks on the workspace evidence', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let batchId: string;
  const byTask = new Map<string, EpisodeResult>();
  const attemptDir = (taskId: string) => path.join(env.dataDir, 'evidence', byTask.get(taskId)!.episodeId, 'attempt-1');
  const readText = (taskId: string, name: string) => readFile(path.join(attemptDir(taskId), name), 'utf8').catch(() => '');
  const evidenceOf = async (taskId: string) => JSON.parse(await readFile(path.join(attemptDir(taskId), 'evidence.json'), 'utf8')) as Evidence;
  const walkOf = (taskId: string) => walk(path.join(attemptDir(taskId), 'workspace'), attemptDir(taskId));
  // Past the caps the read stops (README: evidence). What came after a huge file is then not kept,
  // and the report must say the rest was not read; what is kept is the agent's.
  const keptOrNotRead = async (taskId: string, ev: Evidence, w: Awaited<ReturnType<typeof walkOf>>, why: string, expected: string[]) => {
    const names = w.files.map((f) => f.rel);
    const notRead = (ev.workspace.extraction?.skipped ?? []).some((s) => s.path === '*' && /not read/.test(s.reason));
    for (const name of expected) {
      expect(names.includes(name) || notRead, `${why}\n${name}: neither kept nor covered by "the rest not read"`).toBe(true);
    }
    if (names.includes('state.txt')) expect(await readFile(path.join(attemptDir(taskId), 'workspace', 'state.txt'), 'utf8')).toBe('fixed\n');
  };
  const describeResult = async (taskId: string) => {
    const r = byTask.get(taskId);
    const ev = await evidenceOf(taskId).catch((e: unknown) => String(e));
    const skipped = typeof ev === 'string' ? undefined : ev.workspace?.extraction?.skipped;
    return `${taskId}: ${JSON.stringify(r)}\nevidence.workspace: ${typeof ev === 'string' ? ev : JSON.stringify({ ...ev.workspace, added: ev.workspace.added?.length, extraction: { ...ev.workspace.extraction, skipped: skipped?.slice(0, 8), skippedCount: skipped?.length } })}\nagent stdout: ${(await readText(taskId, 'agent.stdout.txt')).slice(0, 2000)}\nagent stderr: ${(await readText(taskId, 'agent.stderr.txt')).slice(0, 1000)}\nverifier stdout: ${(await readText(taskId, 'verifier.stdout.txt')).slice(0, 1000)}\nverifier stderr: ${(await readText(taskId, 'verifier.stderr.txt')).slice(0, 1000)}`;
  };

  beforeAll(async () => {
    await mkdir(CANARY, { recursive: true });
    await writeFile(path.join(CANARY, VICTIM), VICTIM_TEXT);
    await buildDashImage(docker, DASH_IMAGE);
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'evidence-attacks-w', { concurrency: 4 });
    const tasks: Record<string, ScratchTask> = {};
    for (const [id, a] of Object.entries(ATTACKS)) tasks[id] = task(id, a);
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "sh /workspace/agent.sh" }\n', tasks);
    const plan = await enqueueFile(env, file);
    batchId = plan.batchId;
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 400_000);
    for (const r of results) byTask.set(r.taskId, r);
    await waitForNoContainers(plan.batchId, 60_000);
  }, 520_000);

  afterAll(async () => {
    await worker?.close();
    await env?.close();
    await docker.getImage(DASH_IMAGE).remove({ force: true }).catch(() => undefined);
    await rm(CANARY, { recursive: true, force: true });
  });

  const ids = Object.keys(ATTACKS);

  it.each(ids.filter((id) => ATTACKS[id]!.rehearsed).map((id) => [id, ATTACKS[id]!.what]))('%s: the mechanism works in the sandbox (%s)', async (id) => {
    const out = await readText(id, 'agent.stdout.txt');
    expect(out, await describeResult(id)).toContain('rehearsal=ok');
  });

  it.each(ids.map((id) => [id, ATTACKS[id]!.what]))('%s: ends in one attempt, evidence.json with takenAt, an extracted workspace within the caps (%s)', async (id) => {
    const r = byTask.get(id);
    const why = await describeResult(id);
    expect(r, why).toBeDefined();
    expect(r!.attempts, why).toBe(1);
    // Close never waits past its reserve, however long the workspace takes to copy.
    expect(r!.timings.closeMs, why).toBeLessThanOrEqual(RESERVES.closeSec * 1000 + 1500);
    const files = await readdir(attemptDir(id));
    expect(files, `${why}\nthe attempt's evidence folder holds ${JSON.stringify(files)}: no evidence.json`).toContain('evidence.json');
    expect(files, `${why}\nthe attempt's evidence folder holds ${JSON.stringify(files)}: no workspace.diff`).toContain('workspace.diff');
    const ev = await evidenceOf(id);
    expect(['agent-stopped', 'close'], why).toContain(ev.workspace.takenAt);
    for (const s of ev.workspace.extraction?.skipped ?? []) {
      expect(typeof s.path, why).toBe('string');
      expect(s.reason, why).toMatch(/\S/);
    }
    const w = await walkOf(id);
    expect(w.errors, why).toEqual([]);
    expect(w.others.map((o) => `${o.rel} (mode ${o.mode.toString(8)})`), why).toEqual([]);
    expect(w.escaped, why).toEqual([]);
    expect(w.files.filter((f) => f.nlink !== 1).map((f) => `${f.rel} nlink ${f.nlink}`), why).toEqual([]);
    expect(w.files.filter((f) => f.size > CAP_FILE).map((f) => `${f.rel} ${f.size}`), why).toEqual([]);
    expect(w.files.length, why).toBeLessThanOrEqual(CAP_FILES);
    expect(w.files.reduce((n, f) => n + f.size, 0), why).toBeLessThanOrEqual(CAP_TOTAL);
    expect(w.files.reduce((n, f) => n + f.blocks, 0), why).toBeLessThanOrEqual(CAP_TOTAL + 4 * MiB);
  });

  it('control: passes with the sweep\'s copy, which holds the answer', async () => {
    const why = await describeResult('control');
    expect(byTask.get('control'), why).toMatchObject({ status: 'passed', reward: 1 });
    expect((await evidenceOf('control')).workspace, why).toMatchObject({ takenAt: 'agent-stopped', modified: ['state.txt'] });
    expect(await readFile(path.join(attemptDir('control'), 'workspace', 'state.txt'), 'utf8')).toBe('fixed\n');
    expect(await readText('control', 'workspace.diff'), why).toContain('-broken\n+fixed');
  });

  it('big-files: graded on the real files; the 30 MB and 4 MiB + 1 files skipped with a reason, the exact 4 MiB one kept', async () => {
    const why = await describeResult('big-files');
    expect(byTask.get('big-files'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('big-files');
    const skipped = (ev.workspace.extraction?.skipped ?? []).map((s) => s.path);
    const w = await walkOf('big-files');
    const names = w.files.map((f) => f.rel);
    expect(names, why).toContain('state.txt');
    expect(w.files.find((f) => f.rel === 'exact4.bin')?.size, why).toBe(CAP_FILE);
    // A file past 4 MiB is not kept whole: it must be named in the extraction report, not left in the
    // evidence workspace as a 4 MiB file that looks complete.
    for (const name of ['big.bin', 'over4.bin']) {
      const kept = w.files.find((f) => f.rel === name);
      expect(skipped.includes(name), `${why}
${name}: not listed as skipped; kept in the evidence as ${kept ? `a ${kept.size}-byte file` : 'nothing'}`).toBe(true);
    }
  });

  it('sparse-1900m: graded on the real file; named as cut, no 1,900 MiB on the host\'s disk, the rest extracted or said not read', async () => {
    const why = await describeResult('sparse-1900m');
    expect(byTask.get('sparse-1900m'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('sparse-1900m');
    const w = await walkOf('sparse-1900m');
    const kept = w.files.find((f) => f.rel === 'sparse.bin');
    expect((ev.workspace.extraction?.skipped ?? []).map((s) => s.path), `${why}\nsparse.bin: not listed as skipped; kept in the evidence as ${kept ? `a ${kept.size}-byte file` : 'nothing'}`).toContain('sparse.bin');
    await keptOrNotRead('sparse-1900m', ev, w, why, ['state.txt', 'zz-after.txt']);
  });

  it('sparse-16g: graded on the real file; the evidence still has evidence.json and workspace.diff, the big file named as cut', async () => {
    const why = await describeResult('sparse-16g');
    expect(byTask.get('sparse-16g'), why).toMatchObject({ status: 'passed', reward: 1 });
    const files = await readdir(attemptDir('sparse-16g'));
    expect(files, `${why}\nevidence folder: ${JSON.stringify(files)}`).toEqual(expect.arrayContaining(['evidence.json', 'workspace.diff']));
    const w = await walkOf('sparse-16g');
    const ev = await evidenceOf('sparse-16g');
    await keptOrNotRead('sparse-16g', ev, w, why, ['state.txt']);
    const kept = w.files.find((f) => f.rel === 'sparse.bin');
    expect((ev.workspace.extraction?.skipped ?? []).map((s) => s.path), `${why}\nsparse.bin: not listed as skipped; kept in the evidence as ${kept ? `a ${kept.size}-byte file` : 'nothing'}`).toContain('sparse.bin');
  });

  it('many-files: at most 2,000 files kept, every one of the 5,000 either kept or listed as skipped', async () => {
    const why = await describeResult('many-files');
    expect(byTask.get('many-files'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('many-files');
    const w = await walkOf('many-files');
    expect(w.files.length, why).toBeLessThanOrEqual(CAP_FILES);
    const kept = new Set(w.files.map((f) => f.rel));
    const skipped = new Set((ev.workspace.extraction?.skipped ?? []).map((s) => s.path.replace(/^\.\//, '')));
    const missing: string[] = [];
    for (let i = 0; i < 5000; i++) {
      const name = `many/f${i}`;
      if (!kept.has(name) && !skipped.has(name)) missing.push(name);
    }
    expect(missing.length, `${why}\nneither kept nor listed: ${missing.slice(0, 10).join(', ')} ...`).toBe(0);
    for (const f of w.files.filter((x) => x.rel.startsWith('many/')).slice(0, 50)) {
      expect(await readFile(path.join(attemptDir('many-files'), 'workspace', f.rel), 'utf8')).toBe(`${f.rel.slice('many/f'.length)}\n`);
    }
  });

  it('odd-names: graded; the answer and the plain files extracted, odd names kept or skipped with a reason, none outside', async () => {
    const why = await describeResult('odd-names');
    expect(byTask.get('odd-names'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('odd-names');
    const w = await walkOf('odd-names');
    const kept = new Set(w.files.map((f) => f.rel));
    expect(kept, why).toContain('state.txt');
    expect(kept, why).toContain('zz-after.txt');
    expect(await readFile(path.join(attemptDir('odd-names'), 'workspace', 'state.txt'), 'utf8')).toBe('fixed\n');
    // The deep file is either kept (then its content is right) or listed as skipped.
    const deep = w.files.find((f) => f.rel.endsWith('deep.txt'));
    const skipped = (ev.workspace.extraction?.skipped ?? []).map((s) => s.path);
    if (deep) expect(await readFile(path.join(attemptDir('odd-names'), 'workspace', deep.rel), 'utf8')).toBe('deep\n');
    else expect(skipped.some((p) => p.includes('DDDD')), why).toBe(true);
    const diff = await readText('odd-names', 'workspace.diff');
    expect(diff, why).toContain('-broken\n+fixed');
  });

  it('special-files: graded with the FIFO and socket in place; no link, FIFO or socket made on the host; the links listed as skipped', async () => {
    const why = await describeResult('special-files');
    expect(byTask.get('special-files'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('special-files');
    const skipped = (ev.workspace.extraction?.skipped ?? []).map((s) => s.path);
    for (const link of ['tests-link', 'proc-root', 'passwd-link', 'root-link', 'loop', 'up-link', 'd/back-link']) expect(skipped, why).toContain(link);
    const w = await walkOf('special-files');
    const ws = path.join(attemptDir('special-files'), 'workspace');
    const kept = w.files.map((f) => f.rel);
    expect(kept, why).not.toContain('fifo');
    expect(kept, why).not.toContain('sock.s');
    // The two names of the answer (a hard link in the archive for one of them): each kept with the
    // answer or listed as skipped, and at least one kept; one not kept is said so in the diff.
    for (const name of ['state.txt', 'hard.txt', 'hard-outside.txt']) expect(kept.includes(name) || skipped.includes(name), `${why}
${name} neither kept nor listed`).toBe(true);
    const answers = ['state.txt', 'hard.txt'].filter((n) => kept.includes(n));
    expect(answers.length, why).toBeGreaterThanOrEqual(1);
    for (const n of answers) expect(await readFile(path.join(ws, n), 'utf8'), why).toBe('fixed\n');
    const diff = await readText('special-files', 'workspace.diff');
    if (!kept.includes('state.txt')) expect(diff, why).toContain('File state.txt was not captured');
  });

  it('chmod-000: graded; the sandbox user could not read them, so the engine\'s copy at close has them', async () => {
    const why = await describeResult('chmod-000');
    expect(byTask.get('chmod-000'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('chmod-000');
    expect(ev.workspace.takenAt, why).toBe('close');
    const ws = path.join(attemptDir('chmod-000'), 'workspace');
    expect(await readFile(path.join(ws, 'state.txt'), 'utf8'), why).toBe('fixed\n');
    expect(await readFile(path.join(ws, 'nope.txt'), 'utf8'), why).toBe('y\n');
    expect(await readFile(path.join(ws, 'locked', 'inner.txt'), 'utf8'), why).toBe('x\n');
    expect(await readFile(path.join(ws, 'wonly', 'f.txt'), 'utf8'), why).toBe('z\n');
  });

  it('workdir-000: ends in one attempt, not an infrastructure failure, never reward 1 (the verifier cannot read the answer); the evidence has the workspace', async () => {
    const why = await describeResult('workdir-000');
    const r = byTask.get('workdir-000')!;
    expect(r.error?.kind, why).not.toBe('infra');
    expect(r.reward, why).not.toBe(1);
    const ev = await evidenceOf('workdir-000');
    expect(ev.workspace.takenAt, why).toBe('close');
    expect(await readFile(path.join(attemptDir('workdir-000'), 'workspace', 'state.txt'), 'utf8'), why).toBe('fixed\n');
  });

  it('writers-left-running: dead before the copy; the verifier saw no growth and the same sizes as the evidence', async () => {
    const why = await describeResult('writers-left-running');
    expect(byTask.get('writers-left-running'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('writers-left-running');
    expect(ev.workspace.takenAt, why).toBe('agent-stopped');
    const seen = /seen grow=(\d+) relay=(\d+)/.exec(await readText('writers-left-running', 'verifier.stdout.txt'));
    expect(seen, why).not.toBeNull();
    const w = await walkOf('writers-left-running');
    expect(w.files.find((f) => f.rel === 'grow.log')?.size, why).toBe(Number(seen![1]));
    expect(w.files.find((f) => f.rel === 'relay.log')?.size, why).toBe(Number(seen![2]));
    // The copy holds whole lines only: no write was under way while it was taken.
    const grow = await readFile(path.join(attemptDir('writers-left-running'), 'workspace', 'grow.log'), 'utf8');
    expect(grow, why).toMatch(/^(line \d+\n)+$/);
  });

  it('after-copy-mutator: killed before the copy; no reward, and the verifier saw what the evidence shows', async () => {
    const why = await describeResult('after-copy-mutator');
    const r = byTask.get('after-copy-mutator')!;
    const ev = await evidenceOf('after-copy-mutator');
    // The sweep's own copy as a rule; a sweep that could not finish (seen once in CI, on a loaded engine)
    // falls back to the restart and the copy at close: either way the verifier must see what is kept.
    expect(['agent-stopped', 'close'], why).toContain(ev.workspace.takenAt);
    const kept = await readFile(path.join(attemptDir('after-copy-mutator'), 'workspace', 'state.txt'), 'utf8');
    const seen = /seen state=(\S*)/.exec(await readText('after-copy-mutator', 'verifier.stdout.txt'));
    expect(seen, why).not.toBeNull();
    expect(`${seen![1]}\n`, `${why}\nFOOLED: the verifier saw ${seen![1]}, the evidence holds ${kept}`).toBe(kept);
    expect(kept, why).toBe('broken\n');
    expect(r, why).toMatchObject({ status: 'failed', reward: 0 });
  });

  it('forged-tar: the planted tar changes nothing: the copy is the fleet\'s own, of the files the agent left', async () => {
    const why = await describeResult('forged-tar');
    expect(byTask.get('forged-tar'), why).toMatchObject({ status: 'passed', reward: 1 });
    const ev = await evidenceOf('forged-tar');
    expect(ev.workspace.takenAt, why).toBe('agent-stopped');
    const ws = path.join(attemptDir('forged-tar'), 'workspace');
    // The agent's real files, and none of the forgery's entries (the planted tar was never run).
    expect(await readFile(path.join(ws, 'state.txt'), 'utf8'), why).toBe('fixed\n');
    expect(await readFile(path.join(ws, 'plant-tar.sh'), 'utf8'), why).toBe(PLANT_TAR);
    const w = await walkOf('forged-tar');
    expect(w.files.map((f) => f.rel).sort(), why).toEqual(['agent.sh', 'forge.js', 'plant-tar.sh', 'state.txt']);
    expect(ev.workspace.extraction?.skipped ?? [], why).toEqual([]);
    // The canary: the victim unchanged, nothing added.
    expect(await readdir(CANARY), why).toEqual([VICTIM]);
    expect(await readFile(path.join(CANARY, VICTIM), 'utf8'), why).toBe(VICTIM_TEXT);
  });

  it('nothing named by the attacks exists outside the evidence folders (data folder, /tmp)', async () => {
    const evidenceRoot = path.join(env.dataDir, 'evidence');
    // Each episode's folder holds attempts only.
    expect((await readdir(evidenceRoot)).sort()).toEqual([...byTask.values()].map((r) => r.episodeId).sort());
    for (const r of byTask.values()) expect(await readdir(path.join(evidenceRoot, r.episodeId)), r.episodeId).toEqual(['attempt-1']);
    const insideAWorkspace = (abs: string) => /\/evidence\/[^/]+\/attempt-\d+\/workspace(\/|$)/.test(abs);
    const inData = await findNamed(env.dataDir, TOKEN, insideAWorkspace, 8);
    expect(inData).toEqual([]);
    const inTmp = await findNamed(os.tmpdir(), TOKEN, (abs) => abs === env.dataDir || abs === CANARY || insideAWorkspace(abs), 2);
    expect(inTmp).toEqual([]);
    for (const up of [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]) {
      // The climbing names of the forgery, resolved from the workspace folder as a naive extractor would.
      for (const name of [`up${up}`, `dotup${up}`, `xup${up}`, 'paxup']) {
        for (const base of [path.join(attemptDir('forged-tar'), 'workspace'), attemptDir('forged-tar')]) {
          const target = path.resolve(base, '../'.repeat(up), `${name}-${TOKEN}.txt`);
          await expect(lstat(target), target).rejects.toMatchObject({ code: 'ENOENT' });
        }
      }
    }
  });

  it('the worker takes the next episode and passes it', async () => {
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "echo fixed > state.txt" }\n', {
      next: { yaml: 'id: next\ninstruction: x\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 300\n', files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' } },
    });
    const plan = await enqueueFile(env, file);
    expect(plan.batchId).not.toBe(batchId);
    const [r] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(r).toMatchObject({ status: 'passed', reward: 1, attempts: 1 });
    await waitForNoContainers(plan.batchId);
  }, 150_000);
});

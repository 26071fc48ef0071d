// Packing and hashing a folder of many small files, in the same run: src/archive/pack-folder.ts (what
// packTask and digestTask use), the previous tar-stream packer (test/unit/legacy-pack-folder.ts: one
// file after another, a stream pipeline each), and `tar cf - DIR | sha256sum` as the floor. Figures,
// not pass/fail. Goals (issue 23): 20,000 one-byte files within 3x of tar; a 100,000-file folder
// refused or packed within 10 s.
//  1. A task whose workspace/ holds --files one-byte files: digestTask, the previous packer, tar;
//     rounds interleaved so all see the same background load. Milliseconds each (median) and the
//     ratio to tar; the longest the event loop waited during one packing.
//  2. A workspace/ of --big-files one-byte files: digestTask (refused: more than MAX_TASK_ENTRIES),
//     and packFolder with room for them all, against tar.
// Run: npx tsx bench/pack-folder.ts [--files 20000] [--big-files 100000] [--rounds 5] [--old-rounds 1]
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { packFolder } from '../src/archive/pack-folder.ts';
import { MAX_TASK_ENTRIES, TASK_PARTS, digestTask } from '../src/tasks/pack-task.ts';
import { legacyPack } from '../test/unit/legacy-pack-folder.ts';

const { values } = parseArgs({
  options: {
    files: { type: 'string', default: '20000' },
    'big-files': { type: 'string', default: '100000' },
    rounds: { type: 'string', default: '5' },
    'old-rounds': { type: 'string', default: '1' },
  },
});
const num = (name: keyof typeof values, min: number) => {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < min) throw new TypeError(`--${name}: expected an integer from ${min} up, got ${JSON.stringify(values[name])}`);
  return n;
};
const files = num('files', 1);
const bigFiles = num('big-files', 1);
const rounds = num('rounds', 1);
const oldRounds = num('old-rounds', 0);

// ---- figures --------------------------------------------------------------------------------------
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const ms = (x: number) => `${x.toFixed(0)} ms`;
const line = (label: string, xs: number[], floor: number) =>
  `${label.padEnd(34)} median ${ms(median(xs)).padStart(9)}   min ${ms(Math.min(...xs)).padStart(9)}   ${(median(xs) / floor).toFixed(2).padStart(6)}x tar   n=${xs.length}`;

async function timed<T>(work: () => Promise<T>): Promise<{ ms: number; value: T; loopMaxMs: number }> {
  const loop = monitorEventLoopDelay({ resolution: 1 });
  loop.enable();
  const started = performance.now();
  const value = await work();
  const elapsed = performance.now() - started;
  loop.disable();
  return { ms: elapsed, value, loopMaxMs: loop.max / 1e6 };
}

function tarMs(root: string): { ms: number; digest: string } {
  const started = performance.now();
  const out = execFileSync('sh', ['-c', 'tar cf - -C "$1" workspace | sha256sum', 'sh', root]).toString();
  return { ms: performance.now() - started, digest: out.split(' ')[0]! };
}

/** A task folder whose workspace/ holds `n` one-byte files (synchronous writes: setup, not measured). */
async function folderOf(n: number): Promise<string> {
  const root = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-pack-'));
  writeFileSync(path.join(root, 'task.yaml'), 'id: bench\n');
  mkdirSync(path.join(root, 'workspace'));
  for (let i = 0; i < n; i++) writeFileSync(path.join(root, 'workspace', `f${i}`), 'x');
  return root;
}

// ---- 1. a task of many small files ------------------------------------------------------------------
const small = await folderOf(files);
console.log(`1. workspace/ of ${files} one-byte files (${os.availableParallelism()} cores, load ${os.loadavg().map((l) => l.toFixed(1)).join(' ')})`);
const fast: number[] = [];
const old: number[] = [];
const tar: number[] = [];
let loopMax = 0;
let digest = '';
for (let r = 0; r < rounds; r++) {
  const t = tarMs(small);
  tar.push(t.ms);
  const packed = await timed(() => digestTask(small));
  fast.push(packed.ms);
  loopMax = Math.max(loopMax, packed.loopMaxMs);
  if (digest !== '' && digest !== packed.value) throw new Error(`digest changed between rounds: ${digest} then ${packed.value}`);
  digest = packed.value;
  if (r < oldRounds) {
    const before = await timed(() => legacyPack(small, TASK_PARTS, 32 * 1024 * 1024));
    old.push(before.ms);
    if (before.value.digest !== digest) throw new Error(`the previous packer gave ${before.value.digest}, the new one ${digest}`);
  }
}
const tarMedian = median(tar);
console.log(line('tar cf - | sha256sum', tar, tarMedian));
console.log(line('digestTask (pack-folder.ts)', fast, tarMedian));
if (old.length > 0) console.log(line('previous packer (tar-stream)', old, tarMedian));
console.log(`   same digest from both packers: ${old.length > 0 ? 'yes' : 'not compared'}; longest event-loop wait while packing: ${ms(loopMax)}`);
await rm(small, { recursive: true, force: true });

// ---- 2. a folder too big for a task ---------------------------------------------------------------
const big = await folderOf(bigFiles);
console.log(`\n2. workspace/ of ${bigFiles} one-byte files`);
const refused = await timed(() => digestTask(big).then(() => 'packed', (err: unknown) => (err as Error).message));
console.log(`   digestTask: ${ms(refused.ms)}: ${refused.value}`);
const bigTar = tarMs(big);
const bigPack = await timed(() => packFolder(big, ['task.yaml', 'workspace'], { maxBytes: 2 * 1024 ** 3, maxEntries: bigFiles + 10 }));
console.log(line('tar cf - | sha256sum', [bigTar.ms], bigTar.ms));
console.log(line('packFolder, all entries allowed', [bigPack.ms], bigTar.ms));
console.log(`   ${bigPack.value.entries} entries, ${bigPack.value.size} bytes; cap for tasks: ${MAX_TASK_ENTRIES} entries`);
await rm(big, { recursive: true, force: true });

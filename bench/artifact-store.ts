// Checkpoint durable latency and evidence upload time through the S3 artifact store (the test S3 server,
// s3rver behind a loopback proxy) against the folder store, in the same run. Figures, not pass/fail.
//  1. Checkpoints: `--checkpoints` writes, one after the other, of a ~50 KB JSON checkpoint and a 256 KB
//     workspace tar, through ObjectCheckpointStore (S3 + the Redis pointer) and through the folder
//     FolderCheckpointStore; rounds interleaved so both see the same background load. Per write: the time
//     until write() resolves (the checkpoint is durable and the newest). p50, p99 and the ratio.
//  2. Evidence: an attempt's folder of realistic size (20 files, 2 MB in all, plus a workspace snapshot
//     of 200 small files) published with EvidencePublisher to S3 and to a folder store elsewhere; rounds
//     interleaved. Milliseconds per publish and the ratio.
// Run: npx tsx bench/artifact-store.ts [--checkpoints 100] [--rounds 3] [--transcript-kb 50]
//      [--workspace-kb 256] [--evidence-rounds 5]
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { FolderStore } from '../src/artifacts/folder-store.ts';
import { S3Store } from '../src/artifacts/s3-store.ts';
import { tarBuffer } from '../src/archive/tar-buffer.ts';
import type { Checkpoint } from '../src/checkpoints/checkpoint.ts';
import type { CheckpointStorage } from '../src/checkpoints/checkpoint-storage.ts';
import { FolderCheckpointStore } from '../src/checkpoints/folder-checkpoint-store.ts';
import { ObjectCheckpointStore } from '../src/checkpoints/object-checkpoint-store.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { EvidencePublisher } from '../src/evidence/publish-evidence.ts';
import { startS3Server } from '../test/helpers/s3-server.ts';

const { values } = parseArgs({
  options: {
    checkpoints: { type: 'string', default: '100' },
    rounds: { type: 'string', default: '3' },
    'transcript-kb': { type: 'string', default: '50' },
    'workspace-kb': { type: 'string', default: '256' },
    'evidence-rounds': { type: 'string', default: '5' },
  },
});
const num = (name: keyof typeof values) => {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`--${name}: expected an integer from 1 up, got ${JSON.stringify(values[name])}`);
  return n;
};
const perRound = Math.ceil(num('checkpoints') / num('rounds'));
const rounds = num('rounds');
const transcriptBytes = num('transcript-kb') * 1024;
const workspaceBytes = num('workspace-kb') * 1024;
const evidenceRounds = num('evidence-rounds');
const silent = pino({ level: 'silent' });

// ---- figures --------------------------------------------------------------------------------------
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
};
const ms = (x: number) => `${x.toFixed(1)} ms`;
const line = (label: string, xs: number[]) => `${label.padEnd(28)} p50 ${ms(pct(xs, 50)).padStart(9)}   p99 ${ms(pct(xs, 99)).padStart(9)}   max ${ms(Math.max(...xs)).padStart(9)}   n=${xs.length}`;

// ---- the bytes ------------------------------------------------------------------------------------
function checkpointOf(episodeId: string, seq: number, tarBytes: number): Checkpoint {
  const messages: unknown[] = [{ role: 'user', content: 'fix the failing test' }];
  while (messages.length * 1_000 < transcriptBytes) messages.push({ role: 'assistant', content: `turn ${messages.length}: ${'x'.repeat(960)}` });
  return {
    episodeId, seq, turn: seq, messages,
    usage: { promptTokens: 1_000 * seq, completionTokens: 100 * seq, totalTokens: 1_100 * seq },
    agentMs: 2_000 * seq, createdAt: new Date().toISOString(),
    workspace: { captured: true, file: 'workspace.tar', bytes: tarBytes, sha256: tarSha },
  } as Checkpoint;
}
const body = Buffer.alloc(workspaceBytes - 3 * 512 - 1024, 'a');
const workspace = await tarBuffer((pack) => {
  pack.entry({ name: 'workspace/', type: 'directory' });
  pack.entry({ name: 'workspace/state.bin', size: body.length }, body);
});
const tarSha = createHash('sha256').update(workspace).digest('hex');

// ---- set-up ---------------------------------------------------------------------------------------
const root = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-art-'));
const s3 = await startS3Server();
const redis = await startPrivateRedis({ durable: true });
const client = new Redis(redis.url, { maxRetriesPerRequest: null });
const s3Store = S3Store.fromUrl(`s3://${s3.bucket}/bench`, s3.env);
const folderStoreDir = path.join(root, 'artifacts');
await mkdir(folderStoreDir, { recursive: true });
const folderStore = new FolderStore(folderStoreDir);

try {
  // ---- 1. checkpoints -----------------------------------------------------------------------------
  const stores: { label: string; store: CheckpointStorage; latencies: number[] }[] = [
    { label: 'checkpoint, S3 store', store: new ObjectCheckpointStore(s3Store, client, 'bench'), latencies: [] },
    { label: 'checkpoint, folder store', store: new FolderCheckpointStore(new FolderStore(path.join(root, 'cp-folder'))), latencies: [] },
  ];
  // One warm-up write each (connections, folders), not counted.
  for (const s of stores) await s.store.write(checkpointOf('warm-up', 0, workspace.length), workspace);
  for (let round = 0; round < rounds; round++) {
    for (const s of round % 2 === 0 ? stores : [...stores].reverse()) {
      for (let i = 0; i < perRound; i++) {
        const seq = round * perRound + i;
        const cp = checkpointOf(`bench-${i % 4}`, seq, workspace.length);
        const t = performance.now();
        const r = await s.store.write(cp, workspace);
        s.latencies.push(performance.now() - t);
        if (r.outcome !== 'written') throw new Error(`${s.label}: seq ${seq} ${r.outcome}`);
      }
    }
  }
  const jsonKb = Math.round(Buffer.byteLength(JSON.stringify(checkpointOf('e', 1, workspace.length))) / 1024);
  console.log(`\ncheckpoints: ${perRound * rounds} per store, one at a time, ${jsonKb} KB JSON + ${Math.round(workspace.length / 1024)} KB tar each, ${rounds} interleaved rounds`);
  for (const s of stores) console.log(line(s.label, s.latencies));
  const [s3Cp, folderCp] = stores.map((s) => s.latencies);
  console.log(`ratio S3 / folder             p50 ${(pct(s3Cp!, 50) / pct(folderCp!, 50)).toFixed(2)}x   p99 ${(pct(s3Cp!, 99) / pct(folderCp!, 99)).toFixed(2)}x`);

  // ---- 2. evidence --------------------------------------------------------------------------------
  const dataDir = path.join(root, 'data');
  let evidenceBytes = 0;
  let evidenceFiles = 0;
  async function makeAttempt(episodeId: string): Promise<string> {
    const rel = `evidence/${episodeId}/attempt-1`;
    const dir = path.join(dataDir, rel);
    await mkdir(path.join(dir, 'workspace', 'src'), { recursive: true });
    let bytes = 0;
    let files = 0;
    // 20 files, 2 MB in all: outputs, model calls, trajectory, diff (a few big, most small).
    const sizes = [640, 512, 384, 256, 128, 64, 32, 16, 8, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1].map((kb) => kb * 1024);
    const scale = (2 * 1024 * 1024) / sizes.reduce((a, b) => a + b, 0);
    for (const [i, size] of sizes.entries()) {
      const n = Math.round(size * scale);
      await writeFile(path.join(dir, `file-${i}.txt`), randomBytes(Math.ceil(n / 2)).toString('hex').slice(0, n));
      bytes += n;
      files += 1;
    }
    // A workspace snapshot of 200 small files.
    for (let i = 0; i < 200; i++) {
      const n = 200 + (i * 37) % 3_000;
      await writeFile(path.join(dir, 'workspace', i % 2 ? 'src' : '', `f${i}.txt`), 'y'.repeat(n));
      bytes += n;
      files += 1;
    }
    evidenceBytes = bytes;
    evidenceFiles = files;
    return rel;
  }
  const publishers = [
    { label: 'evidence, S3 store', publisher: new EvidencePublisher(s3Store, dataDir, silent), times: [] as number[] },
    { label: 'evidence, folder store', publisher: new EvidencePublisher(folderStore, dataDir, silent), times: [] as number[] },
  ];
  await publishers[0]!.publisher.publish(await makeAttempt('warm-up'), AbortSignal.timeout(60_000));
  await publishers[1]!.publisher.publish(await makeAttempt('warm-up'), AbortSignal.timeout(60_000));
  for (let round = 0; round < evidenceRounds; round++) {
    for (const p of round % 2 === 0 ? publishers : [...publishers].reverse()) {
      const rel = await makeAttempt(`ep-${round}-${p.label.includes('S3') ? 's3' : 'folder'}`);
      const t = performance.now();
      const out = await p.publisher.publish(rel, AbortSignal.timeout(120_000));
      p.times.push(performance.now() - t);
      if (out.files !== evidenceFiles) throw new Error(`${p.label}: ${out.files} files published, expected ${evidenceFiles}`);
    }
  }
  console.log(`\nevidence: ${evidenceFiles} files, ${(evidenceBytes / 1024 / 1024).toFixed(2)} MB per attempt, ${evidenceRounds} interleaved rounds`);
  for (const p of publishers) console.log(line(p.label, p.times));
  const [s3Ev, folderEv] = publishers.map((p) => p.times);
  console.log(`ratio S3 / folder             p50 ${(pct(s3Ev!, 50) / pct(folderEv!, 50)).toFixed(2)}x`);
} finally {
  s3Store.destroy();
  await client.quit();
  await redis.stop();
  await s3.stop();
  await rm(root, { recursive: true, force: true });
}

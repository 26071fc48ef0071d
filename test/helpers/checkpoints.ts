// Fixtures for the checkpoint pipeline: realistic offers (a transcript of a given size), real tar
// archives shaped like getArchive(workdir) output, and counts of what an episode holds in Redis.
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import type { Redis } from 'ioredis';
import { CHECKPOINTS_QUEUE } from '../../queues/checkpoints/contract.ts';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import type { CheckpointOffer } from '../../src/checkpoints/checkpoint.ts';
import { bullmqJobKey, checkpointStagedKeyPrefix } from '../../src/redis/redis-keys.ts';

/** A checkpoint offer whose transcript is about `transcriptBytes` of JSON. */
export function offerOf(episodeId: string, seq: number, transcriptBytes = 2_000, note = ''): CheckpointOffer {
  const turns = Math.max(1, Math.round(transcriptBytes / 1_000));
  const messages: unknown[] = [{ role: 'user', content: `task of ${episodeId}${note}` }];
  for (let i = 0; i < turns; i++) messages.push({ role: 'assistant', content: `turn ${i}: ${'x'.repeat(960)}` });
  return { episodeId, seq, turn: seq, messages, usage: { promptTokens: 100 * seq, completionTokens: 10 * seq, totalTokens: 110 * seq }, agentMs: 1_000 * seq };
}

/** A tar of `workspace/` with one file, about `bytes` long (what getArchive('/workspace') returns). */
export async function workspaceTar(bytes: number, seed = 0): Promise<Buffer> {
  const content = Buffer.alloc(Math.max(0, bytes - 3 * 512 - 1024), 97 + (seed % 26));
  return tarBuffer((pack) => {
    pack.entry({ name: 'workspace/', type: 'directory', mode: 0o755 });
    pack.entry({ name: 'workspace/state.bin', size: content.length, mode: 0o644 }, content);
  });
}

/** A stream of `data` in 64 KiB chunks, as a Docker archive stream arrives. */
export function streamOf(data: Buffer): Readable {
  const parts: Buffer[] = [];
  for (let at = 0; at < data.length; at += 64 * 1024) parts.push(data.subarray(at, at + 64 * 1024));
  return Readable.from(parts, { objectMode: false });
}

export const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    keys.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return keys;
}

/** Checkpoint jobs (their hashes, any state) and staged checkpoints of an episode, counted in Redis itself. */
export async function redisHoldings(redis: Redis, prefix: string, episodeId: string): Promise<{ jobs: number; staged: number }> {
  const jobKey = new RegExp(`^${bullmqJobKey(prefix, CHECKPOINTS_QUEUE, episodeId).replace(/\./g, '\\.')}\\.cp\\d+$`);
  const jobs = (await scanKeys(redis, bullmqJobKey(prefix, CHECKPOINTS_QUEUE, `${episodeId}.cp*`))).filter((k) => jobKey.test(k)).length;
  const staged = (await scanKeys(redis, `${checkpointStagedKeyPrefix(prefix)}${episodeId}.cp*`)).length;
  return { jobs, staged };
}

/** Every staged checkpoint under a prefix. */
export async function allStaged(redis: Redis, prefix: string): Promise<string[]> {
  return scanKeys(redis, `${checkpointStagedKeyPrefix(prefix)}*`);
}

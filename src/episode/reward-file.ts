// A Harbor verifier's reward, read as Harbor v0.22.0 reads it (H:verifier/verifier.py):
// /logs/verifier/reward.json (an object of numbers, any keys) before reward.txt (one float); the test
// script's exit code is ignored. No file, an empty file or a value that is not a number is an error of
// the verifier (kind verifier, never retried), not a 0: a grader that could not grade gives no reward.
import { posix } from 'node:path';
import tar from 'tar-stream';
import { FleetError } from '../errors/fleet-error.ts';
import { dockerStatusOf } from '../sandbox/docker-client.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';

/** What a verifier's reward files say: the main reward and every metric (reward.json's keys; reward.txt's is "reward"). */
export interface Reward {
  reward: number;
  metrics: Record<string, number>;
}

/** A reward file larger than this is not a reward: it is refused, not parsed. */
export const MAX_REWARD_FILE_BYTES = 64 * 1024;
/** reward.json keys kept as metrics; more is refused (one number per key, shown in every summary). */
export const MAX_REWARD_METRICS = 64;

const NUMBER = /^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$/;

function invalid(file: string, why: string): FleetError {
  return new FleetError('reward_file_invalid', `the verifier's ${file} ${why}`);
}

/**
 * The main reward of reward.json's metrics: its `reward` key when it has one, else the only value,
 * else the mean of all of them (documented in docs/HARBOR.md). Harbor itself keeps the object whole.
 */
export function mainReward(metrics: Record<string, number>): number {
  if (metrics.reward !== undefined) return metrics.reward;
  const values = Object.values(metrics);
  return values.reduce((a, b) => a + b, 0) / values.length;
}

/** The reward of the files a verifier left (undefined: the file is not there). */
export function readReward(files: { json?: Buffer | undefined; txt?: Buffer | undefined }): Reward {
  if (files.json !== undefined) return fromJson(files.json);
  if (files.txt !== undefined) return fromTxt(files.txt);
  throw new FleetError('reward_file_missing', 'the verifier wrote neither /logs/verifier/reward.json nor /logs/verifier/reward.txt: it could not grade the episode');
}

function fromTxt(data: Buffer): Reward {
  if (data.length > MAX_REWARD_FILE_BYTES) throw invalid('reward.txt', `is larger than ${MAX_REWARD_FILE_BYTES} bytes (got ${data.length} bytes)`);
  const text = data.toString('utf8').trim();
  if (text === '') throw new FleetError('reward_file_empty', "the verifier's reward.txt is empty");
  if (!NUMBER.test(text)) throw invalid('reward.txt', `holds no number (got ${text.length > 40 ? `${text.length} characters` : JSON.stringify(text)})`);
  const reward = Number(text);
  if (!Number.isFinite(reward)) throw invalid('reward.txt', `holds no finite number (got ${JSON.stringify(text)})`);
  return { reward, metrics: { reward } };
}

function fromJson(data: Buffer): Reward {
  if (data.length > MAX_REWARD_FILE_BYTES) throw invalid('reward.json', `is larger than ${MAX_REWARD_FILE_BYTES} bytes (got ${data.length} bytes)`);
  const text = data.toString('utf8').trim();
  if (text === '') throw new FleetError('reward_file_empty', "the verifier's reward.json is empty");
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw invalid('reward.json', 'is not valid JSON');
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw invalid('reward.json', `is not an object of numbers (got ${Array.isArray(value) ? 'a list' : value === null ? 'null' : `a ${typeof value}`})`);
  }
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length === 0) throw invalid('reward.json', 'is an empty object: it names no reward');
  if (entries.length > MAX_REWARD_METRICS) throw invalid('reward.json', `has more than ${MAX_REWARD_METRICS} keys (got ${entries.length})`);
  const metrics: Record<string, number> = {};
  for (const [key, v] of entries) {
    if (key.length > 100 || !/^[\w.:/-]+$/.test(key)) throw invalid('reward.json', `has a key that is not a metric name (letters, digits, _ . : / -, at most 100 characters)`);
    if (typeof v !== 'number' || !Number.isFinite(v)) throw invalid('reward.json', `key ${JSON.stringify(key)} is not a finite number (got ${v === null ? 'null' : typeof v})`);
    metrics[key] = v;
  }
  return { reward: mainReward(metrics), metrics };
}

/** Where a Harbor verifier writes its reward, inside the sandbox. */
export const REWARD_FILES = { json: '/logs/verifier/reward.json', txt: '/logs/verifier/reward.txt' } as const;

/** The one regular file at `path` in the sandbox, read through the engine (no tool of the image runs); undefined if there is none. */
async function readSandboxFile(session: Pick<SandboxSession, 'getArchive'>, file: string, signal: AbortSignal): Promise<Buffer | undefined> {
  let stream;
  try {
    stream = await session.getArchive(file, signal);
  } catch (err) {
    if (dockerStatusOf(err) === 404) return undefined;
    throw err;
  }
  const extract = tar.extract();
  stream.pipe(extract);
  try {
    for await (const entry of extract) {
      if (entry.header.type !== 'file') {
        entry.resume();
        throw invalid(posix.basename(file), `is not a regular file (a ${entry.header.type ?? 'special entry'})`);
      }
      // One byte past the cap is enough to refuse it; the rest is never read into memory.
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of entry as AsyncIterable<Buffer>) {
        if (size <= MAX_REWARD_FILE_BYTES) chunks.push(chunk);
        size += chunk.length;
      }
      return Buffer.concat(chunks).subarray(0, MAX_REWARD_FILE_BYTES + 1);
    }
    return undefined;
  } finally {
    stream.destroy();
    extract.destroy();
  }
}

/** The reward the verifier left in the sandbox's /logs/verifier (reward.json first). */
export async function readSandboxReward(session: Pick<SandboxSession, 'getArchive'>, signal: AbortSignal): Promise<Reward> {
  const json = await readSandboxFile(session, REWARD_FILES.json, signal);
  const txt = json === undefined ? await readSandboxFile(session, REWARD_FILES.txt, signal) : undefined;
  return readReward({ json, txt });
}

// What FLEET_ARTIFACTS may say, parsed in one place for the config's check and for openArtifactStore:
// `s3://<bucket>[/prefix]` or an absolute folder path. Also the error every store throws for a failed
// call, naming the operation and the key, and the key checks of the calls that take no folder.
import path from 'node:path';
import { checkKey } from './artifact-store.ts';

export type ArtifactsLocation = { kind: 's3'; bucket: string; prefix: string } | { kind: 'folder'; path: string };

/** S3's rules for a bucket name: 3-63 of a-z 0-9 . -, starting and ending with a letter or digit, no `..`, not an IP address. */
const BUCKET = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
/** A prefix: `/`-separated segments of the key characters (see checkKey), no `.` or `..` segment. */
const PREFIX_SEGMENT = /^[A-Za-z0-9_+=@,-][A-Za-z0-9._+=@,-]*$/;

/** The location, or a TypeError saying what is wrong with it (the caller names the variable). */
export function parseArtifactsLocation(value: string): ArtifactsLocation {
  if (value.startsWith('s3://')) {
    const rest = value.slice('s3://'.length);
    const slash = rest.indexOf('/');
    const bucket = slash === -1 ? rest : rest.slice(0, slash);
    if (!BUCKET.test(bucket) || bucket.includes('..') || /^\d+\.\d+\.\d+\.\d+$/.test(bucket)) {
      throw new TypeError(`must be s3://<bucket>[/prefix] with a valid bucket name (3-63 of a-z 0-9 . -), got bucket ${JSON.stringify(bucket)}`);
    }
    const segments = slash === -1 ? [] : rest.slice(slash + 1).split('/').filter((s, i, all) => !(s === '' && i === all.length - 1));
    if (segments.some((s) => !PREFIX_SEGMENT.test(s)) || segments.join('/').length > 512) {
      throw new TypeError('must be s3://<bucket>[/prefix] with a prefix of letters, digits and . _ + = @ , - between slashes');
    }
    return { kind: 's3', bucket, prefix: segments.length === 0 ? '' : `${segments.join('/')}/` };
  }
  if (path.isAbsolute(value) && !value.includes('\0')) return { kind: 'folder', path: path.resolve(value) };
  throw new TypeError('must be s3://<bucket>[/prefix] or an absolute folder path');
}

/** A store call that failed for another reason than its signal: names the store, the operation and the key. */
export class ArtifactStoreError extends Error {
  override readonly name = 'ArtifactStoreError';
  constructor(
    readonly operation: string,
    readonly key: string,
    readonly location: string,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super(`artifact store ${location}: ${operation} of ${JSON.stringify(key)} failed: ${detail}`, options);
  }
}

/** A key naming an object (not a `.../` folder). */
export function checkObjectKey(key: string): string {
  checkKey(key);
  if (key.endsWith('/')) throw new TypeError(`Expected an artifact key naming an object, got the folder ${JSON.stringify(key)}`);
  return key;
}

/** A prefix for list: empty (everything) or a key or folder. */
export function checkPrefix(prefix: string): string {
  return prefix === '' ? prefix : checkKey(prefix);
}


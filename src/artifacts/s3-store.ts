// The artifact store on an S3-compatible object store: key `a/b` is the object `<prefix>a/b` of the
// bucket. Built from `s3://bucket/prefix` and the usual AWS variables: AWS_ENDPOINT_URL_S3 or
// AWS_ENDPOINT_URL (another S3-compatible server; path-style addressing then), AWS_REGION (default
// us-east-1), AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (unset: the SDK's own
// chain: profile, instance role). Every request takes the call's signal; an aborted call rejects with
// the signal's reason. Any other failure is an ArtifactStoreError naming the operation, the key and the
// S3 error, never the secret key. A missing object is undefined, not an error.
import {
  DeleteObjectsCommand,
  GetObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  type S3ClientConfig,
} from '@aws-sdk/client-s3';
import { addAbortSignal, type Readable } from 'node:stream';
import { ArtifactStoreError, checkObjectKey, checkPrefix, parseArtifactsLocation } from './artifacts-location.ts';
import { checkKey, type ArtifactStore } from './artifact-store.ts';

/** DeleteObjects takes at most this many keys a request. */
const DELETE_BATCH = 1000;

export interface S3StoreOptions {
  bucket: string;
  /** '' or `.../` */
  prefix: string;
  endpoint?: string;
  region?: string;
  credentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
  /** Attempts of one request (the SDK retries connection errors, throttling and 5xx with backoff). @default 3 */
  maxAttempts?: number;
}

export class S3Store implements ArtifactStore {
  readonly kind = 's3' as const;
  readonly location: string;
  readonly bucket: string;
  readonly prefix: string;
  private readonly client: S3Client;
  /** Never shown: removed from any message that would carry it. */
  private readonly secrets: string[];

  /** `s3://bucket/prefix` with the AWS variables of `env`. */
  static fromUrl(url: string, env: NodeJS.ProcessEnv = process.env): S3Store {
    const parsed = parseArtifactsLocation(url);
    if (parsed.kind !== 's3') throw new TypeError(`Expected s3://<bucket>[/prefix], got ${JSON.stringify(url)}`);
    const endpoint = env.AWS_ENDPOINT_URL_S3 || env.AWS_ENDPOINT_URL || undefined;
    const { AWS_ACCESS_KEY_ID: accessKeyId, AWS_SECRET_ACCESS_KEY: secretAccessKey, AWS_SESSION_TOKEN: sessionToken } = env;
    return new S3Store({
      bucket: parsed.bucket,
      prefix: parsed.prefix,
      region: env.AWS_REGION || env.AWS_DEFAULT_REGION || 'us-east-1',
      ...(endpoint ? { endpoint } : {}),
      ...(accessKeyId && secretAccessKey ? { credentials: { accessKeyId, secretAccessKey, ...(sessionToken ? { sessionToken } : {}) } } : {}),
    });
  }

  constructor(opts: S3StoreOptions) {
    this.bucket = opts.bucket;
    this.prefix = opts.prefix;
    this.location = `s3://${opts.bucket}/${opts.prefix}`;
    this.secrets = [opts.credentials?.secretAccessKey, opts.credentials?.sessionToken].filter((s): s is string => !!s && s.length >= 4);
    const config: S3ClientConfig = {
      region: opts.region ?? 'us-east-1',
      maxAttempts: opts.maxAttempts ?? 3,
      // Checksums only where S3 requires them (DeleteObjects): the payload's SHA-256 is signed anyway,
      // and S3-compatible servers that predate the SDK's default CRC32 checksums refuse them.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    };
    if (opts.endpoint) {
      config.endpoint = opts.endpoint;
      config.forcePathStyle = true;
    }
    if (opts.credentials) config.credentials = opts.credentials;
    this.client = new S3Client(config);
  }

  async put(key: string, body: Uint8Array | string, opts: { signal: AbortSignal; contentType?: string }): Promise<void> {
    checkObjectKey(key);
    const bytes = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
    await this.send('PutObject', key, opts.signal, (o) => this.client.send(new PutObjectCommand({
      Bucket: this.bucket,
      Key: this.prefix + key,
      Body: bytes,
      ContentLength: bytes.byteLength,
      ContentType: opts.contentType ?? 'application/octet-stream',
    }), o));
  }

  async get(key: string, opts: { signal: AbortSignal; maxBytes?: number }): Promise<Uint8Array | undefined> {
    checkObjectKey(key);
    const body = await this.getBody(key, opts.signal, opts.maxBytes);
    if (body === undefined) return undefined;
    const chunks: Buffer[] = [];
    let total = 0;
    try {
      for await (const chunk of addAbortSignal(opts.signal, body) as AsyncIterable<Buffer>) {
        total += chunk.length;
        if (opts.maxBytes !== undefined && total > opts.maxBytes) {
          body.destroy();
          throw this.fail('GetObject', key, `the object is more than the ${opts.maxBytes} bytes allowed`);
        }
        chunks.push(chunk);
      }
    } catch (err) {
      body.destroy();
      if (opts.signal.aborted) throw opts.signal.reason;
      if (err instanceof ArtifactStoreError) throw err;
      throw this.fail('GetObject', key, `reading the body: ${this.describe(err)}`, err);
    }
    const data = Buffer.concat(chunks, total);
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  }

  async open(key: string, opts: { signal: AbortSignal }): Promise<Readable | undefined> {
    checkObjectKey(key);
    const body = await this.getBody(key, opts.signal);
    // Past open, the stream itself stops (with an AbortError) when the signal aborts.
    return body === undefined ? undefined : addAbortSignal(opts.signal, body);
  }

  async list(prefix: string, opts: { signal: AbortSignal }): Promise<{ key: string; bytes: number }[]> {
    checkPrefix(prefix);
    const found: { key: string; bytes: number }[] = [];
    let token: string | undefined;
    do {
      const page = await this.send('ListObjectsV2', prefix, opts.signal, (o) => this.client.send(new ListObjectsV2Command({
        Bucket: this.bucket,
        Prefix: this.prefix + prefix,
        ...(token ? { ContinuationToken: token } : {}),
      }), o));
      for (const o of page.Contents ?? []) {
        if (o.Key === undefined || !o.Key.startsWith(this.prefix)) continue;
        found.push({ key: o.Key.slice(this.prefix.length), bytes: o.Size ?? 0 });
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return found.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }

  async deletePrefix(prefix: string, opts: { signal: AbortSignal }): Promise<void> {
    checkKey(prefix);
    // A key removes that object only; a `.../` folder, every object whose key starts with it.
    const keys = (await this.list(prefix, opts)).map((o) => o.key).filter((k) => prefix.endsWith('/') || k === prefix);
    for (let i = 0; i < keys.length; i += DELETE_BATCH) {
      const batch = keys.slice(i, i + DELETE_BATCH);
      const out = await this.send('DeleteObjects', batch.length === 1 ? batch[0]! : prefix, opts.signal, (o) => this.client.send(new DeleteObjectsCommand({
        Bucket: this.bucket,
        Delete: { Objects: batch.map((k) => ({ Key: this.prefix + k })), Quiet: true },
      }), o));
      const errors = out.Errors ?? [];
      if (errors.length > 0) {
        const first = errors[0]!;
        throw this.fail('DeleteObjects', first.Key?.slice(this.prefix.length) ?? prefix, `${errors.length} of ${batch.length} objects not deleted, the first: ${first.Code ?? ''} ${first.Message ?? ''}`.trim());
      }
    }
  }

  /** Close the client's sockets (a store made for one command, a test). */
  destroy(): void {
    this.client.destroy();
  }

  /** The GetObject body, undefined when there is no object; refuses one bigger than `maxBytes` by its length. */
  private async getBody(key: string, signal: AbortSignal, maxBytes?: number): Promise<Readable | undefined> {
    let out;
    try {
      out = await this.send('GetObject', key, signal, (o) => this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: this.prefix + key }), o), true);
    } catch (err) {
      if (err === missing) return undefined;
      throw err;
    }
    const body = out.Body as Readable | undefined;
    if (body === undefined) return undefined;
    if (maxBytes !== undefined && out.ContentLength !== undefined && out.ContentLength > maxBytes) {
      body.destroy();
      throw this.fail('GetObject', key, `the object is ${out.ContentLength} bytes, more than the ${maxBytes} allowed`);
    }
    return body;
  }

  /** One request, with the call's signal; its errors named (a missing object: the `missing` symbol, when asked). */
  private async send<T>(operation: string, key: string, signal: AbortSignal, request: (opts: { abortSignal: AbortSignal }) => Promise<T>, missingIsUndefined = false): Promise<T> {
    signal.throwIfAborted();
    try {
      return await request({ abortSignal: signal });
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      const e = err as { name?: string; $metadata?: { httpStatusCode?: number } };
      if (missingIsUndefined && (e.name === 'NoSuchKey' || (e.$metadata?.httpStatusCode === 404 && e.name !== 'NoSuchBucket'))) throw missing;
      throw this.fail(operation, key, this.describe(err), err);
    }
  }

  private describe(err: unknown): string {
    const e = err as { name?: string; code?: string; message?: string; $metadata?: { httpStatusCode?: number } };
    const status = e.$metadata?.httpStatusCode;
    return `${e.name ?? e.code ?? 'Error'}${status ? ` (HTTP ${status})` : ''}: ${e.message ?? String(err)}`;
  }

  private fail(operation: string, key: string, detail: string, cause?: unknown): ArtifactStoreError {
    let text = detail;
    for (const s of this.secrets) text = text.split(s).join('***');
    return new ArtifactStoreError(operation, key, this.location, text, cause === undefined ? undefined : { cause });
  }
}

/** Thrown inside send for a missing object, turned into undefined by the caller. */
const missing = Symbol('missing object');

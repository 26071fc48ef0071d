// The tests' S3 server, run as its own process by s3-server.ts: @20minutes/s3rver (a fake S3 on Koa
// that keeps objects in a folder) on a loopback port, with one bucket and one key pair. Started with
// --openssl-legacy-provider: s3rver makes ListObjectsV2 continuation tokens with DES, which Node 20's
// OpenSSL 3 refuses otherwise (every second page would be a 500). It prints `{"port":N}` when ready
// and exits when its standard input closes (its test is gone).
//
// One fix of s3rver's signature check: it canonicalizes a bucket's URI as `/bucket`, while the
// AWS SDK v3 now signs bucket requests (ListObjectsV2, DeleteObjects) as `/bucket/`, so every such
// request would be a SignatureDoesNotMatch. The string to sign is also tried with the trailing slash,
// and taken when the signature made with the account's secret matches: signatures are still checked.
import { createHmac } from 'node:crypto';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const S3rver = require('@20minutes/s3rver');
const v4 = require('@20minutes/s3rver/lib/signature/v4.js');
const { DUMMY_ACCOUNT } = require('@20minutes/s3rver/lib/models/account.js');

interface Canonical { uri: string }
interface SigRequest { accessKeyId: string; signatureProvided: string; credential: { date: string; region: string; service: string } }

const { S3_TEST_DIR: directory, S3_TEST_BUCKET: bucket, S3_TEST_KEY_ID: keyId, S3_TEST_SECRET: secret } = process.env;
if (!directory || !bucket || !keyId || !secret) throw new Error('S3_TEST_DIR, S3_TEST_BUCKET, S3_TEST_KEY_ID and S3_TEST_SECRET are required');

DUMMY_ACCOUNT.createKeyPair(keyId, secret);

const getStringToSign = v4.getStringToSign as (c: Canonical, r: SigRequest) => string;
v4.getStringToSign = (canonical: Canonical, request: SigRequest): string => {
  const plain = getStringToSign(canonical, request);
  if (!/^\/[^/]+$/.test(canonical.uri)) return plain;
  const slashed = getStringToSign({ ...canonical, uri: `${canonical.uri}/` }, request);
  const accountSecret = DUMMY_ACCOUNT.accessKeys.get(request.accessKeyId) as string | undefined;
  if (accountSecret === undefined) return plain;
  const { date, region, service } = request.credential;
  const signingKey = v4.getSigningKey(accountSecret, date, region, service) as Buffer;
  return createHmac('sha256', signingKey).update(slashed, 'utf8').digest('hex') === request.signatureProvided ? slashed : plain;
};

const server = new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory, configureBuckets: [{ name: bucket }] });
const address = (await server.run()) as { port: number };
process.stdout.write(`${JSON.stringify({ port: address.port })}\n`);
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
process.stdin.on('close', () => process.exit(0));

// A second host's time to have an environment ready: pulled from the registry (FLEET_REGISTRY) that
// the first host pushed it to, against building it itself (no registry), in the same run. Two private
// Docker engines on this machine (test/helpers/second-engine.ts, so the shared engine's images and
// build cache are never touched) stand for host A and host B, a real registry (Debian's
// docker-registry) runs on loopback (test/helpers/registry.ts), and a private Redis holds the locks
// and the pushed manifests' digests. The fixture environment (FROM the busybox sandbox image both
// engines have): a step that writes `--mb` MB of random bytes (the installed files) and one that
// loops `--work` thousand times in sh (the work of an install), so a build costs both time and bytes.
//
// Each round uses a fresh environment (a nonce in its Dockerfile: nothing cached): host A builds and
// pushes it (timed apart); on host B, in alternating order, (a) ensureEnvironmentImage with the
// registry: the recorded digest read, the pull, the tag; (b) ensureEnvironmentImage without a registry:
// the build. Between the two B's image is removed and its build cache pruned (a private engine), so
// neither helps the other. Time-to-ready is the call's own `readyMs` (from the call to the image being
// there). Prints each round, the medians and the ratio build / pull.
// Run: npx tsx bench/registry-pull.ts [--rounds 3] [--mb 64] [--work 300]
import { createHash, randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { tarBuffer } from '../src/archive/tar-buffer.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { ensureEnvironmentImage, type EnvironmentImage } from '../src/environments/image-build.ts';
import type { Docker } from '../src/sandbox/docker-client.ts';
import { DEFAULT_IMAGE } from '../src/tasks/task-spec.ts';
import { startRegistry } from '../test/helpers/registry.ts';
import { createSecondEngine } from '../test/helpers/second-engine.ts';
import { intOption } from './command-batch.ts';

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '3' }, mb: { type: 'string', default: '64' }, work: { type: 'string', default: '300' } } });
const rounds = intOption(values, 'rounds');
const mb = intOption(values, 'mb');
const work = intOption(values, 'work', 0);

const log = pino({ level: 'silent' });
const redisServer = await startPrivateRedis();
const redis = new Redis(redisServer.url, { maxRetriesPerRequest: null });
const registry = await startRegistry();
process.stderr.write('starting two private engines (host A, host B)...\n');
const hostA = await createSecondEngine();
const hostB = await createSecondEngine();
const prefix = `bench${randomBytes(3).toString('hex')}`;

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
};

async function dropImage(engine: Docker, image: string): Promise<void> {
  await engine.getImage(image).remove({ force: true }).catch(() => undefined);
  await (engine.pruneBuilder as (o: object) => Promise<unknown>).call(engine, { all: true });
}

const results: { round: number; pushMs: number; buildAMs: number; pullMs: number; buildMs: number; order: string }[] = [];
try {
  for (let round = 1; round <= rounds; round += 1) {
    const nonce = randomBytes(8).toString('hex');
    const dockerfile = [
      `FROM ${DEFAULT_IMAGE}`,
      `RUN echo ${nonce} > /etc/nonce && mkdir -p /opt/env && dd if=/dev/urandom of=/opt/env/files bs=1M count=${mb} 2>/dev/null`,
      `RUN i=0; while [ $i -lt ${work * 1000} ]; do i=$((i+1)); done; echo $i > /opt/env/done`,
      '',
    ].join('\n');
    const context = await tarBuffer((pack) => pack.entry({ name: 'Dockerfile', mode: 0o644 }, dockerfile));
    const digest = createHash('sha256').update(context).digest('hex');
    const spec = { context, digest, timeoutSec: 600 };
    const shared = { redis, prefix, log, registry: registry.address };

    const a = await ensureEnvironmentImage({ ...shared, docker: hostA.docker }, spec);
    const pushMs = a.pushMs ?? 0;
    if (!a.built || a.pushed === undefined) throw new Error(`round ${round}: host A did not build and push (${JSON.stringify({ built: a.built, pushed: a.pushed })})`);

    const pull = async (): Promise<EnvironmentImage> => {
      const r = await ensureEnvironmentImage({ ...shared, docker: hostB.docker }, spec);
      if (!r.pulled || r.imageId !== a.imageId) throw new Error(`round ${round}: host B did not pull A's image`);
      return r;
    };
    // Without a registry (and another prefix: no record, no lock shared with the pull).
    const build = async (): Promise<EnvironmentImage> => {
      const r = await ensureEnvironmentImage({ redis, prefix: `${prefix}-own`, log, docker: hostB.docker }, spec);
      if (!r.built) throw new Error(`round ${round}: host B did not build`);
      return r;
    };
    const pullFirst = round % 2 === 1;
    let pulled: EnvironmentImage;
    let built: EnvironmentImage;
    if (pullFirst) {
      pulled = await pull();
      await dropImage(hostB.docker, pulled.image);
      built = await build();
    } else {
      built = await build();
      await dropImage(hostB.docker, built.image);
      pulled = await pull();
    }
    await dropImage(hostB.docker, pulled.image);
    await dropImage(hostA.docker, a.image);
    const row = { round, pushMs, buildAMs: a.readyMs - pushMs, pullMs: pulled.readyMs, buildMs: built.readyMs, order: pullFirst ? 'pull, build' : 'build, pull' };
    results.push(row);
    process.stderr.write(`round ${round} (${row.order}): host A built in ${row.buildAMs} ms and pushed in ${row.pushMs} ms; host B ready by pull ${row.pullMs} ms, by its own build ${row.buildMs} ms\n`);
  }
} finally {
  await hostB.destroy();
  await hostA.destroy();
  await registry.destroy();
  await redis.quit();
  await redisServer.stop();
}

const pullMs = median(results.map((r) => r.pullMs));
const buildMs = median(results.map((r) => r.buildMs));
console.log(`\nfixture environment: ${mb} MB of files, ${work}k shell iterations; ${rounds} rounds, two private engines, registry on loopback`);
console.log('| host B time-to-ready | median ms |');
console.log('|---|---|');
console.log(`| pulled by digest (FLEET_REGISTRY) | ${pullMs} |`);
console.log(`| built itself (no registry) | ${buildMs} |`);
console.log(`| host A: build / push (once for the fleet) | ${median(results.map((r) => r.buildAMs))} / ${median(results.map((r) => r.pushMs))} |`);
console.log(`\nratio: own build / pull = ${(buildMs / pullMs).toFixed(2)}x`);

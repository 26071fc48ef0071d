// A warm sandbox is claimed only by a spec identical in everything that shapes its container or its
// session: a Harbor sandbox (ENTRYPOINT's keep-alive, environment, exec user, files written before its start) never serves
// a fleet task of the same image, nor a Harbor task whose environment or user differs.
import { describe, expect, it } from 'vitest';
import { poolKey, type PoolSpec } from '../../src/sandbox/sandbox-pool.ts';

const base: PoolSpec = {
  image: 'rollout-fleet/env:abc', workdir: '/app', limits: { memoryMb: 512, cpus: 1, pids: 256, diskMb: 1024 },
  mounts: [{ volumeName: 'rf-runtime-1', target: '/opt/rollout-fleet' }],
};
const harbor: PoolSpec = {
  ...base,
  harbor: { env: { A: '1', B: '2' }, user: 'builder', keepAlive: ['/opt/rollout-fleet/bin/node', '-e', 'x'] },
  filesBeforeStart: Buffer.from('a tar'),
};

describe('poolKey', () => {
  it('tells a Harbor sandbox from a fleet one of the same image, and Harbor sandboxes apart by everything that shapes them', () => {
    expect(poolKey(harbor)).not.toBe(poolKey(base));
    const variants: PoolSpec[] = [
      { ...harbor, harbor: { ...harbor.harbor!, env: { A: '1', B: '3' } } },
      { ...harbor, harbor: { ...harbor.harbor!, env: { A: '1' } } },
      { ...harbor, harbor: { ...harbor.harbor!, user: undefined } },
      { ...harbor, harbor: { ...harbor.harbor!, user: 'root' } },
      { ...harbor, harbor: { ...harbor.harbor!, keepAlive: ['/opt/other/bin/node', '-e', 'x'] } },
      { ...harbor, filesBeforeStart: Buffer.from('another tar') },
      { ...harbor, filesBeforeStart: undefined },
      { ...harbor, image: 'rollout-fleet/env:def' },
      { ...harbor, workdir: '/' },
      { ...harbor, limits: { ...harbor.limits, diskMb: 2048 } },
      { ...harbor, limits: { ...harbor.limits, memoryMb: 1024 } },
      { ...harbor, mounts: [{ volumeName: 'rf-runtime-2', target: '/opt/rollout-fleet' }] },
    ];
    const keys = new Set([poolKey(harbor), ...variants.map(poolKey)]);
    expect(keys.size).toBe(variants.length + 1);
  });

  it('does not depend on the order the environment was written in', () => {
    expect(poolKey({ ...harbor, harbor: { ...harbor.harbor!, env: { B: '2', A: '1' } } })).toBe(poolKey(harbor));
  });
});

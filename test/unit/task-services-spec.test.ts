// The agent's container of an environment with task services: it joins the holder's namespace instead
// of network none, carries the environment's key, mounts main's named volumes, and keeps every other
// hardening of a Harbor sandbox.
import { describe, expect, it } from 'vitest';
import { HARBOR_CAPABILITIES, hardenedCreateOptions, type SessionSpec } from '../../src/sandbox/container-spec.ts';
import { LABEL } from '../../src/sandbox/labels.ts';

const owner = { fleet: 'f', episodeId: 'e1', batchId: 'b1', workerId: 'w1', attempt: 1 };
const base: SessionSpec = {
  image: 'x', workdir: '/app', limits: { memoryMb: 512, cpus: 1, pids: 256 }, owner,
  harbor: { env: {}, keepAlive: ['/opt/node'] },
};

describe('the agent container of a services environment', () => {
  it('joins the holder, is labelled with the environment key and mounts main\'s volumes', () => {
    const opts = hardenedCreateOptions({ ...base, services: { key: 'rf-e1-a1-abc', holderId: 'holder123', mounts: [{ volumeName: 'rf-e1-a1-abc-v-shared', target: '/shared', readOnly: true }] } }, 'sha256:1', 'n', undefined);
    expect(opts.HostConfig?.NetworkMode).toBe('container:holder123');
    expect(opts.NetworkDisabled).toBeUndefined();
    expect(opts.Labels).toMatchObject({ [LABEL.environment]: 'rf-e1-a1-abc', [LABEL.environmentRole]: 'main', [LABEL.episode]: 'e1' });
    expect(opts.HostConfig?.Mounts).toContainEqual({ Type: 'volume', Source: 'rf-e1-a1-abc-v-shared', Target: '/shared', ReadOnly: true });
    expect(opts.HostConfig).toMatchObject({ CapDrop: ['ALL'], CapAdd: [...HARBOR_CAPABILITIES], SecurityOpt: ['no-new-privileges'], Memory: 512 * 1024 * 1024, PidsLimit: 256 });
    expect(opts.HostConfig?.Privileged).toBeFalsy();
  });

  it('without services stays on network none', () => {
    const opts = hardenedCreateOptions(base, 'sha256:1', 'n', undefined);
    expect(opts.HostConfig?.NetworkMode).toBe('none');
    expect(opts.NetworkDisabled).toBe(true);
    expect(opts.Labels?.[LABEL.environment]).toBeUndefined();
  });
});

import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, loadConfig } from '../../src/config/config.ts';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { outcomeOf, type FleetErrorCode } from '../../src/errors/fleet-error.ts';

describe('config', () => {
  it('names a secret field without echoing its value', () => {
    const schema = z.object({ MODEL_API_KEY: z.string().min(40), nested: z.object({ token: z.number() }) });
    const input = { MODEL_API_KEY: 'sk-live-abc', nested: { token: 'tok-xyz' } };
    const lines = describeIssues(schema.safeParse(input).error!, input);
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(/^MODEL_API_KEY: .* \(got a value, not shown\)$/);
    expect(lines[1]).toMatch(/^nested\.token: /);
    expect(lines.join('\n')).not.toMatch(/sk-live-abc|tok-xyz/);
  });

  it('applies defaults and coerces numbers', () => {
    const c = loadConfig({ REDIS_URL: 'redis://127.0.0.1:6379', FLEET_WORKER_CONCURRENCY: '8' });
    expect(c.FLEET_WORKER_CONCURRENCY).toBe(8);
    expect(c.FLEET_PREFIX).toBe('rf');
    expect(c.DOCKER_HOST).toBe('unix:///var/run/docker.sock');
  });

  it('turns self-tuning concurrency on by default, between a floor of 1 and the concurrency', () => {
    const c = loadConfig({});
    expect([c.FLEET_WORKER_AUTOTUNE, c.FLEET_WORKER_CONCURRENCY_FLOOR, c.FLEET_WORKER_AUTOTUNE_MAX_SLOWDOWN, c.FLEET_WORKER_AUTOTUNE_MAX_LOAD_PER_CORE]).toEqual([true, 1, 6, undefined]);
    const off = loadConfig({ FLEET_WORKER_AUTOTUNE: 'false', FLEET_WORKER_CONCURRENCY_FLOOR: '3', FLEET_WORKER_AUTOTUNE_MAX_SLOWDOWN: '4.5', FLEET_WORKER_AUTOTUNE_MAX_LOAD_PER_CORE: '2.5' });
    expect([off.FLEET_WORKER_AUTOTUNE, off.FLEET_WORKER_CONCURRENCY_FLOOR, off.FLEET_WORKER_AUTOTUNE_MAX_SLOWDOWN, off.FLEET_WORKER_AUTOTUNE_MAX_LOAD_PER_CORE]).toEqual([false, 3, 4.5, 2.5]);
    const bad = (() => {
      try {
        loadConfig({ FLEET_WORKER_AUTOTUNE: 'sometimes', FLEET_WORKER_CONCURRENCY_FLOOR: '0', FLEET_WORKER_AUTOTUNE_MAX_SLOWDOWN: '1' });
      } catch (e) {
        return e as ConfigError;
      }
    })();
    expect(bad?.problems.map((p) => p.split(':')[0])).toEqual(['FLEET_WORKER_AUTOTUNE', 'FLEET_WORKER_CONCURRENCY_FLOOR', 'FLEET_WORKER_AUTOTUNE_MAX_SLOWDOWN']);
  });

  it('holds built environment images to 50 GiB every 10 minutes by default; bad values are named', () => {
    const c = loadConfig({});
    expect([c.FLEET_ENV_IMAGE_BUDGET_MB, c.FLEET_ENV_PRUNE_INTERVAL_MS, c.FLEET_ENV_IMAGE_MIN_IDLE_MS]).toEqual([51_200, 600_000, 600_000]);
    expect(loadConfig({ FLEET_ENV_IMAGE_BUDGET_MB: '0', FLEET_ENV_PRUNE_INTERVAL_MS: '0' }).FLEET_ENV_PRUNE_INTERVAL_MS).toBe(0);
    const bad = (() => {
      try {
        loadConfig({ FLEET_ENV_IMAGE_BUDGET_MB: '-5', FLEET_ENV_PRUNE_INTERVAL_MS: 'often', FLEET_ENV_IMAGE_MIN_IDLE_MS: '1.5' });
      } catch (e) {
        return e as ConfigError;
      }
    })();
    expect(bad?.problems.map((p) => p.split(':')[0])).toEqual(['FLEET_ENV_IMAGE_BUDGET_MB', 'FLEET_ENV_PRUNE_INTERVAL_MS', 'FLEET_ENV_IMAGE_MIN_IDLE_MS']);
    expect(bad?.problems.join('\n')).toContain('-5');
  });

  it('lists every bad value with its name', () => {
    const err = (() => {
      try {
        loadConfig({ REDIS_URL: 'localhost', FLEET_DOCKER_CALL_TIMEOUT_MS: 'soon', LOG_LEVEL: 'loud' });
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(ConfigError);
    const problems = (err as ConfigError).problems;
    expect(problems).toHaveLength(3);
    expect(problems[0]).toBe('REDIS_URL: must start with redis:// or rediss:// (got "localhost")');
    expect(problems[1]).toMatch(/^FLEET_DOCKER_CALL_TIMEOUT_MS: .* \(got "soon"\)$/);
    expect(problems[2]).toMatch(/^LOG_LEVEL: .* \(got "loud"\)$/);
  });

  it('takes the fleet-wide model limits, unset by default, and names a bad one', () => {
    const unset = loadConfig({});
    expect([unset.MODEL_MAX_CONCURRENT, unset.MODEL_REQUESTS_PER_MINUTE, unset.MODEL_TOKENS_PER_MINUTE]).toEqual([undefined, undefined, undefined]);
    const set = loadConfig({ MODEL_MAX_CONCURRENT: '64', MODEL_REQUESTS_PER_MINUTE: '600', MODEL_TOKENS_PER_MINUTE: '2000000' });
    expect([set.MODEL_MAX_CONCURRENT, set.MODEL_REQUESTS_PER_MINUTE, set.MODEL_TOKENS_PER_MINUTE]).toEqual([64, 600, 2_000_000]);
    const err = (() => {
      try {
        loadConfig({ MODEL_REQUESTS_PER_MINUTE: '0', MODEL_MAX_CONCURRENT: 'many', MODEL_TOKENS_PER_MINUTE: '1.5' });
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(ConfigError);
    const problems = (err as ConfigError).problems;
    expect(problems).toHaveLength(3);
    expect(problems.find((p) => p.startsWith('MODEL_REQUESTS_PER_MINUTE: '))).toMatch(/\(got "0"\)$/);
    expect(problems.find((p) => p.startsWith('MODEL_MAX_CONCURRENT: '))).toMatch(/\(got "many"\)$/);
    expect(problems.find((p) => p.startsWith('MODEL_TOKENS_PER_MINUTE: '))).toMatch(/\(got "1.5"\)$/);
  });
});

describe('FLEET_ARTIFACTS', () => {
  it('takes s3://bucket[/prefix] or an absolute folder, unset by default, and names a bad one with its value', () => {
    expect(loadConfig({}).FLEET_ARTIFACTS).toBeUndefined();
    expect(loadConfig({ FLEET_ARTIFACTS: 's3://fleet-artifacts/runs/2026' }).FLEET_ARTIFACTS).toBe('s3://fleet-artifacts/runs/2026');
    expect(loadConfig({ FLEET_ARTIFACTS: 's3://my.bucket-1' }).FLEET_ARTIFACTS).toBe('s3://my.bucket-1');
    expect(loadConfig({ FLEET_ARTIFACTS: '/mnt/shared/artifacts' }).FLEET_ARTIFACTS).toBe('/mnt/shared/artifacts');
    for (const bad of ['s3://Bad_Bucket/x', 's3://ab', 's3://bucket/../etc', 'relative/folder', 'https://bucket.s3.amazonaws.com/x', 's3://']) {
      const err = (() => {
        try {
          loadConfig({ FLEET_ARTIFACTS: bad });
        } catch (e) {
          return e;
        }
      })();
      expect(err, bad).toBeInstanceOf(ConfigError);
      const problems = (err as ConfigError).problems;
      expect(problems).toHaveLength(1);
      expect(problems[0]).toMatch(/^FLEET_ARTIFACTS: must be s3:\/\/<bucket>\[\/prefix\]/);
      expect(problems[0]!.endsWith(`(got ${JSON.stringify(bad)})`), problems[0]).toBe(true);
    }
  });
});

describe('outcomeOf', () => {
  it('retries infrastructure and model failures only', () => {
    const codes: FleetErrorCode[] = ['invalid_payload', 'image_not_found', 'docker_timeout', 'worker_lost', 'model_error', 'agent_crashed', 'disk_limit_exceeded', 'verifier_timeout'];
    expect(codes.map((c) => [c, outcomeOf(c).kind, outcomeOf(c).retry])).toEqual([
      ['invalid_payload', 'invalid', false],
      ['image_not_found', 'invalid', false],
      ['docker_timeout', 'infra', true],
      ['worker_lost', 'infra', true],
      ['model_error', 'model', true],
      ['agent_crashed', 'agent', false],
      ['disk_limit_exceeded', 'agent', false],
      ['verifier_timeout', 'verifier', false],
    ]);
  });
});

describe('FLEET_REGISTRY', () => {
  const problemsOf = (value: string): string[] => {
    try {
      loadConfig({ FLEET_REGISTRY: value });
    } catch (e) {
      expect(e).toBeInstanceOf(ConfigError);
      return (e as ConfigError).problems;
    }
    return [];
  };

  it('takes host:port (a name, IPv4 or [IPv6]), unset by default', () => {
    expect(loadConfig({}).FLEET_REGISTRY).toBeUndefined();
    for (const good of ['127.0.0.1:5000', 'registry.internal:443', 'reg-1.example.com:65535', '[::1]:5000']) {
      expect(loadConfig({ FLEET_REGISTRY: good }).FLEET_REGISTRY).toBe(good);
    }
  });

  it('names a bad one with its value', () => {
    for (const bad of ['registry.internal', 'reg:0', 'reg:65536', 'reg:port', 'a b:5000', '127.0.0.1:5000/path', 'http://127.0.0.1:5000', '-reg:5000']) {
      const problems = problemsOf(bad);
      expect(problems, bad).toHaveLength(1);
      expect(problems[0], bad).toMatch(/^FLEET_REGISTRY: must be host:port/);
      expect(problems[0]!.endsWith(`(got ${JSON.stringify(bad)})`), problems[0]).toBe(true);
    }
  });

  it('refuses credentials without echoing them', () => {
    for (const bad of ['alice:hunter2@reg.internal:5000', 'https://alice:hunter2@reg.internal:5000', 'ghp_abcdefABCDEF0123456789@reg.internal:5000']) {
      const problems = problemsOf(bad);
      expect(problems, bad).toHaveLength(1);
      expect(problems[0]).toMatch(/^FLEET_REGISTRY: must be host:port, without a scheme or credentials/);
      expect(problems[0]).toContain('(got "***@reg.internal:5000")');
      expect(problems[0]).not.toMatch(/alice|hunter2|ghp_/);
    }
  });
});

// The model settings of the one config schema: defaults, and bad values named.
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.ts';

describe('model config', () => {
  it('has budget defaults and leaves the endpoint, key and model unset', () => {
    const c = loadConfig({});
    expect(c).toMatchObject({ MODEL_MAX_CALLS: 100, MODEL_MAX_TOKENS: 1_000_000, MODEL_REQUEST_TIMEOUT_MS: 300_000, MODEL_UPSTREAM_RETRIES: 3 });
    expect([c.MODEL_BASE_URL, c.MODEL_API_KEY, c.MODEL_NAME]).toEqual([undefined, undefined, undefined]);
    const set = loadConfig({ MODEL_BASE_URL: 'http://127.0.0.1:8000/v1', MODEL_API_KEY: 'sk-x', MODEL_NAME: 'm', MODEL_MAX_CALLS: '7', MODEL_UPSTREAM_RETRIES: '0' });
    expect(set).toMatchObject({ MODEL_BASE_URL: 'http://127.0.0.1:8000/v1', MODEL_API_KEY: 'sk-x', MODEL_NAME: 'm', MODEL_MAX_CALLS: 7, MODEL_UPSTREAM_RETRIES: 0 });
  });

  it('names every bad model setting', () => {
    let err: unknown;
    try {
      loadConfig({ MODEL_BASE_URL: 'unix:///tmp/x.sock', MODEL_MAX_TOKENS: '0', MODEL_UPSTREAM_RETRIES: '99' });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    const problems = (err as ConfigError).problems;
    expect(problems).toHaveLength(3);
    expect(problems[0]).toBe('MODEL_BASE_URL: must be an http:// or https:// URL (got "unix:///tmp/x.sock")');
    expect(problems[1]).toMatch(/^MODEL_MAX_TOKENS: .* \(got "0"\)$/);
    expect(problems[2]).toMatch(/^MODEL_UPSTREAM_RETRIES: .* \(got "99"\)$/);
  });
});

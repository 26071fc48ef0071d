// The Redis scripts in src/redis/lua/: each opens with its contract (every KEYS[i] and ARGV[i] it reads,
// and what it returns), its name ends in the key count it really uses, and each is run by the code.
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { LUA_DIR, luaScript } from '../../src/redis/lua-script.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const scripts = readdirSync(LUA_DIR).filter((f) => f.endsWith('.lua')).map((f) => f.slice(0, -'.lua'.length));
const indices = (text: string, table: 'KEYS' | 'ARGV') => [...new Set([...text.matchAll(new RegExp(`${table}\\[(\\d+)\\]`, 'g'))].map((m) => Number(m[1])))].sort((a, b) => a - b);
const HEADER = /^--\[\[([\s\S]*?)\]\]\n/;

describe('Redis Lua scripts', () => {
  it('are there', () => expect(scripts.length).toBeGreaterThanOrEqual(13));

  it.each(scripts)('%s: a header naming every KEYS[i] and ARGV[i] it reads and its output; the key count in its name', (name) => {
    const text = readFileSync(path.join(LUA_DIR, `${name}.lua`), 'utf8');
    const header = HEADER.exec(text);
    expect(header, `${name}.lua opens with a --[[ ... ]] contract`).not.toBeNull();
    const body = luaScript(name).lua.replace(HEADER, '');
    const documented = (table: 'KEYS' | 'ARGV') => indices(header![1]!.split(/\n\s*Output:/)[0]!, table);
    expect(documented('KEYS')).toEqual(indices(body, 'KEYS'));
    expect(documented('ARGV')).toEqual(indices(body, 'ARGV'));
    expect(header![1]).toMatch(/\n\s*Output:\n\s+\S/);
    const keys = indices(body, 'KEYS');
    // KEYS[1..n] used, and n is the count the name states (and ioredis is told).
    expect(keys).toEqual(Array.from({ length: keys.length }, (_, i) => i + 1));
    expect(luaScript(name).numberOfKeys).toBe(keys.length);
  });

  it('are each run by one module of the code', () => {
    const sources = readdirSync(path.join(ROOT, 'src'), { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts'));
    const text = sources.map((f) => readFileSync(path.join(ROOT, 'src', f), 'utf8')).join('\n');
    for (const name of scripts) expect(text.split(`luaScript`).filter((s) => s.includes(`('${name}')`)).length, name).toBe(1);
  });

  it('expand includes and name their command after the file', () => {
    const acquire = luaScript('model-limit-acquire-5');
    expect(acquire).toMatchObject({ name: 'rfModelLimitAcquire', numberOfKeys: 5 });
    expect(acquire.lua).toContain("local t = redis.call('TIME')");
    expect(acquire.lua).toContain('local function gcra(');
    expect(acquire.lua).not.toContain('@include');
  });

  it('refuse a name without its key count, and a missing file naming where it looked', () => {
    expect(() => luaScript('lock-renew')).toThrow(/ending in its key count.*`lock-renew`/);
    expect(() => luaScript('no-such-script-1')).toThrow(/no-such-script-1\.lua could not be read/);
  });
});

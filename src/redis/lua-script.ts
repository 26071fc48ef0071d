// The fleet's Redis Lua scripts, kept as data: one `.lua` file per atomic operation in src/redis/lua/
// (as BullMQ keeps them), named for the operation and its key count (`lock-renew-1.lua`), each opening
// with its contract (KEYS, ARGV, what it returns). A script is read once, when its module loads, and
// defined on each connection the first time it runs there (ioredis `defineCommand`): ioredis then sends
// EVALSHA, and the whole script (EVAL) only when Redis does not know it yet (a restart, SCRIPT FLUSH).
//
// tsc does not copy `.lua` files: the build (package.json "build", and the tests' build of dist/)
// copies src/redis/lua/ to dist/src/redis/lua/, so the compiled CLI and the fleet image read them
// beside this module just as tsx and vitest do beside its source.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Redis } from 'ioredis';

/** The folder of the scripts, beside this module (src/redis/lua/ or dist/src/redis/lua/). */
export const LUA_DIR = fileURLToPath(new URL('./lua/', import.meta.url));

/** A line `--- @include "includes/now"` is replaced by that file of LUA_DIR (shared snippets, as BullMQ's). */
const INCLUDE = /^--- @include "([\w/-]+)"$/gm;

export type ScriptArg = string | number;

export interface LuaScript<Keys extends readonly string[], Args extends readonly ScriptArg[], Result> {
  /** The command's name on a connection: `rf` and the file's name in camelCase (`rfLockRenew`). */
  readonly name: string;
  readonly numberOfKeys: number;
  /** The script as Redis runs it, includes expanded. */
  readonly lua: string;
  /** Run it on `redis`, defining it there first if this connection does not have it yet. */
  run(redis: Redis, keys: Keys, args: Args): Promise<Result>;
}

const byName = new Map<string, string>();

function readScript(relative: string, including: string[] = []): string {
  const file = path.join(LUA_DIR, `${relative}.lua`);
  if (including.includes(relative)) throw new Error(`Redis script ${file} includes itself (through ${including.join(' -> ')})`);
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new Error(`Redis script ${file} could not be read (a build copies src/redis/lua/ into dist/src/redis/lua/: npm run build)`, { cause: err });
  }
  return text.replace(INCLUDE, (_, inner: string) => readScript(inner, [...including, relative]).trimEnd());
}

/**
 * The script in `LUA_DIR/<file>.lua`, whose name ends in its key count (`result-record-4`). `Keys`,
 * `Args` and `Result` type the contract its header states; Redis's reply is returned as it comes.
 */
export function luaScript<Keys extends readonly string[], Args extends readonly ScriptArg[], Result>(file: string): LuaScript<Keys, Args, Result> {
  const match = /^([a-z]+(?:-[a-z]+)*)-(\d+)$/.exec(file);
  if (!match) throw new TypeError(`Expected \`file\` to be a kebab-case script name ending in its key count (e.g. \`lock-renew-1\`), got \`${file}\``);
  const numberOfKeys = Number(match[2]);
  const name = `rf${match[1]!.split('-').map((w) => w[0]!.toUpperCase() + w.slice(1)).join('')}`;
  const other = byName.get(name);
  if (other !== undefined && other !== file) throw new Error(`Redis scripts ${other} and ${file} would both be the command ${name}`);
  byName.set(name, file);
  const lua = readScript(file);
  return {
    name,
    numberOfKeys,
    lua,
    async run(redis, keys, args) {
      if (keys.length !== numberOfKeys) throw new TypeError(`Expected ${numberOfKeys} keys for the Redis script ${file}, got ${keys.length}`);
      const commands = redis as unknown as Record<string, ((...a: ScriptArg[]) => Promise<unknown>) | undefined>;
      // ioredis keeps defined commands per connection (duplicate() starts without them).
      if (typeof commands[name] !== 'function') redis.defineCommand(name, { numberOfKeys, lua });
      return (await commands[name]!.call(redis, ...keys, ...args)) as Result;
    },
  };
}

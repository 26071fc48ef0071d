--[[
  At the start of a model call: the endpoint's current policy version, checked against the episode's
  first one and recorded in the episode's versions, in one step.

  Input:
    KEYS[1] the endpoint's policy-version hash (fields version, setAt)
    KEYS[2] the episode's policy-versions hash (first, last, and v:<version> -> calls stamped with it)
    ARGV[1] the batch's maxStaleness, or -1 for none
    ARGV[2] TTL of the episode's hash in s

  Output:
    { -1 }                          no version was ever set for the endpoint (nothing touched)
    { version, setAt, first, 0 }    stamped and recorded
    { version, setAt, first, 1 }    refused: version - first > maxStaleness (nothing recorded)
]]
local current = redis.call('HGET', KEYS[1], 'version')
if not current then return { -1 } end
local version = tonumber(current)
local setAt = redis.call('HGET', KEYS[1], 'setAt') or ''
local first = tonumber(redis.call('HGET', KEYS[2], 'first') or current)
local max = tonumber(ARGV[1])
if max >= 0 and version - first > max then return { version, setAt, first, 1 } end
redis.call('HSETNX', KEYS[2], 'first', current)
redis.call('HSET', KEYS[2], 'last', current)
redis.call('HINCRBY', KEYS[2], 'v:' .. current, 1)
redis.call('EXPIRE', KEYS[2], ARGV[2])
return { version, setAt, first, 0 }

--[[
  Set an endpoint's current policy version, which only moves forward.

  Input:
    KEYS[1] the endpoint's policy-version hash (fields version, setAt)
    ARGV[1] the new version (a non-negative integer)
    ARGV[2] when it is set (ISO time, the caller's clock)

  Output:
    { 1, version, setAt }  set (or the same version again: kept, with its first setAt)
    { 0, version, setAt }  refused: the current version is higher (nothing touched)
]]
local current = redis.call('HGET', KEYS[1], 'version')
local wanted = tonumber(ARGV[1])
if current then
  local cur = tonumber(current)
  if wanted < cur then return { 0, cur, redis.call('HGET', KEYS[1], 'setAt') or '' } end
  if wanted == cur then return { 1, cur, redis.call('HGET', KEYS[1], 'setAt') or '' } end
end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'setAt', ARGV[2])
return { 1, wanted, ARGV[2] }

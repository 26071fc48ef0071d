--[[
  Raise an episode's checkpoint pointer to a seq unless it is already there or higher (it only ever
  rises), and renew its TTL.

  Input:
    KEYS[1] pointer key (the newest seq)
    ARGV[1] seq
    ARGV[2] TTL in s

  Output:
    the pointer afterwards (a number)
]]
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local seq = tonumber(ARGV[1])
if seq > current then current = seq end
redis.call('SET', KEYS[1], current, 'EX', ARGV[2])
return current

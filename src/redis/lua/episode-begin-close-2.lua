--[[
  Atomically: a flagged cancel wins; otherwise the episode is closing from now on.

  Input:
    KEYS[1] phase key
    KEYS[2] cancel key
    ARGV[1] TTL in s

  Output:
    'cancelled'  nothing touched
    'closing'    phase set
]]
if redis.call('EXISTS', KEYS[2]) == 1 then return 'cancelled' end
redis.call('SET', KEYS[1], 'closing', 'EX', ARGV[1])
return 'closing'

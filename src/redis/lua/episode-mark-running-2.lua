--[[
  Atomically: mark running, unless a cancel was flagged before the episode started.

  Input:
    KEYS[1] phase key
    KEYS[2] cancel key
    ARGV[1] TTL in s

  Output:
    'cancelled'  nothing touched
    'running'    phase set
]]
if redis.call('EXISTS', KEYS[2]) == 1 then return 'cancelled' end
redis.call('SET', KEYS[1], 'running', 'EX', ARGV[1])
return 'running'

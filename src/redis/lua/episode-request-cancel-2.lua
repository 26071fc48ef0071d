--[[
  Atomically: refuse when closing; otherwise flag the cancel and tell the running worker.

  Input:
    KEYS[1] phase key
    KEYS[2] cancel key
    ARGV[1] cancel channel
    ARGV[2] episode id
    ARGV[3] TTL in s

  Output:
    'closing'      nothing touched
    'running'      flagged and published
    'not-running'  flagged only
]]
local phase = redis.call('GET', KEYS[1])
if phase == 'closing' then return 'closing' end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[3])
if phase then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 'running'
end
return 'not-running'

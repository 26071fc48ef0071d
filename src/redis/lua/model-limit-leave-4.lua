--[[
  An aborted caller leaves: out of the queue, its lease freed, its reserved request slot given back
  when it was the last one reserved (nobody reserved after it).

  Input:
    KEYS[1] state hash
    KEYS[2] leases sorted set
    KEYS[3] queue sorted set
    KEYS[4] waiters sorted set
    ARGV[1] caller's id
    ARGV[2] reservedTat of its grant ('' when none)
    ARGV[3] T of its grant

  Output:
    1
]]
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'tat') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'tat', string.format('%.3f', tonumber(ARGV[2]) - tonumber(ARGV[3])))
end
return 1

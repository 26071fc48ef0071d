--[[
  Atomically: when the episode is marked for a retry, forget its result (and outline) and the mark.

  Input:
    KEYS[1] batch results hash
    KEYS[2] retry mark
    KEYS[3] outlines hash
    KEYS[4] results version
    ARGV[1] episode id

  Output:
    the result still recorded (JSON), or false (nil) when there is none (none recorded, or just forgotten)
]]
if redis.call('DEL', KEYS[2]) == 1 then
  if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then redis.call('INCR', KEYS[4]) end
  redis.call('HDEL', KEYS[3], ARGV[1])
  return false
end
return redis.call('HGET', KEYS[1], ARGV[1])

--[[
  Record a result once, with its outline, and append it to the batch's completion stream in the same
  step, so a reader of the stream never misses a recorded result nor sees one twice.

  Input:
    KEYS[1] results hash
    KEYS[2] completions stream
    KEYS[3] outlines hash
    KEYS[4] results version
    ARGV[1] episode id
    ARGV[2] result JSON
    ARGV[3] status
    ARGV[4] reward ('' when none)
    ARGV[5] the outline

  Output:
    the stream entry id, or false (nil) when the episode had a result (nothing touched)
]]
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return false end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
redis.call('INCR', KEYS[4])
return redis.call('XADD', KEYS[2], '*', 'episodeId', ARGV[1], 'status', ARGV[3], 'reward', ARGV[4])

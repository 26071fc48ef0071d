--[[
  Extend a token lock if it is still ours.

  Input:
    KEYS[1] lock key
    ARGV[1] token
    ARGV[2] TTL in ms

  Output:
    1 when extended, 0 when the key is gone or holds another token (nothing is touched)
]]
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end

--[[
  Delete a token lock if it is still ours.

  Input:
    KEYS[1] lock key
    ARGV[1] token

  Output:
    1 when deleted, 0 when the key is gone or holds another token (nothing is touched)
]]
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end

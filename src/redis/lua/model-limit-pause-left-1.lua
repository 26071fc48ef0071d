--[[
  How long a Retry-After still pauses the endpoint's new turns.

  Input:
    KEYS[1] state hash

  Output:
    the ms left, as a string ('0': not paused)
]]
--- @include "includes/now"
local p = tonumber(redis.call('HGET', KEYS[1], 'pause_until') or '0')
return tostring(math.max(0, math.ceil(p - now)))

--[[
  An endpoint's fleet-wide numbers, for the dashboard and /metrics.

  Input:
    KEYS[1] state hash
    KEYS[2] leases sorted set
    KEYS[3] waiters sorted set
    KEYS[4] tokens hash (second -> tokens)

  Output:
    false when the endpoint's state is gone (its keys expired), else
    {host, inFlight, waiting, n429, n503, tokensLastMinute, factor (string), pausedMs (string)}
]]
--- @include "includes/now"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local s = redis.call('HMGET', KEYS[1], 'host', 'lease_ms', 'n429', 'n503', 'factor', 'pause_until')
local leaseMs = tonumber(s[2]) or 0
local inFlight = redis.call('ZCOUNT', KEYS[2], '(' .. now, now + leaseMs)
local reserved = redis.call('ZCOUNT', KEYS[2], '(' .. (now + leaseMs), '+inf')
local waiting = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf') + reserved
local sec = math.floor(now / 1000)
local tokens = 0
local buckets = redis.call('HGETALL', KEYS[4])
for i = 1, #buckets, 2 do
  if tonumber(buckets[i]) > sec - 60 then tokens = tokens + tonumber(buckets[i + 1]) end
end
return {s[1] or '', inFlight, waiting, tonumber(s[3]) or 0, tonumber(s[4]) or 0, tokens, s[5] or '1', tostring(math.max(0, math.ceil((tonumber(s[6]) or 0) - now)))}

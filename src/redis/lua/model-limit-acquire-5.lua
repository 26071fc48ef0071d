--[[
  Ask for a turn of a model endpoint: a concurrency slot (first come, first served), the next free
  request slot of the requests per minute (reserved up to a horizon ahead), within the token allowance
  and outside a Retry-After pause. Renews every key's TTL.

  Input:
    KEYS[1] state hash (factor, tat, pause_until, tok_allow, tok_at, host, lease_ms)
    KEYS[2] leases sorted set (lease id -> expiry)
    KEYS[3] queue sorted set (waiter id -> arrival)
    KEYS[4] waiters sorted set (waiter id -> alive until)
    KEYS[5] index of endpoints (endpoint id -> last use)
    ARGV[1] caller's id
    ARGV[2] leaseMs
    ARGV[3] maxConcurrent (0: none)
    ARGV[4] requests per minute (0: none)
    ARGV[5] tokens per minute (0: none)
    ARGV[6] horizonMs: the furthest ahead a request slot may be reserved
    ARGV[7] aliveMs: a waiter that does not ask again within it leaves the queue
    ARGV[8] TTL of every key, in ms
    ARGV[9] endpoint id
    ARGV[10] endpoint host
    ARGV[11] burst, in seconds of the requests per minute

  Output:
    {0, delayMs, reservedTat, T}  granted: sleep delayMs first; reservedTat ('' when no rate limit) and
                                  T give the slot back if the caller leaves before it
    {1, hintMs, reason}           wait about hintMs and ask again; reason 'paused', 'tokens', 'busy' or 'rate'
]]
--- @include "includes/now"
--- @include "includes/gcra"
local id = ARGV[1]
local leaseMs, maxC, rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local horizon, aliveMs, ttl, burstS = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[11])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for i = 1, #gone do redis.call('ZREM', KEYS[3], gone[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
redis.call('ZADD', KEYS[3], 'NX', now, id)
redis.call('ZADD', KEYS[4], now + aliveMs, id)
redis.call('HSET', KEYS[1], 'host', ARGV[10], 'lease_ms', leaseMs)
redis.call('ZADD', KEYS[5], now, ARGV[9])
local function touch()
  for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
local s = redis.call('HMGET', KEYS[1], 'factor', 'tat', 'pause_until', 'tok_allow', 'tok_at')
local factor = tonumber(s[1]) or 1
local function wait(ms, why)
  touch()
  return {1, tostring(math.ceil(ms)), why}
end
local pauseUntil = tonumber(s[3]) or 0
if pauseUntil > now then return wait(pauseUntil - now, 'paused') end
if tpm > 0 and s[4] then
  local rate = tpm / 60000
  local allow = math.min(tpm, tonumber(s[4]) + (now - tonumber(s[5])) * rate)
  if allow < 0 then return wait(-allow / rate, 'tokens') end
end
if maxC > 0 then
  local cap = math.max(1, math.floor(maxC * factor))
  local free = cap - redis.call('ZCARD', KEYS[2])
  local rank = redis.call('ZRANK', KEYS[3], id)
  if rank >= free then return wait(math.min(250, 10 * (rank - math.max(free, 0) + 1)), 'busy') end
end
local delay, reserved, T = 0, '', 0
if rpm > 0 then
  local tau
  T, tau = gcra(rpm, factor, burstS)
  local start = math.max(tonumber(s[2]) or 0, now)
  local slot = math.max(now, start - tau)
  if slot - now > horizon then return wait(slot - now - horizon, 'rate') end
  reserved = string.format('%.3f', start + T)
  redis.call('HSET', KEYS[1], 'tat', reserved)
  delay = slot - now
end
redis.call('ZADD', KEYS[2], now + delay + leaseMs, id)
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
touch()
return {0, tostring(math.ceil(delay)), reserved, string.format('%.3f', T)}

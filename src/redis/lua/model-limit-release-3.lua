--[[
  A turn is over: free its lease, and learn from upstream's answer. A 429 or 503 cuts the allowance
  factor (at most once per cutInterval) and a Retry-After pauses every new turn; a 429 also empties the
  request bucket. A success raises the factor back towards 1. Tokens are counted per second (the last
  minute's metric) and charged to the token allowance.

  Input:
    KEYS[1] state hash
    KEYS[2] leases sorted set
    KEYS[3] tokens hash (second -> tokens)
    ARGV[1] caller's id
    ARGV[2] upstream's status ('' when none)
    ARGV[3] Retry-After in ms ('' when none)
    ARGV[4] tokens used ('' when unknown)
    ARGV[5] requests per minute (0: none)
    ARGV[6] tokens per minute (0: none)
    ARGV[7] burst, in seconds of the requests per minute
    ARGV[8] AIMD decrease
    ARGV[9] AIMD floor
    ARGV[10] AIMD increase per success
    ARGV[11] AIMD cut interval, ms
    ARGV[12] longest pause believed, ms
    ARGV[13] TTL of every key, in ms

  Output:
    1
]]
--- @include "includes/now"
--- @include "includes/gcra"
redis.call('ZREM', KEYS[2], ARGV[1])
local status, retryAfter, tokens = tonumber(ARGV[2]) or 0, tonumber(ARGV[3]) or 0, tonumber(ARGV[4]) or 0
local rpm, tpm, burstS = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local decrease, floor, increase = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local cutInterval, maxPause, ttl = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local s = redis.call('HMGET', KEYS[1], 'factor', 'cut_at', 'pause_until', 'tat', 'tok_allow', 'tok_at')
local factor = tonumber(s[1]) or 1
if status == 429 or status == 503 then
  redis.call('HINCRBY', KEYS[1], 'n' .. status, 1)
  if now - (tonumber(s[2]) or 0) >= cutInterval then
    factor = math.max(floor, factor * decrease)
    redis.call('HSET', KEYS[1], 'factor', string.format('%.6f', factor), 'cut_at', string.format('%.3f', now))
  end
  local pauseUntil = tonumber(s[3]) or 0
  if retryAfter > 0 and now + math.min(retryAfter, maxPause) > pauseUntil then
    pauseUntil = now + math.min(retryAfter, maxPause)
    redis.call('HSET', KEYS[1], 'pause_until', string.format('%.3f', pauseUntil))
  end
  if status == 429 and rpm > 0 then
    local T, tau = gcra(rpm, factor, burstS)
    local emptied = math.max(now, pauseUntil) + tau
    if emptied > (tonumber(s[4]) or 0) then redis.call('HSET', KEYS[1], 'tat', string.format('%.3f', emptied)) end
  end
elseif status >= 200 and status < 300 and factor < 1 then
  redis.call('HSET', KEYS[1], 'factor', string.format('%.6f', math.min(1, factor + increase)))
end
if tokens > 0 then
  local sec = math.floor(now / 1000)
  redis.call('HINCRBY', KEYS[3], sec, tokens)
  local fields = redis.call('HKEYS', KEYS[3])
  for i = 1, #fields do
    if tonumber(fields[i]) < sec - 60 then redis.call('HDEL', KEYS[3], fields[i]) end
  end
  redis.call('PEXPIRE', KEYS[3], ttl)
  if tpm > 0 then
    local allow = tpm
    if s[5] then allow = math.min(tpm, tonumber(s[5]) + (now - tonumber(s[6])) * tpm / 60000) end
    redis.call('HSET', KEYS[1], 'tok_allow', string.format('%.3f', allow - tokens), 'tok_at', string.format('%.3f', now))
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1

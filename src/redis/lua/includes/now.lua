-- now: Redis's own clock in ms (TIME), the one clock every caller shares.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000

"""The Lua scripts of the fleet-wide rate limits (agents/limits/ratelimit.py's RedisLimiter):
each runs atomically in Redis, so that every worker of a fleet sees one limit."""

# KEYS: requests zset, tokens zset, concurrency zset, pause key, probe key, learned hash
# ARGV: now, request_limit, request_window, token_limit, token_window, concurrency_limit,
#       lease_id, lease_expiry, probe_wait, adaptive (1: the learned limit applies)
# Returns {0, wait_seconds}, {1, '0', epoch} or {1, 'probe', epoch} (this call goes first
# after a pause); epoch: the learned limit's halvings so far.
ACQUIRE = """
local now = tonumber(ARGV[1])
local adaptive = ARGV[10] == '1'
local epoch = 0
local pause = tonumber(redis.call('GET', KEYS[4]) or '0')
if pause > now then return {0, tostring(pause - now)} end
local probe = redis.call('GET', KEYS[5])
local probing = false
if probe then
  if probe ~= 'open' then return {0, ARGV[9]} end
  probing = true
end
local wait = 0
local req_limit = tonumber(ARGV[2])
if req_limit > 0 then
  local window = tonumber(ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
  if redis.call('ZCARD', KEYS[1]) >= req_limit then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now)
  end
end
local tok_limit = tonumber(ARGV[4])
if tok_limit > 0 then
  local window = tonumber(ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
  local used = 0
  local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    used = used + tonumber(string.match(entries[i], ':(%d+)$'))
  end
  if used >= tok_limit and #entries > 0 then
    wait = math.max(wait, tonumber(entries[2]) + window - now)
  end
end
local conc_limit = tonumber(ARGV[6])
if adaptive then
  local learned = redis.call('HMGET', KEYS[6], 'limit', 'epoch')
  conc_limit = tonumber(learned[1] or '0')
  epoch = tonumber(learned[2] or '0')
end
if conc_limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc_limit then
    wait = math.max(wait, 0.02)
  end
end
if wait > 0 then return {0, tostring(wait)} end
if probing then
  redis.call('SET', KEYS[5], ARGV[7], 'PX', math.ceil((tonumber(ARGV[8]) - now) * 1000))
end
if req_limit > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[7])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 5)
end
if conc_limit > 0 or adaptive then
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[7])
  redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[8]) - now) + 5)
end
if probing then return {1, 'probe', epoch} end
return {1, '0', epoch}
"""

# The probe's answer was not a 429: let everyone through again (only if this lease is
# still the probe). KEYS: probe key; ARGV: lease_id.
CLEAR_PROBE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


# What a call's answer does to the learned limit. KEYS: learned hash, concurrency zset.
# ARGV: outcome ('429' or 'ok'), the lease's epoch (-1: a call made before this process
# took slots, which may set a first limit but never halve one), the calls this process
# had in flight, now, the key's time to live, the provider's request limit (0: unknown).
# Returns the limit (0: none learned).
ADAPT = """
local learned = redis.call('HMGET', KEYS[1], 'limit', 'epoch')
local limit = tonumber(learned[1] or '0')
local epoch = tonumber(learned[2] or '0')
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
local active = redis.call('ZCARD', KEYS[2])
local cap = tonumber(ARGV[6])
if ARGV[1] == '429' then
  -- (Nothing learned, or forgotten: any 429 sets a first limit.)
  if limit > 0 and tonumber(ARGV[2]) ~= epoch then return limit end
  local base = limit
  if base == 0 then base = math.max(active, tonumber(ARGV[3])) end
  limit = math.max(1, math.floor(base / 2))
  if cap > 0 then limit = math.min(limit, cap) end
  redis.call('HSET', KEYS[1], 'limit', limit, 'epoch', epoch + 1, 'successes', 0)
elseif limit > 0 then
  local successes = redis.call('HINCRBY', KEYS[1], 'successes', 1)
  if successes >= limit then
    if active >= limit and (cap == 0 or limit < cap) then
      limit = limit + 1
      redis.call('HSET', KEYS[1], 'limit', limit)
    end
    redis.call('HSET', KEYS[1], 'successes', 0)
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
return limit
"""

-- Store a feed consumer's cursor set, bounded and expiring.
-- KEYS: the consumer's set names (sorted set: name -> last store, ms), the set (hash).
-- ARGV: set name, max age in ms, most sets, then (partition, cursor) pairs.
-- Forgets the names not stored for max age (their hashes expired with them), refuses a new name
-- past `most` (returns 0), else stores and gives both keys max age to live (returns 1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max_age = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - max_age)
if not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], max_age)
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[2], max_age)
return 1

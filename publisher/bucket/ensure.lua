-- Create the bucket (epoch, partition count, `last`) or check its partition count.
-- KEYS: common. ARGV: candidate epoch, wanted partitions. Returns {epoch, partitions}.
local n, problem = ensure(ARGV[1], ARGV[2])
if not n then return redis.error_reply(problem) end
return {redis.call('GET', KEYS[2]), n}

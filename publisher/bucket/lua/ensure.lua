-- Create the bucket (epoch, partition count, `last`) or check its partition count.
-- KEYS: common. ARGV: candidate epoch, wanted partitions. Returns {epoch, partitions}.
local n, epoch = ensure(ARGV[1], ARGV[2])
if not n then return redis.error_reply(epoch) end
return {epoch, n}

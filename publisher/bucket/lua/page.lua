-- One page of a resource's stored states, with the bucket head: one consistent snapshot.
-- KEYS: common, index, state. ARGV: limit, then (kind, a, b) per piece of the index to walk, in
-- id order: ('id', id, '') or ('range', ZRANGEBYLEX start, end). Returns {ids, states, head id,
-- epoch}. Compares no strings itself (Lua's string order follows the server's locale; the plan
-- is already in Redis' byte order).
local limit = tonumber(ARGV[1])
local ids = {}
for i = 2, #ARGV, 3 do
  local left = limit - #ids
  if left <= 0 then break end
  if ARGV[i] == 'id' then
    if redis.call('ZSCORE', KEYS[6], ARGV[i + 1]) then ids[#ids + 1] = ARGV[i + 1] end
  else
    local run = redis.call('ZRANGEBYLEX', KEYS[6], ARGV[i + 1], ARGV[i + 2], 'LIMIT', 0, left)
    for _, id in ipairs(run) do ids[#ids + 1] = id end
  end
end
local states = {}
if #ids > 0 then states = redis.call('HMGET', KEYS[7], unpack(ids)) end
return {ids, states, head(partitions()), redis.call('GET', KEYS[2]) or ''}

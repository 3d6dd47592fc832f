-- Commit changes: store each state and append each change item, atomically.
-- KEYS: common, idempotency hash, idempotency times, then (state, index) per change.
-- ARGV: candidate epoch, wanted partitions, idempotency key ('' for none), digest of the changes,
-- most keys remembered, the writer's witness ('<epoch> <id>': the newest position it was given,
-- or ''), then (op, resource, sub-resources as JSON, id, state JSON) per change.
-- Returns {epoch, ms, first seq, count, 1, renewed}: the changes' ids are ms-(first seq),
-- ms-(first seq + 1), ... in order. With a key already remembered it writes nothing and returns
-- the first call's {epoch, ms, first seq, count, 0, 0}; an error KEYREUSED when that call had
-- other changes. `renewed` is 1 when the head was behind the witness: Redis lost commits it had
-- acknowledged (restored from an older snapshot, a lagging replica promoted), so the bucket gets
-- a new epoch before this commit, and every publisher tells its listeners to bootstrap again.
-- Ids come from one sequence for every partition (`last`), so they order every change of the
-- bucket, whatever its partition.
local call = redis.call
local key, digest, most = ARGV[3], ARGV[4], tonumber(ARGV[5])
if key ~= '' then
  local known = call('HGET', KEYS[6], key)
  if known then
    local epoch, ms, first, count, was = string.match(known, '^(%S+) (%d+) (%d+) (%d+) (%S*)$')
    if was ~= digest then
      return redis.error_reply('KEYREUSED ' .. count .. ' ' .. key)
    end
    return {epoch, ms, tonumber(first), tonumber(count), 0, 0}
  end
end
local n, problem = ensure(ARGV[1], ARGV[2])
if not n then return redis.error_reply(problem) end
local renewed = 0
local witness_epoch, witness_id = string.match(ARGV[6], '^(%S+) (%S+)$')
if witness_epoch and witness_epoch == call('GET', KEYS[2])
    and less(call('GET', KEYS[4]), witness_id) then
  call('SET', KEYS[2], ARGV[1])
  renewed = 1
end
local lms, lseq = parse(call('GET', KEYS[4]))
local ms, seq = now_ms(), -1
if ms <= lms then ms, seq = lms, lseq end
local first, count = seq + 1, (#ARGV - 6) / 5
local prefix = string.format('%d-', ms)
for j = 0, count - 1 do
  local a = 7 + j * 5
  local op, changed = ARGV[a], ARGV[a + 3]
  if op == 'put' then
    call('HSET', KEYS[8 + j * 2], changed, ARGV[a + 4])
    call('ZADD', KEYS[9 + j * 2], 0, changed)
  elseif op == 'delete' then
    call('HDEL', KEYS[8 + j * 2], changed)
    call('ZREM', KEYS[9 + j * 2], changed)
  end
  local target = KEYS[1]
  if n > 1 then
    target = target .. ':' .. (tonumber(string.sub(redis.sha1hex(changed), 1, 8), 16) % n)
  end
  seq = seq + 1
  call('XADD', target, prefix .. string.format('%d', seq), 'r', ARGV[a + 1], 's', ARGV[a + 2],
       'i', changed)
end
if count > 0 then call('SET', KEYS[4], prefix .. string.format('%d', seq)) end
local epoch = call('GET', KEYS[2])
if key ~= '' then
  call('HSET', KEYS[6], key, string.format('%s %d %d %d %s', epoch, ms, first, count, digest))
  call('ZADD', KEYS[7], ms, key)
  local excess = math.min(call('ZCARD', KEYS[7]) - most, 1000)
  if excess > 0 then
    call('HDEL', KEYS[6], unpack(call('ZRANGE', KEYS[7], 0, excess - 1)))
    call('ZREMRANGEBYRANK', KEYS[7], 0, excess - 1)
  end
end
return {epoch, string.format('%d', ms), first, count, 1, renewed}

-- Commit changes: store each state and append each change item, atomically.
-- KEYS: common, idempotency hash, idempotency times, then (state, index) per resource of the
-- batch, in the order the resources first appear in it.
-- ARGV: candidate epoch, wanted partitions, idempotency key ('' for none), digest of the changes,
-- most keys remembered, the writer's witness ('<epoch> <id>': the newest position it was given,
-- or ''), the name of each resource of KEYS (same order), then (code, id, sub-resources as JSON,
-- state JSON or '') per change; a code is the op's letter (p put, d delete, u publish) and the
-- resource's number: 'p1' puts into the first resource.
-- Returns '<epoch> <ms> <first seq> <count> 1 <renewed>': the changes' ids are ms-(first seq),
-- ms-(first seq + 1), ... in order. With a key already remembered it writes nothing and returns
-- the first call's '<epoch> <ms> <first seq> <count> 0 0'; an error KEYREUSED when that call had
-- other changes. `renewed` is 1 when the head was behind the witness: Redis lost commits it had
-- acknowledged (restored from an older snapshot, a lagging replica promoted), or when the witness
-- is of an epoch the bucket's history does not descend from and that did not end before this
-- history began (a split brain's other master acknowledged it), or of the epoch this history
-- left last, acknowledged after it left it (`{name}:epoch:from`: the other side of a split brain
-- went on in the epoch this side renewed); the bucket then gets a new epoch before this commit,
-- and every publisher tells its listeners to bootstrap again.
-- Ids come from one sequence for every partition (`last`), so they order every change of the
-- bucket, whatever its partition.
--
-- Redis's CPU is what bounds a writer that keeps several calls in flight, so the loop costs as
-- few `redis.call`s as it can: one XADD per change (a stream entry per call), and each run of
-- consecutive store writes of one kind (puts, or deletes) to one resource as one HSET and one
-- ZADD (one HDEL and one ZREM). A run ends where a store write of the other kind or of another
-- resource comes, so the store ends exactly as the writes one by one would leave it (a put,
-- delete, put of one id in one batch included); publishes write no store and end no run.
local call = redis.call
local key, digest, most = ARGV[3], ARGV[4], tonumber(ARGV[5])
if key ~= '' then
  local known = call('HGET', KEYS[6], key)
  if known then
    local epoch, ms, first, count, was = string.match(known, '^(%S+) (%d+) (%d+) (%d+) (%S*)$')
    if was ~= digest then
      return redis.error_reply('KEYREUSED ' .. count .. ' ' .. key)
    end
    return epoch .. ' ' .. ms .. ' ' .. first .. ' ' .. count .. ' 0 0'
  end
end
local n, epoch, last = ensure(ARGV[1], ARGV[2])
if not n then return redis.error_reply(epoch) end
local renewed = 0
local witness_epoch, witness_id = string.match(ARGV[6], '^(%S+) (%S+)$')
if witness_epoch then
  -- `{name}:epochs` lists the epochs this bucket's history descends from (renewals record
  -- them). A witness of any other epoch is of a history this Redis never held (the master of a
  -- split brain, demoted since): the commits acknowledged there are lost, as in a rollback.
  local past = KEYS[2] .. 's'
  local lost = witness_epoch == epoch and less(last, witness_id)
  local foreign = witness_epoch ~= epoch and not call('LPOS', past, witness_epoch)
  local from = witness_epoch ~= epoch and call('GET', KEYS[2] .. ':from')
  if from then
    -- The epoch this history left last, at Redis's ms `left_ms` (lib.lua `left`): a commit of
    -- it acknowledged later was acknowledged by another master that went on in it.
    local left_epoch, left_ms = string.match(from, '^(%S+) (%d+)$')
    if left_epoch == witness_epoch and tonumber(left_ms) < (parse(witness_id)) then
      lost = true
    end
  end
  if foreign then
    -- A history that began after the witness's commit (Redis came back empty and the bucket was
    -- created again) needs no new epoch: every publisher closed the old epoch's listeners when
    -- it saw that epoch gone, and every listener of this one started after the loss.
    local began = call('GET', KEYS[2] .. ':at')
    if began and tonumber(began) > (parse(witness_id)) then foreign = false end
  end
  if lost or foreign then
    if epoch ~= ARGV[1] then  -- else ensure() created the bucket just now: a new history
      call('LPUSH', past, epoch)
      left(epoch, last)
      epoch = ARGV[1]
      call('SET', KEYS[2], epoch)
      renewed = 1
    end
    if foreign then call('LPUSH', past, witness_epoch) end
    call('LTRIM', past, 0, 99)
  end
end
local lms, lseq = parse(last)
local ms, seq = now_ms(), -1
if ms <= lms then ms, seq = lms, lseq end
local resources = (#KEYS - 7) / 2
local first, count = seq + 1, (#ARGV - 6 - resources) / 4
local prefix = string.format('%d-', ms)
-- Lua writes a number below 1e14 as its integer digits, so `prefix .. seq` is the id; past
-- that it would switch to an exponent.
local plain = seq + count < 1e14
-- What each code means, decoded the first time the code is met.
local op_of, resource_of = {}, {}
local RUN = 1000
-- The current run: its op ('p' or 'd'), resource, the HSET (or HDEL) arguments after the key,
-- the ZADD arguments after the key (puts only) and how many changes it holds.
local run_op, run_r, fields, members, size = nil, 0, {}, {}, 0
local function flush()
  if run_op == 'p' then
    call('HSET', KEYS[6 + 2 * run_r], unpack(fields))
    call('ZADD', KEYS[7 + 2 * run_r], unpack(members))
  elseif run_op == 'd' then
    call('HDEL', KEYS[6 + 2 * run_r], unpack(fields))
    call('ZREM', KEYS[7 + 2 * run_r], unpack(fields))
  end
  run_op, fields, members, size = nil, {}, {}, 0
end
local log = KEYS[1]
for a = 7 + resources, #ARGV, 4 do
  local code, changed = ARGV[a], ARGV[a + 1]
  local op, r = op_of[code], resource_of[code]
  if not op then
    op, r = string.sub(code, 1, 1), tonumber(string.sub(code, 2))
    op_of[code], resource_of[code] = op, r
  end
  if op == 'p' or op == 'd' then
    if op ~= run_op or r ~= run_r or size == RUN then
      flush()
      run_op, run_r = op, r
    end
    size = size + 1
    if op == 'p' then
      fields[2 * size - 1], fields[2 * size] = changed, ARGV[a + 3]
      members[2 * size - 1], members[2 * size] = '0', changed
    else
      fields[size] = changed
    end
  end
  local target = log
  if n > 1 then
    target = log .. ':' .. (tonumber(string.sub(redis.sha1hex(changed), 1, 8), 16) % n)
  end
  seq = seq + 1
  local id
  if plain then id = prefix .. seq else id = prefix .. string.format('%d', seq) end
  call('XADD', target, id, 'r', ARGV[6 + r], 's', ARGV[a + 2], 'i', changed)
end
flush()
if count > 0 then call('SET', KEYS[4], prefix .. string.format('%d', seq)) end
local reply = string.format('%s %d %d %d 1 %d', epoch, ms, first, count, renewed)
if key ~= '' then
  call('HSET', KEYS[6], key, string.format('%s %d %d %d %s', epoch, ms, first, count, digest))
  call('ZADD', KEYS[7], ms, key)
  local excess = math.min(call('ZCARD', KEYS[7]) - most, 1000)
  if excess > 0 then
    call('HDEL', KEYS[6], unpack(call('ZRANGE', KEYS[7], 0, excess - 1)))
    call('ZREMRANGEBYRANK', KEYS[7], 0, excess - 1)
  end
end
return reply

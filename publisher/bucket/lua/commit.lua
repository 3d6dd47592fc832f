-- Commit changes: store each state and append each change item, atomically.
-- KEYS: common, idempotency hash, idempotency times, then (state, index) per resource of the
-- call, in the order the resources first appear in it.
-- ARGV: candidate epoch, wanted partitions, idempotency key ('' for none), digest of the changes,
-- most keys remembered, the writer's witnesses ('<id> <partition> <fingerprint>' each, space
-- separated: changes it was acknowledged and has not had checked since; or ''), the number of
-- transactions the call holds ('' for one: the key and digest above name it), the name of each
-- resource of KEYS (same order), then for a call of several transactions four per transaction
-- (its idempotency key or '', the digest of its changes, how many changes it has, and the number
-- in KEYS' order of each of its own resources, space separated), then (code, id, sub-resources
-- as JSON, state JSON or '') per change, the transactions' one after another; a code is the op's
-- letter (p put, d delete, u publish) and the resource's number (among its transaction's own
-- resources in a call of several): 'p1' puts into the first resource.
-- Returns '<epoch> <ms> <first seq> <count> 1 <renewed> <partition> <fingerprint>': the changes'
-- ids are ms-(first seq), ms-(first seq + 1), ... in order, and the last two name the last change
-- (the client's next witness; '0 -' for none). With a key already remembered it writes nothing
-- and returns the first call's '<epoch> <ms> <first seq> <count> 0 0'; an error KEYREUSED when
-- that call had other changes. `renewed` is 1 when this Redis lacks one of the witnesses: it lost
-- commits it had acknowledged (restored from an older snapshot, a lagging replica promoted), or
-- another master acknowledged them (a split brain's other side, whichever epoch either had); the
-- bucket then gets a new epoch before this commit, and every publisher tells its listeners to
-- bootstrap again.
-- A call of several transactions applies each one atomically and under its own key, in order:
-- one whose key is remembered (with the same digest) is skipped, the others written; KEYREUSED
-- when one's key was used for other changes (nothing written). Its reply is the one above for
-- the changes written now (count 0 when none, fresh always 1), followed by
-- ' <epoch> <ms> <first seq> <count> <fresh>' per transaction (fresh 0: skipped, and the first
-- call's figures). Each transaction's store writes go before its log items and its key after
-- them, so a call that fails part way (a key of the wrong type) leaves each transaction before
-- the failure whole and remembered, and the failing one without a log item.
-- Ids come from one sequence for every partition (`last`), so they order every change of the
-- bucket, whatever its partition.
--
-- Redis's CPU is what bounds a writer that keeps several calls in flight, so the loop costs as
-- few `redis.call`s as it can: one XADD per change (a stream entry per call), and each run of
-- consecutive store writes of one kind (puts, or deletes) to one resource as one HSET and one
-- ZADD (one HDEL and one ZREM). A run ends where a store write of the other kind or of another
-- resource comes, or its transaction ends, so the store ends exactly as the writes one by one
-- would leave it (a put, delete, put of one id in one batch included); publishes write no store
-- and end no run.
local call = redis.call
local most = tonumber(ARGV[5])
local resources = (#KEYS - 7) / 2
local group = ARGV[7] ~= ''
-- The transactions: key, digest, first ARGV of its changes, how many, its resource numbers.
local txns = {}
if group then
  local at = 8 + resources + 4 * tonumber(ARGV[7])
  for d = 8 + resources, 7 + resources + 4 * tonumber(ARGV[7]), 4 do
    local map = {}
    for r in string.gmatch(ARGV[d + 3], '%d+') do map[#map + 1] = tonumber(r) end
    local size = tonumber(ARGV[d + 2])
    txns[#txns + 1] = {ARGV[d], ARGV[d + 1], at, size, map}
    at = at + 4 * size
  end
else
  local map = {}
  for r = 1, resources do map[r] = r end
  txns[1] = {ARGV[3], ARGV[4], 8 + resources, (#ARGV - 7 - resources) / 4, map}
end
-- The transactions whose key is remembered: their first call's reply, by number.
local known, new = {}, 0
for t = 1, #txns do
  local key = txns[t][1]
  local found = key ~= '' and call('HGET', KEYS[6], key)
  if found then
    local epoch, ms, first, count, was = string.match(found, '^(%S+) (%d+) (%d+) (%d+) (%S*)$')
    if was ~= txns[t][2] then
      return redis.error_reply('KEYREUSED ' .. count .. ' ' .. key)
    end
    known[t] = epoch .. ' ' .. ms .. ' ' .. first .. ' ' .. count .. ' 0'
  else
    new = new + txns[t][4]
  end
end
if not group and known[1] then return known[1] .. ' 0' end
local n, epoch, last = ensure(ARGV[1], ARGV[2])
if not n then return redis.error_reply(epoch) end
local renewed = 0
if ARGV[6] ~= '' and epoch ~= ARGV[1] then  -- (else ensure() created the bucket just now)
  -- Each witness is a change this client was acknowledged and has not seen checked since: its id,
  -- its partition and the first 8 hex digits of the SHA-1 of its resource id. One this Redis does
  -- not hold was lost with its history (a rollback, a lagging replica promoted, the other side
  -- of a split brain, whatever epoch either side had) unless it was trimmed since (at or before
  -- `trimmed`: it cannot tell) or acknowledged before the current epoch began (`{name}:epoch:at`:
  -- the epoch's start told every listener to bootstrap again, after that commit). The history is
  -- a prefix of what its master wrote, so the change found stands for every change the client
  -- was acknowledged before it on the same connection.
  local trimmed, began
  for id, p, fp in string.gmatch(ARGV[6], '(%S+) (%S+) (%S+)') do
    local found = call('XRANGE', stream(n, tonumber(p)), id, id)
    local held = false
    if #found > 0 then
      local fields = found[1][2]
      for f = 1, #fields - 1, 2 do
        if fields[f] == 'i' then held = string.sub(redis.sha1hex(fields[f + 1]), 1, 8) == fp end
      end
    end
    if not held then
      trimmed = trimmed or call('GET', KEYS[5]) or '0-0'
      began = began or tonumber(call('GET', KEYS[2] .. ':at') or '0')
      if less(trimmed, id) and (parse(id)) >= began then
        epoch = ARGV[1]
        call('SET', KEYS[2], epoch)
        began_now(last)
        renewed = 1
        break
      end
    end
  end
end
local lms, lseq = parse(last)
local ms, seq = now_ms(), -1
if ms <= lms then ms, seq = lms, lseq end
local first = seq + 1
local prefix = string.format('%d-', ms)
-- Lua writes a number below 1e14 as its integer digits, so `prefix .. seq` is the id; past
-- that it would switch to an exponent.
local plain = seq + new < 1e14
-- What each code means, decoded the first time the code is met.
local op_of, resource_of = {}, {}
local RUN = 1000
-- The current run: its op ('p' or 'd'), resource, the HSET (or HDEL) arguments after the key,
-- the ZADD arguments after the key (puts only) and how many changes it holds.
local run_op, run_r, fields, members, size = nil, 0, {}, {}, 0
-- The last change's partition and resource id: the client's next witness.
local last_p, last_changed = 0, nil
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
local function decode(code)
  local op, r = op_of[code], resource_of[code]
  if not op then
    op, r = string.sub(code, 1, 1), tonumber(string.sub(code, 2))
    op_of[code], resource_of[code] = op, r
  end
  return op, r
end
local log = KEYS[1]
local replies = {}
local keyed = false
for t = 1, #txns do
  local key, digest, from, count, map = unpack(txns[t])
  local till = from + 4 * count - 1
  if known[t] then
    replies[t] = known[t]
  else
    -- The store's writes, in runs.
    for a = from, till, 4 do
      local op, r = decode(ARGV[a])
      if op == 'p' or op == 'd' then
        r = map[r]
        if op ~= run_op or r ~= run_r or size == RUN then
          flush()
          run_op, run_r = op, r
        end
        size = size + 1
        local changed = ARGV[a + 1]
        if op == 'p' then
          fields[2 * size - 1], fields[2 * size] = changed, ARGV[a + 3]
          members[2 * size - 1], members[2 * size] = '0', changed
        else
          fields[size] = changed
        end
      end
    end
    flush()
    -- The log's items.
    local own = seq + 1
    for a = from, till, 4 do
      local r = resource_of[ARGV[a]]  -- (decoded by the loop above)
      local changed = ARGV[a + 1]
      local target, p = log, 0
      if n > 1 then
        p = tonumber(string.sub(redis.sha1hex(changed), 1, 8), 16) % n
        target = log .. ':' .. p
      end
      seq = seq + 1
      local id
      if plain then id = prefix .. seq else id = prefix .. string.format('%d', seq) end
      call('XADD', target, id, 'r', ARGV[7 + map[r]], 's', ARGV[a + 2], 'i', changed)
      last_p, last_changed = p, changed
    end
    if count > 0 then
      call('SET', KEYS[4], prefix .. string.format('%d', seq))
    end
    replies[t] = string.format('%s %d %d %d 1', epoch, ms, own, count)
    if key ~= '' then
      call('HSET', KEYS[6], key, string.format('%s %d %d %d %s', epoch, ms, own, count, digest))
      call('ZADD', KEYS[7], ms, key)
      keyed = true
    end
  end
end
if keyed then
  local excess = math.min(call('ZCARD', KEYS[7]) - most, 1000)
  if excess > 0 then
    call('HDEL', KEYS[6], unpack(call('ZRANGE', KEYS[7], 0, excess - 1)))
    call('ZREMRANGEBYRANK', KEYS[7], 0, excess - 1)
  end
end
local witness = '0 -'
if last_changed then witness = last_p .. ' ' .. string.sub(redis.sha1hex(last_changed), 1, 8) end
local reply = string.format('%s %d %d %d 1 %d %s', epoch, ms, first, seq - first + 1, renewed,
                            witness)
if group then reply = reply .. ' ' .. table.concat(replies, ' ') end
return reply

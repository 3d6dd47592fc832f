-- Trim the log by age and by count, and forget idempotency keys older than the age.
-- KEYS: common, idempotency hash, idempotency times. ARGV: max age in ms (0: none), max items
-- (0: none), most items (and keys) to remove in one call. Removes the items older than max age by
-- Redis' own clock and the oldest beyond max items, across every partition, and raises the
-- trimmed horizon to the newest id removed. Returns {removed, 1 when more must go for the count
-- else 0}.
local n = partitions()
local max_age, max_items, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cutoff = nil
if max_age > 0 then
  local min_ms = now_ms() - max_age
  if min_ms > 0 then
    for p = 0, n - 1 do
      local last = redis.call('XREVRANGE', stream(n, p), '(' .. min_ms .. '-0', '-', 'COUNT', 1)
      if #last > 0 and (cutoff == nil or less(cutoff, last[1][1])) then cutoff = last[1][1] end
    end
    local forgotten = 0
    while forgotten < most do
      local old = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', '(' .. min_ms, 'LIMIT', 0, 1000)
      if #old == 0 then break end
      redis.call('HDEL', KEYS[6], unpack(old))
      redis.call('ZREM', KEYS[7], unpack(old))
      forgotten = forgotten + #old
    end
  end
end
local more = 0
if max_items > 0 then
  local total = 0
  for p = 0, n - 1 do total = total + redis.call('XLEN', stream(n, p)) end
  local excess = total - max_items
  if excess > most then excess, more = most, 1 end
  if excess > 0 then
    local heads, at = {}, {}
    for p = 0, n - 1 do
      heads[p] = redis.call('XRANGE', stream(n, p), '-', '+', 'COUNT', excess)
      at[p] = 1
    end
    local oldest
    for _ = 1, excess do
      local pick = nil
      for p = 0, n - 1 do
        local entry = heads[p][at[p]]
        if entry and (pick == nil or less(entry[1], heads[pick][at[pick]][1])) then pick = p end
      end
      oldest = heads[pick][at[pick]][1]
      at[pick] = at[pick] + 1
    end
    if cutoff == nil or less(cutoff, oldest) then cutoff = oldest end
  end
end
if cutoff == nil then return {0, more} end
local ms, seq = parse(cutoff)
local minid = string.format('%d-%d', ms, seq + 1)
local removed = 0
for p = 0, n - 1 do
  removed = removed + redis.call('XTRIM', stream(n, p), 'MINID', minid)
end
local old = redis.call('GET', KEYS[5])
if old == false or less(old, cutoff) then redis.call('SET', KEYS[5], cutoff) end
return {removed, more}

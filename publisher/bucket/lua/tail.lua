-- The tail's read: entries after a position, with what they are checked against, in one snapshot.
-- KEYS: common. ARGV: position (exclusive), most entries per partition (0: none), partition count
-- to read. Returns {epoch, stored partition count, head, trimmed, 1 if the entry at the position
-- is still there (or cannot be, at or before trimmed) else 0, length, entries ever added (-1:
-- unknown), then one XRANGE reply per partition}.
local after, count, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local trimmed = redis.call('GET', KEYS[5]) or '0-0'
local witnessed = 1
if after ~= '0-0' and less(trimmed, after) then witnessed = 0 end
local length, added, uncounted = 0, 0, false
local reads = {}
for p = 0, n - 1 do
  local s = stream(n, p)
  if redis.call('EXISTS', s) == 1 then
    local info, counted = redis.call('XINFO', 'STREAM', s), false
    for i = 1, #info, 2 do
      if info[i] == 'length' then length = length + info[i + 1] end
      if info[i] == 'entries-added' then added, counted = added + info[i + 1], true end
    end
    uncounted = uncounted or not counted
    if witnessed == 0 and #redis.call('XRANGE', s, after, after) > 0 then witnessed = 1 end
  end
  reads[p + 1] = {}
  if count > 0 then reads[p + 1] = redis.call('XRANGE', s, '(' .. after, '+', 'COUNT', count) end
end
if uncounted then added = -1 end
local out = {redis.call('GET', KEYS[2]) or '', redis.call('GET', KEYS[3]) or '', head(n), trimmed,
             witnessed, length, added}
for p = 1, n do out[#out + 1] = reads[p] end
return out

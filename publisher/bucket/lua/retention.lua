-- What the log retains. KEYS: common.
-- Returns {epoch, trimmed, head id, oldest id, partitions}.
local n = partitions()
local oldest = ''
for p = 0, n - 1 do
  local first = redis.call('XRANGE', stream(n, p), '-', '+', 'COUNT', 1)
  if #first > 0 and (oldest == '' or less(first[1][1], oldest)) then oldest = first[1][1] end
end
local trimmed = redis.call('GET', KEYS[5]) or '0-0'
return {redis.call('GET', KEYS[2]) or '', trimmed, head(n), oldest, n}

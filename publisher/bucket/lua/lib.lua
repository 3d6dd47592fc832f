-- Functions every script of the bucket starts with (scripts.py puts this file before each).
-- KEYS[1..5] are Keys.common: log, epoch, partitions, last, trimmed. The partition streams are
-- derived from KEYS[1], so they are in the bucket's hash slot.
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local function stream(n, p)
  if n == 1 then return KEYS[1] end
  return KEYS[1] .. ':' .. p
end
local function partitions()
  return tonumber(redis.call('GET', KEYS[3]) or '1')
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function head(n)
  local last = redis.call('GET', KEYS[4])
  if last then return last end
  local best = redis.call('GET', KEYS[5]) or '0-0'
  for p = 0, n - 1 do
    local top = redis.call('XREVRANGE', stream(n, p), '+', '-', 'COUNT', 1)
    if #top > 0 and less(best, top[1][1]) then best = top[1][1] end
  end
  return best
end
-- The partition count, created with the bucket (`wanted`: a number, or '' for the bucket's).
-- Returns the partition count, the epoch and the head (`last`), creating what is missing; or nil
-- and an error when the bucket was created with another count. One MGET for a bucket that
-- exists: the commit script uses what it read rather than reading the keys again.
local function ensure(candidate_epoch, wanted)
  wanted = tonumber(wanted)
  local found = redis.call('MGET', KEYS[3], KEYS[2], KEYS[4])
  local stored, epoch, last = found[1], found[2], found[3]
  local n = tonumber(stored or '0')
  if n == 0 then
    n = wanted or 1
    if epoch then n = 1 end
  end
  if wanted and wanted ~= n then
    return nil, 'PARTITIONS the bucket has ' .. n .. ' partition(s), not ' .. wanted
  end
  if not stored then redis.call('SET', KEYS[3], n) end
  if not epoch then
    epoch = candidate_epoch
    redis.call('SET', KEYS[2], epoch)
    -- When this epoch began (Redis's ms; renewals set it again): commit.lua tells by it a
    -- writer's witness of a change lost before (announced already) from one lost since.
    redis.call('SET', KEYS[2] .. ':at', now_ms())
  end
  if not last then
    last = head(n)
    redis.call('SET', KEYS[4], last)
  end
  return n, epoch, last
end
-- The current epoch begins now (a renewal): a witness of a change acknowledged before this moment
-- (Redis's ms, and never before the head's, `last`) that this history lacks was lost before the
-- renewal told every listener to bootstrap again; commit.lua renews again only for a later one.
local function began_now(last)
  local ms = now_ms()
  local lm = last and parse(last) or 0
  if lm > ms then ms = lm end
  redis.call('SET', KEYS[2] .. ':at', ms)
end

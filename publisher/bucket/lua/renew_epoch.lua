-- Replace the epoch only while it is still the caller's, so several publishers noticing one
-- rollback start one new epoch.
-- KEYS: common. ARGV: the epoch the caller knows, a new one. Returns the epoch ('' when the
-- bucket has none).
local current = redis.call('GET', KEYS[2])
if current == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  began_now(redis.call('GET', KEYS[4]))
  return ARGV[2]
end
return current or ''

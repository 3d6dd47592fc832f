-- Durable pull consumers: one script, ARGV[1] the operation. Every operation of one consumer is
-- atomic, so several instances (on several publishers) share its work safely.
-- KEYS: common (1-5), then the consumer's keys: 6 hash (config, incarnation, epoch, position,
-- counters), 7 pending (sorted set: log id -> ms when it may be handed out again), 8 items (hash:
-- log id -> the item, JSON), 9 deliveries (hash: log id -> deliveries so far), 10 dead (stream:
-- the dead-letter record), 11 the bucket's index of durable consumers (set of names).
local op = ARGV[1]
local now = now_ms()

local function dead(dead_max, ...)
  redis.call('XADD', KEYS[10], 'MAXLEN', dead_max, '*', 'at', now, ...)
  redis.call('HINCRBY', KEYS[6], 'dead', 1)
end

local function forget(id)
  redis.call('ZREM', KEYS[7], id)
  redis.call('HDEL', KEYS[8], id)
  redis.call('HDEL', KEYS[9], id)
end

if op == 'create' then
  -- ARGV: config (JSON), incarnation, epoch, position, name, max deliver, ack wait (ms), most
  -- pending. Returns {1, config, incarnation} when created, {0, the stored config, its
  -- incarnation} when a consumer of that name exists (nothing changed).
  local found = redis.call('HMGET', KEYS[6], 'config', 'incarnation')
  if found[1] then return {0, found[1], found[2]} end
  redis.call('HSET', KEYS[6], 'config', ARGV[2], 'incarnation', ARGV[3], 'epoch', ARGV[4],
    'position', ARGV[5], 'created', now, 'name', ARGV[6], 'max_deliver', ARGV[7],
    'ack_wait', ARGV[8], 'max_ack_pending', ARGV[9], 'delivered', 0, 'redelivered', 0,
    'acked', 0, 'nakked', 0, 'terminated', 0, 'dead', 0, 'gaps', 0)
  redis.call('SADD', KEYS[11], ARGV[6])
  return {1, ARGV[2], ARGV[3]}
end

if op == 'delete' then
  -- ARGV: name
  local existed = redis.call('DEL', KEYS[6])
  redis.call('DEL', KEYS[7], KEYS[8], KEYS[9], KEYS[10])
  redis.call('SREM', KEYS[11], ARGV[2])
  return existed
end

if op == 'info' then
  -- Returns the hash (flat), pending count, dead records kept, the oldest pending id ('' none),
  -- the next deadline ('' none), Redis's clock.
  local fields = redis.call('HGETALL', KEYS[6])
  if #fields == 0 then return {} end
  local oldest = ''
  for _, id in ipairs(redis.call('HKEYS', KEYS[8])) do
    if oldest == '' or less(id, oldest) then oldest = id end
  end
  local first = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
  return {fields, redis.call('ZCARD', KEYS[7]), redis.call('XLEN', KEYS[10]), oldest,
          first[2] or '', now}
end

if op == 'redeliver' then
  -- ARGV: most to hand out, dead-letter bound.
  -- Hands out again the items whose deadline passed (a nak's delay, an expired ack wait), up
  -- to `most`, earliest deadline first; an item handed out max deliver times goes to the dead
  -- letter record instead (and is settled). Returns {} when there is no such consumer, else
  -- {incarnation, epoch, position, config, pending, next deadline or '', dead-lettered, now,
  -- then (id, deliveries, item) per item}.
  local state = redis.call('HMGET', KEYS[6], 'incarnation', 'epoch', 'position', 'config',
    'max_deliver', 'ack_wait')
  if not state[1] then return {} end
  local max_deliver, ack_wait = tonumber(state[5]), tonumber(state[6])
  local most, dead_max = tonumber(ARGV[2]), tonumber(ARGV[3])
  local out = {}
  local buried = 0
  local handed = 0
  while handed < most do
    local due = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, most - handed)
    if #due == 0 then break end
    for _, id in ipairs(due) do
      local count = tonumber(redis.call('HGET', KEYS[9], id) or '0')
      local item = redis.call('HGET', KEYS[8], id) or ''
      if count >= max_deliver then
        dead(dead_max, 'reason', 'max_deliveries', 'id', id, 'deliveries', count, 'item', item)
        forget(id)
        buried = buried + 1
      else
        redis.call('HSET', KEYS[9], id, count + 1)
        redis.call('ZADD', KEYS[7], now + ack_wait, id)
        out[#out + 1] = id
        out[#out + 1] = count + 1
        out[#out + 1] = item
        handed = handed + 1
      end
    end
  end
  if handed > 0 then redis.call('HINCRBY', KEYS[6], 'redelivered', handed) end
  local first = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
  local head = {state[1], state[2], state[3], state[4], redis.call('ZCARD', KEYS[7]),
                first[2] or '', buried, now}
  for _, value in ipairs(out) do head[#head + 1] = value end
  return head
end

if op == 'dispatch' then
  -- ARGV: incarnation, epoch read, position read after, new position, gap after, gap through
  -- ('' for none), new epoch ('' unless the bucket was recreated), dead-letter bound, then
  -- (id, item) per item to hand out.
  -- Moves the consumer's position from what it was when the caller read the log to past what
  -- it read, and hands out the items the caller's filter chose: only if nobody moved it
  -- meanwhile (else status 0 with the epoch and position now: read again) and the items fit
  -- under the consumer's most pending (else status 2). A trimmed gap and a new epoch are
  -- recorded in the dead-letter record. Returns {status, pending, now, epoch, position};
  -- status 3: the consumer is gone.
  local state = redis.call('HMGET', KEYS[6], 'incarnation', 'epoch', 'position', 'ack_wait',
    'max_ack_pending')
  if state[1] ~= ARGV[2] then return {3, 0, now, '', ''} end
  local pending = redis.call('ZCARD', KEYS[7])
  if state[2] ~= ARGV[3] or state[3] ~= ARGV[4] then
    return {0, pending, now, state[2], state[3]}
  end
  local count = (#ARGV - 9) / 2
  if count > 0 and pending + count > tonumber(state[5]) then
    return {2, pending, now, state[2], state[3]}
  end
  local dead_max = tonumber(ARGV[9])
  local epoch = ARGV[3]
  if ARGV[8] ~= '' then
    dead(dead_max, 'reason', 'epoch', 'epoch', ARGV[3], 'after', ARGV[4])
    epoch = ARGV[8]
    redis.call('HSET', KEYS[6], 'epoch', epoch)
  end
  if ARGV[7] ~= '' then
    dead(dead_max, 'reason', 'trimmed', 'epoch', epoch, 'after', ARGV[6], 'through', ARGV[7])
    redis.call('HINCRBY', KEYS[6], 'gaps', 1)
  end
  local deadline = now + tonumber(state[4])
  for i = 10, #ARGV, 2 do
    redis.call('ZADD', KEYS[7], deadline, ARGV[i])
    redis.call('HSET', KEYS[8], ARGV[i], ARGV[i + 1])
    redis.call('HSET', KEYS[9], ARGV[i], 1)
  end
  redis.call('HSET', KEYS[6], 'position', ARGV[5])
  if count > 0 then redis.call('HINCRBY', KEYS[6], 'delivered', count) end
  return {1, pending + count, now, epoch, ARGV[5]}
end

if op == 'settle' then
  -- ARGV: action (ack, nak, in_progress, term), nak delay (ms), dead-letter bound, then
  -- (incarnation, id, delivery number) per delivery. Returns per delivery an
  -- outcome (1 applied, 2 redelivered since, 3 not pending, 4 of an earlier consumer) and
  -- whether its deadline had passed (1/0), flat; {} when the consumer does not exist.
  local state = redis.call('HMGET', KEYS[6], 'incarnation', 'ack_wait')
  local incarnation = state[1]
  if not incarnation then return {} end
  local action, ack_wait = ARGV[2], tonumber(state[2])
  local delay, dead_max = tonumber(ARGV[3]), tonumber(ARGV[4])
  local out = {}
  local applied = 0
  for i = 5, #ARGV, 3 do
    local id, number = ARGV[i + 1], tonumber(ARGV[i + 2])
    local outcome, late = 3, 0
    if ARGV[i] ~= incarnation then
      outcome = 4
    else
      local count = tonumber(redis.call('HGET', KEYS[9], id) or '0')
      if count > 0 and number < count then
        outcome = 2
      elseif count > 0 and number == count then
        outcome = 1
        applied = applied + 1
        if tonumber(redis.call('ZSCORE', KEYS[7], id)) < now then late = 1 end
        if action == 'ack' then
          forget(id)
        elseif action == 'nak' then
          redis.call('ZADD', KEYS[7], now + delay, id)
        elseif action == 'in_progress' then
          redis.call('ZADD', KEYS[7], now + ack_wait, id)
        else
          local item = redis.call('HGET', KEYS[8], id) or ''
          dead(dead_max, 'reason', 'terminated', 'id', id, 'deliveries', count, 'item', item)
          forget(id)
        end
      end
    end
    out[#out + 1] = outcome
    out[#out + 1] = late
  end
  local counter = ({ack = 'acked', nak = 'nakked', term = 'terminated'})[action]
  if counter and applied > 0 then redis.call('HINCRBY', KEYS[6], counter, applied) end
  return out
end

return redis.error_reply('durable.lua: unknown operation ' .. tostring(op))

-- add / remove / end_session: ARGV[2] op, [3] url or key, [4] redacted name (add).
local op, arg = ARGV[2], ARGV[3]
if op == 'add' then
  if redis.call('HEXISTS', K_BYURL, arg) == 1 then return 0 end
  local id = redis.call('HINCRBY', K_META, 'next_id', 1)
  redis.call('HSET', K_URL, id, arg)
  redis.call('HSET', K_NAME, id, ARGV[4])
  redis.call('HSET', K_BYURL, arg, id)
  redis.call('HSET', K_LEASES, id, 0)
  redis.call('HSET', K_KEYS, id, 0)
  set_state(id, 'healthy', 'added')
  return 1
elseif op == 'remove' then
  local id = redis.call('HGET', K_BYURL, arg)
  if not id then return 0 end
  set_state(id, 'removed', 'removed')
  -- The url and name stay: bindings to it report a broken session with its address.
  redis.call('HDEL', K_BYURL, arg)
  for _, k in ipairs({K_STATE, K_SINCE, K_LEASES, K_KEYS, K_WIN, K_STREAK, K_LEVEL, K_CYCLES}) do
    redis.call('HDEL', k, id)
  end
  redis.call('ZREM', K_DUE, 'q' .. id)
  return 1
elseif op == 'end_session' then
  return unbind(arg) and 1 or 0
end
return redis.error_reply('unknown op ' .. tostring(op))

-- snapshot: everything the client needs to build a Snapshot, in one round trip.
local states = redis.call('HGETALL', K_STATE)
local until_ms = {}
for i = 1, #states, 2 do
  if states[i + 1] == 'quarantined' then
    until_ms[#until_ms + 1] = states[i]
    until_ms[#until_ms + 1] = redis.call('ZSCORE', K_DUE, 'q' .. states[i])
  end
end
return {
  states, redis.call('HGETALL', K_URL), redis.call('HGETALL', K_NAME),
  redis.call('HGETALL', K_LEASES), redis.call('HGETALL', K_KEYS), redis.call('HGETALL', K_SINCE),
  until_ms, redis.call('HGETALL', K_LEVEL),
  redis.call('HGETALL', K_CYCLES), redis.call('HGETALL', K_META), redis.call('HLEN', K_BIND),
  redis.call('LRANGE', K_LOG, 0, 199)
}

-- snapshot: everything the client needs to build a Snapshot, in one round trip.
return {
  redis.call('HGETALL', K_STATE), redis.call('HGETALL', K_URL), redis.call('HGETALL', K_NAME),
  redis.call('HGETALL', K_LEASES), redis.call('HGETALL', K_KEYS), redis.call('HGETALL', K_SINCE),
  redis.call('ZRANGE', K_QEXP, 0, -1, 'WITHSCORES'), redis.call('HGETALL', K_LEVEL),
  redis.call('HGETALL', K_CYCLES), redis.call('HGETALL', K_META), redis.call('HLEN', K_BIND),
  redis.call('LRANGE', K_LOG, 0, 199)
}

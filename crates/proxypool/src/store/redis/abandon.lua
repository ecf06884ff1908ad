-- abandon (a dropped lease): ARGV[2] lease id, [3] address id. Frees the slot, no outcome.
if close_lease(ARGV[2], ARGV[3], redis.call('HGET', K_STATE, ARGV[3])) then
  redis.call('HINCRBY', K_META, 'abandoned', 1)
end
return 1

-- abandon (a dropped lease): ARGV[2] lease id. Frees the slot, no health outcome.
if close_lease(ARGV[2]) then redis.call('HINCRBY', K_META, 'abandoned', 1) end
return 1

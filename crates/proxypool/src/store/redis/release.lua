-- release: ARGV[2] lease id, [3] address id, [4] outcome class; health arguments at [5..14].
-- An expired lease frees nothing twice, but its outcome is still news about the address.
local state = redis.call('HGET', K_STATE, ARGV[3])
if close_lease(ARGV[2], ARGV[3], state) then redis.call('HINCRBY', K_META, 'released', 1) end
outcome(ARGV[3], ARGV[4], state)
return 1

-- release: ARGV[2] lease id, [3] address id, [4] outcome class; health arguments at [5..14].
-- An expired lease frees nothing twice, but its outcome is still news about the address.
if close_lease(ARGV[2]) then redis.call('HINCRBY', K_META, 'released', 1) end
outcome(ARGV[3], ARGV[4])
return 1

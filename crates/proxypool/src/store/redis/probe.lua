-- probe report: ARGV[2] url, [3] '1' passed / '0' failed; health arguments at [5..14].
-- Probing or dead: a pass counts toward the rise; probing: a failure back to quarantine;
-- in service: a failure is one failed outcome; a pass there is not news.
local id = redis.call('HGET', K_BYURL, ARGV[2])
if not id then return 0 end
local s = redis.call('HGET', K_STATE, id)
if ARGV[3] == '1' then
  if s == 'probing' or s == 'dead' then outcome(id, 's', s) end
else
  outcome(id, 'f', s)
end
return 1

-- acquire: ARGV[2] lease TTL ms, [3] session TTL ms, [4] per-address lease cap, [5] key ('' =
-- keyless). Returns {lease id, address id, url, choice} or {'err', kind, url}.
local lease_ttl, session_ttl, cap, key = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]

local function grant(id, choice)
  local lid = redis.call('HINCRBY', K_META, 'seq', 1)
  redis.call('ZADD', K_DUE, now + lease_ttl, 'l' .. lid .. ':' .. id)
  -- The cap was checked before: this counter only witnesses that it held (tests, dashboards).
  if redis.call('HINCRBY', K_LEASES, id, 1) > cap then redis.call('HINCRBY', K_META, 'over_cap', 1) end
  return {lid, tonumber(id), redis.call('HGET', K_URL, id), choice}
end

local function fail(kind, id)
  redis.call('HINCRBY', K_META, kind, 1)
  return {'err', kind, id and redis.call('HGET', K_URL, id) or ''}
end

if key ~= '' then
  local id = redis.call('HGET', K_BIND, key)
  if id then
    local s = redis.call('HGET', K_STATE, id)
    if s == 'healthy' or s == 'degraded' then
      if num(redis.call('HGET', K_LEASES, id)) >= cap then return fail('busy', id) end
      redis.call('ZADD', K_DUE, now + session_ttl, 'b' .. key)
      return grant(id, 'bound')
    end
    -- Quarantined, probing, dead or removed: never moved silently (P2).
    unbind(key)
    return fail('broken', id)
  end
  -- A new session: rendezvous hashing over the addresses in service, bounded loads.
  local states = redis.call('HGETALL', K_STATE)
  local cands, offered = {}, 0
  for i = 1, #states, 2 do
    local cid, s = states[i], states[i + 1]
    if STEP[s] then
      offered = offered + 1
      if s ~= 'probing' and num(redis.call('HGET', K_LEASES, cid)) < cap then
        cands[#cands + 1] = {redis.sha1hex(key .. '\n' .. redis.call('HGET', K_URL, cid)), cid}
      end
    end
  end
  table.sort(cands, function(a, b) return a[1] > b[1] end)
  local bound = math.ceil(1.25 * (num(redis.call('HGET', K_META, 'bound')) + 1) / math.max(offered, 1))
  for _, c in ipairs(cands) do
    if num(redis.call('HGET', K_KEYS, c[2])) < bound then
      redis.call('HSET', K_BIND, key, c[2])
      redis.call('ZADD', K_DUE, now + session_ttl, 'b' .. key)
      redis.call('HINCRBY', K_KEYS, c[2], 1)
      redis.call('HINCRBY', K_META, 'bound', 1)
      return grant(c[2], 'hashed')
    end
  end
  return fail('none', nil)
end

-- Keyless: the lowest pass below the cap (see STEP in common.lua), scanned 16 at a time.
local offset = 0
while true do
  local batch = redis.call('ZRANGE', K_PASS, offset, offset + 15)
  if #batch == 0 then return fail('none', nil) end
  for _, cid in ipairs(batch) do
    if num(redis.call('HGET', K_LEASES, cid)) < cap then
      redis.call('ZINCRBY', K_PASS, STEP[redis.call('HGET', K_STATE, cid)] or 1, cid)
      return grant(cid, 'weighted')
    end
  end
  offset = offset + 16
end

-- acquire: ARGV[2] lease TTL ms, [3] session TTL ms, [4] per-address lease cap, [5] key ('' =
-- keyless). Returns {lease id, address id, url, choice} or {'err', kind, url}.
local lease_ttl, session_ttl, cap, key = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]

local function grant(id, choice)
  local lid = redis.call('HINCRBY', K_META, 'seq', 1)
  redis.call('HSET', K_LEASE, lid, id)
  redis.call('ZADD', K_LEASE_EXP, now + lease_ttl, lid)
  local n = redis.call('HINCRBY', K_LEASES, id, 1)
  if n > num(redis.call('HGET', K_PEAK, id)) then redis.call('HSET', K_PEAK, id, n) end
  return {lid, tonumber(id), redis.call('HGET', K_URL, id), choice}
end

local function fail(kind, id)
  redis.call('HINCRBY', K_META, kind, 1)
  return {'err', kind, id and redis.call('HGET', K_URL, id) or ''}
end

local weights = {healthy = 1, degraded = 0.5, probing = 0.1}

if key ~= '' then
  local id = redis.call('HGET', K_BIND, key)
  if id then
    local s = redis.call('HGET', K_STATE, id)
    if s == 'healthy' or s == 'degraded' then
      if num(redis.call('HGET', K_LEASES, id)) >= cap then return fail('busy', id) end
      redis.call('ZADD', K_BIND_EXP, now + session_ttl, key)
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
    if weights[s] then
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
      redis.call('ZADD', K_BIND_EXP, now + session_ttl, key)
      redis.call('HINCRBY', K_KEYS, c[2], 1)
      redis.call('HINCRBY', K_META, 'bound', 1)
      return grant(c[2], 'hashed')
    end
  end
  return fail('none', nil)
end

-- Keyless: weighted least connections, (leases + 1) / weight, ties rotated by a cursor.
local states = redis.call('HGETALL', K_STATE)
local pairs_n = #states / 2
if pairs_n == 0 then return fail('none', nil) end
local start = redis.call('HINCRBY', K_META, 'rr', 1) % pairs_n
local best, best_score = nil, nil
for j = 0, pairs_n - 1 do
  local i = ((start + j) % pairs_n) * 2 + 1
  local cid, w = states[i], weights[states[i + 1]]
  if w then
    local l = num(redis.call('HGET', K_LEASES, cid))
    if l < cap then
      local score = (l + 1) / w
      if not best_score or score < best_score then best, best_score = cid, score end
    end
  end
end
if not best then return fail('none', nil) end
return grant(best, 'least_connections')

-- Shared by every script of the Redis store (prepended at build time). All keys of one pool
-- carry the hash tag {pool}, so they live in one Cluster slot and one script may touch them all.
local K_META, K_URL, K_NAME, K_BYURL, K_STATE, K_SINCE, K_LEASES, K_DUE, K_BIND, K_KEYS, K_WIN,
      K_STREAK, K_LEVEL, K_CYCLES, K_LOG, K_PASS = unpack(KEYS)
local now = tonumber(ARGV[1])

local function num(v) return tonumber(v or '0') or 0 end

-- Keyless selection is stride scheduling (smooth weighted): the offered address with the
-- lowest pass in K_PASS wins and its pass grows by its step, the inverse of its weight
-- (healthy 1, degraded 0.5, probing 0.1). O(log n) per acquire, where a scan would be O(n).
local STEP = {healthy = 1, degraded = 2, probing = 10}

-- Quarantined and probing count against the cap (the episode is still open).
local function counted(s) return s == 'quarantined' or s == 'probing' end

local function set_state(id, to, reason)
  local from = redis.call('HGET', K_STATE, id) or 'absent'
  redis.call('HSET', K_STATE, id, to)
  redis.call('HSET', K_SINCE, id, now)
  if counted(to) and not counted(from) then
    local q = redis.call('HINCRBY', K_META, 'q', 1)
    if q > num(redis.call('HGET', K_META, 'q_peak')) then redis.call('HSET', K_META, 'q_peak', q) end
  elseif counted(from) and not counted(to) then
    redis.call('HINCRBY', K_META, 'q', -1)
  end
  if to == 'quarantined' then redis.call('HINCRBY', K_META, 'q_entries', 1) end
  if not STEP[to] then
    redis.call('ZREM', K_PASS, id)
  elseif not STEP[from] then
    -- Joins at the current lowest pass: no catch-up burst.
    local head = redis.call('ZRANGE', K_PASS, 0, 0, 'WITHSCORES')
    redis.call('ZADD', K_PASS, head[2] or 0, id)
  end
  redis.call('LPUSH', K_LOG, table.concat({now, redis.call('HGET', K_NAME, id) or id, from, to, reason}, '\t'))
  redis.call('LTRIM', K_LOG, 0, 999)
end

-- Every deadline is one member of K_DUE, so the sweep is one command when nothing is due:
-- 'l<lease id>:<address id>' (P14), 'b<key>' (P2), 'q<address id>' (P6).
local function unbind(key)
  local id = redis.call('HGET', K_BIND, key)
  redis.call('ZREM', K_DUE, 'b' .. key)
  if not id then return false end
  redis.call('HDEL', K_BIND, key)
  redis.call('HINCRBY', K_META, 'bound', -1)
  if redis.call('HEXISTS', K_STATE, id) == 1 then redis.call('HINCRBY', K_KEYS, id, -1) end
  return true
end

-- Frees the slot of an open lease; false if it was closed or expired already. `state` is the
-- address's state if the caller read it (nil: removed, nothing to count).
local function close_lease(lid, id, state)
  if redis.call('ZREM', K_DUE, 'l' .. lid .. ':' .. id) == 0 then return false end
  if state then redis.call('HINCRBY', K_LEASES, id, -1) end
  return true
end

local function sweep()
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', K_DUE, '-inf', now, 'LIMIT', 0, 64)) do
    local kind, rest = string.sub(m, 1, 1), string.sub(m, 2)
    if kind == 'l' then
      local lid, id = string.match(rest, '^(%d+):(%d+)$')
      if close_lease(lid, id, redis.call('HGET', K_STATE, id)) then
        redis.call('HINCRBY', K_META, 'expired', 1)
      end
    elseif kind == 'b' then
      unbind(rest)
    else
      redis.call('ZREM', K_DUE, m)
      if redis.call('HGET', K_STATE, rest) == 'quarantined' then
        redis.call('HSET', K_STREAK, rest, 0)
        set_state(rest, 'probing', 'quarantine wait over; half-open')
      end
    end
  end
end

-- Health arguments, at the same place in every script that judges (release, probe):
-- ARGV[5] recent, [6] recent_failures, [7] quarantine cap fraction, [8] min in service,
-- [9] backoff base ms, [10] backoff max ms, [11] jitter factor, [12] dead after cycles,
-- [13] rise successes, [14] min dwell ms.
local function quarantine(id, from, reason)
  local n = redis.call('HLEN', K_STATE)
  local cap = math.max(1, math.ceil(tonumber(ARGV[7]) * n))
  local offered = 0
  for _, s in ipairs(redis.call('HVALS', K_STATE)) do
    if s == 'healthy' or s == 'degraded' or s == 'probing' then offered = offered + 1 end
  end
  local q = num(redis.call('HGET', K_META, 'q'))
  local min_in_service = math.min(tonumber(ARGV[8]), n)
  local refusal = nil
  if not counted(from) and q >= cap then
    refusal = 'quarantine cap ' .. cap .. ' reached'
  elseif offered - 1 < min_in_service then
    refusal = 'minimum in service ' .. min_in_service
  end
  if refusal then
    if from == 'healthy' then
      set_state(id, 'degraded', reason .. '; kept in service at reduced weight: ' .. refusal)
    elseif from == 'probing' then
      redis.call('HSET', K_STREAK, id, 0)
    end
    return
  end
  local cycles = num(redis.call('HGET', K_CYCLES, id))
  if from == 'probing' then
    cycles = cycles + 1
    redis.call('HSET', K_CYCLES, id, cycles)
  end
  redis.call('HDEL', K_WIN, id)
  if cycles >= tonumber(ARGV[12]) then
    set_state(id, 'dead', reason .. '; ' .. cycles .. ' failed quarantine cycles in a row')
    return
  end
  local level = num(redis.call('HGET', K_LEVEL, id))
  local wait = math.floor(math.min(tonumber(ARGV[9]) * 2 ^ level, tonumber(ARGV[10])) * tonumber(ARGV[11]))
  redis.call('HSET', K_LEVEL, id, level + 1)
  redis.call('ZADD', K_DUE, now + wait, 'q' .. id)
  set_state(id, 'quarantined', reason .. '; quarantined for ' .. math.floor(wait / 1000) .. ' s')
end

-- One outcome of address `id`: 's' success, 'f' failure, 'c' captcha (neither: it is judged
-- by its rate, which this store does not keep), anything else no health news.
local function outcome(id, class, s)
  if not s then return end
  local function dwelt() return now - num(redis.call('HGET', K_SINCE, id)) >= tonumber(ARGV[14]) end
  if s == 'probing' or s == 'dead' then
    if class == 's' then
      local streak = redis.call('HINCRBY', K_STREAK, id, 1)
      if streak >= tonumber(ARGV[13]) and dwelt() then
        redis.call('HSET', K_CYCLES, id, 0)
        set_state(id, 'healthy', streak .. ' successes in a row')
      end
    elseif class == 'f' and s == 'probing' then
      quarantine(id, s, 'failure while probing')
    elseif class == 'f' then
      redis.call('HSET', K_STREAK, id, 0)
    end
    return
  end
  if s ~= 'healthy' and s ~= 'degraded' then return end
  if class ~= 's' and class ~= 'f' and class ~= 'c' then return end
  -- The last `recent` outcomes, kept only while one of them is a failure: a clean record is
  -- the common case and costs one read.
  local old = redis.call('HGET', K_WIN, id)
  if not old and class ~= 'f' then
    if s == 'degraded' and dwelt() then set_state(id, 'healthy', 'signals cleared') end
    return
  end
  local win = string.sub(class .. (old or ''), 1, tonumber(ARGV[5]))
  local _, fails = string.gsub(win, 'f', '')
  if fails == 0 then redis.call('HDEL', K_WIN, id) else redis.call('HSET', K_WIN, id, win) end
  if class == 'f' and fails >= tonumber(ARGV[6]) then
    quarantine(id, s, fails .. ' failures in the last ' .. #win .. ' outcomes')
  elseif s == 'degraded' and fails == 0 and dwelt() then
    set_state(id, 'healthy', 'signals cleared')
  end
end

sweep()

#!lua name=__LIB__
-- The Redis store as one function library: loaded once per server (FUNCTION LOAD), called with
-- FCALL. Nothing is parsed or defined again per call, which matters: on Redis 7.0 a script's
-- fixed cost and each redis.call are the whole price of an acquire or a release.
--
-- Every function takes one key, the pool's meta hash `proxypool:{NAME}:meta`; the pool's other
-- keys share its prefix, so they share its hash tag and Cluster slot.
--
-- Arguments common to every function: ARGV[1] now (ms, the caller's pool clock), [2] '1' to
-- sweep due deadlines first, [3] the per-address lease cap. Acquire and release take batches
-- (the client coalesces concurrent calls: one FCALL's fixed cost, many operations) and reply
-- with a flag `more`: 1 when the sweep stopped at its limit and the caller should sweep again.
--
-- Key layout (suffixes of the prefix):
--   meta   hash: counters (seq, released, expired, …), `bound`, `offered`, `q`, `next_id`
--   url    hash id → full URL (kept after removal: broken sessions name their address)
--   name   hash id → redacted URL
--   byurl  hash full URL → id (present addresses only)
--   state  hash id → health state (present addresses only; the index for scans)
--   a:ID   hash of one address: s state, n open leases, k bound keys, w outcome window,
--          t state since, lv backoff level, cy failed cycles, st success streak,
--          fp fingerprint (52 bits), v ring points, 'cool|<site>' end of a rate limit's
--          cooling or of an avoidance for that site ('-': tickets without a site),
--          'w|<site>' the pair's recent outcomes while one of them is a block or captcha
--   c:ID   hash of one address's outcome counts per site: '<site>|<class>' → n ('-' for
--          tickets without a site), for the address × site matrix and the address's rates
--   due    zset of deadlines: 'l<lease>:<id>' lease TTL (P14), 'b<key>' binding TTL (P2),
--          'q<id>' end of a quarantine wait (P6). Redis 7.0 has no per-field TTL.
--   bind   hash key → id (P2)
--   pass   zset 'id:step' → pass, of the addresses offered for keyless work and below the cap
--   ring   zset 'id:v' → point, the consistent-hash ring (P1), at the points the client computes
--   log    list of state transitions, newest first
--   prober the token of the process whose prober probes the pool, with a TTL
--   cools  hash site → the latest end of any cooling for it, so acquires for a site without
--          one skip the per-address check

local NAMES = {'meta', 'url', 'name', 'byurl', 'state', 'due', 'bind', 'log', 'pass', 'ring'}
local pools = {}

local function keys_of(meta)
  local K = pools[meta]
  if K then return K end
  local prefix = string.sub(meta, 1, -5)
  K = {prefix = prefix}
  for _, n in ipairs(NAMES) do K[n] = prefix .. n end
  pools[meta] = K
  return K
end

local function addr(K, id) return K.prefix .. 'a:' .. id end

local function num(v) return tonumber(v or '0') or 0 end

-- Keyless selection is stride scheduling (smooth weighted): the member of `pass` with the lowest
-- pass wins and its pass grows by its step, the inverse of its weight. The step is in the
-- member's name so that picking needs no second read.
local STEP = {healthy = 1, degraded = 2, probing = 10}
local BY_STEP = {['1'] = 'healthy', ['2'] = 'degraded', ['10'] = 'probing'}
-- The same steps as text: a number in a string costs Lua 5.1 an sprintf.
local STEP_TEXT = {healthy = '1', degraded = '2', probing = '10'}

local function member(id, s) return id .. ':' .. STEP_TEXT[s] end

-- Quarantined and probing count against the quarantine cap (the episode is still open).
local function counted(s) return s == 'quarantined' or s == 'probing' end

-- Joining afresh: at the current lowest pass, so no catch-up burst.
local function join_pass(K, m)
  local head = redis.call('ZRANGE', K.pass, 0, 0, 'WITHSCORES')
  redis.call('ZADD', K.pass, head[2] or 0, m)
end

local function set_state(K, id, to, reason, now, cap)
  local a = addr(K, id)
  local f = redis.call('HMGET', a, 's', 'n')
  local from, n = f[1] or 'absent', num(f[2])
  redis.call('HSET', a, 's', to, 't', now)
  redis.call('HSET', K.state, id, to)
  if counted(to) and not counted(from) then
    local q = redis.call('HINCRBY', K.meta, 'q', '1')
    if q > num(redis.call('HGET', K.meta, 'q_peak')) then redis.call('HSET', K.meta, 'q_peak', q) end
  elseif counted(from) and not counted(to) then
    redis.call('HINCRBY', K.meta, 'q', '-1')
  end
  if to == 'quarantined' then redis.call('HINCRBY', K.meta, 'q_entries', '1') end
  if STEP[to] and not STEP[from] then
    redis.call('HINCRBY', K.meta, 'offered', '1')
  elseif STEP[from] and not STEP[to] then
    redis.call('HINCRBY', K.meta, 'offered', '-1')
  end
  -- Membership of `pass`: offered and below the cap. A change of step keeps the pass.
  local score = nil
  if STEP[from] then
    score = redis.call('ZSCORE', K.pass, member(id, from))
    redis.call('ZREM', K.pass, member(id, from))
  end
  if STEP[to] and n < cap then
    if score then redis.call('ZADD', K.pass, score, member(id, to)) else join_pass(K, member(id, to)) end
  end
  redis.call('LPUSH', K.log, table.concat({now, redis.call('HGET', K.name, id) or id, from, to, reason}, '\t'))
  redis.call('LTRIM', K.log, 0, 999)
end

local function unbind(K, key)
  local id = redis.call('HGET', K.bind, key)
  redis.call('ZREM', K.due, 'b' .. key)
  if not id then return false end
  redis.call('HDEL', K.bind, key)
  redis.call('HINCRBY', K.meta, 'bound', '-1')
  if redis.call('HEXISTS', K.state, id) == 1 then redis.call('HINCRBY', addr(K, id), 'k', '-1') end
  return true
end

-- An open lease of `id` (state `s`; nil if removed: nothing to count) has ended.
local function freed(K, id, s, cap)
  if not s then return end
  local n = redis.call('HINCRBY', addr(K, id), 'n', '-1')
  -- Back below the cap: offered for keyless work again.
  if n == cap - 1 and STEP[s] then join_pass(K, member(id, s)) end
end

-- Frees the slot of an open lease; false if it was closed or expired already.
local function close_lease(K, lid, id, s, cap)
  if redis.call('ZREM', K.due, 'l' .. lid .. ':' .. id) == 0 then return false end
  freed(K, id, s, cap)
  return true
end

-- A batch of acquires shares what does not depend on one acquire: one reservation of lease
-- ids, one ZADD of the deadlines, one read of the keyless candidates (the lowest passes) and
-- one write of their new passes. (Arguments to redis.call are strings where possible: Lua 5.1
-- turns each number into one with sprintf.)
local function new_batch(K, cap, size)
  local last = redis.call('HINCRBY', K.meta, 'seq', tostring(size))
  return {K = K, cap = cap, next_lid = last - size + 1, last_lid = last, due = {}, full = {}, cool_memo = {}}
end

-- Takes one more lease on `id` (state `s`) if the cap allows; its deadline (and the binding's,
-- for a key) is set when the batch ends. Returns the lease id, or nil at the cap.
local function take(B, id, s, lease_deadline, session_deadline, key)
  local a = addr(B.K, id)
  local n = redis.call('HINCRBY', a, 'n', '1')
  if n > B.cap then
    redis.call('HINCRBY', a, 'n', '-1')
    B.full[id] = true
    return nil
  end
  if n == B.cap then
    B.full[id] = true
    if STEP[s] then redis.call('ZREM', B.K.pass, member(id, s)) end
  end
  local lid = B.next_lid
  B.next_lid = lid + 1
  local due = B.due
  due[#due + 1] = lease_deadline
  due[#due + 1] = 'l' .. lid .. ':' .. id
  if key then
    due[#due + 1] = session_deadline
    due[#due + 1] = 'b' .. key
  end
  return lid
end

-- Writes the passes the batch advanced (XX: not for those that left `pass` meanwhile).
local function flush_passes(B)
  local c = B.cand
  if not c then return end
  local updates = {}
  for i = 1, #c, 6 do
    if c[i + 3] and not B.full[c[i]] then
      updates[#updates + 1] = c[i + 2]
      updates[#updates + 1] = c[i + 4]
      c[i + 3] = false
    end
  end
  if #updates > 0 then redis.call('ZADD', B.K.pass, 'XX', unpack(updates)) end
end

local function end_batch(B)
  flush_passes(B)
  if #B.due > 0 then redis.call('ZADD', B.K.due, unpack(B.due)) end
  local unused = B.last_lid - B.next_lid + 1
  if unused > 0 then redis.call('HINCRBY', B.K.meta, 'seq', tostring(-unused)) end
end

-- Whether `id` cools for the current acquire's site (read once per batch and site).
local function cools(B, id)
  if not B.site_cools then return false end
  local memo = B.cool_memo[B.site]
  if not memo then
    memo = {}
    B.cool_memo[B.site] = memo
  end
  local c = memo[id]
  if c == nil then
    c = num(redis.call('HGET', addr(B.K, id), 'cool|' .. B.site)) > B.now
    memo[id] = c
  end
  return c
end

-- Keyless, stride scheduling: a batch reads the lowest passes once (`wanted` of them, plus
-- the next one's pass as a bound) and then picks, each time, the candidate whose pass plus
-- its steps taken in this batch is lowest; the passes are written back when the batch ends.
-- Read again (after writing back) when every candidate is full or the lowest would pass the
-- bound, where an address not read would be next; candidates cooling for the acquire's site
-- are passed over. Candidates are flat: id, state, pass (with this batch's picks), changed,
-- member, step.
local function keyless(B, lease_deadline, wanted)
  for attempt = 1, 3 do
    if not B.cand then
      -- Wider when the first read held only full or cooling candidates; the third reads all.
      local n = attempt == 1 and wanted or attempt == 2 and wanted + 32 or -1
      local c = {}
      local r = redis.call('ZRANGE', B.K.pass, '0', tostring(n), 'WITHSCORES')
      B.bound = nil
      if n >= 0 and #r > 2 * n then
        B.bound = tonumber(r[#r])
        r[#r], r[#r - 1] = nil, nil
      end
      for i = 1, #r, 2 do
        local id, step = string.match(r[i], '^(%d+):(%d+)$')
        c[#c + 1] = id
        c[#c + 1] = BY_STEP[step]
        c[#c + 1] = tonumber(r[i + 1])
        c[#c + 1] = false
        c[#c + 1] = r[i]
        c[#c + 1] = tonumber(step)
      end
      B.cand = c
    end
    local c = B.cand
    local cooling, skipped = {}, false
    while true do
      local best, best_pass = nil, nil
      local full = B.full
      for i = 1, #c, 6 do
        local p = c[i + 2]
        if (not best_pass or p < best_pass) and not full[c[i]] and not cooling[i] then
          best, best_pass = i, p
        end
      end
      -- Past the bound an address not read would be next — unless cooling ones were passed
      -- over, when any candidate left is better than none.
      if not best or (B.bound and best_pass > B.bound and not skipped) then break end
      local id = c[best]
      if cools(B, id) then
        -- Rate limited for this acquire's site: the next best, for this acquire only.
        cooling[best], skipped = true, true
      else
        local lid = take(B, id, c[best + 1], lease_deadline)
        if lid then
          c[best + 2] = best_pass + c[best + 5]
          c[best + 3] = true
          -- Those passed over for cooling do not bank the turns they missed: no burst at
          -- the site when their cooling ends.
          for k in pairs(cooling) do
            if c[k + 2] < best_pass then
              c[k + 2] = best_pass
              c[k + 3] = true
            end
          end
          return lid, tonumber(id), 'weighted'
        end
        -- At the cap yet in `pass`: only if processes disagree on the cap. Out until a release.
        redis.call('ZREM', B.K.pass, c[best + 4])
      end
    end
    flush_passes(B)
    B.cand = nil
  end
  return 0, 0, 'none'
end

local function sweep(K, now, now_text, cap)
  local due = redis.call('ZRANGE', K.due, '-inf', now_text, 'BYSCORE', 'LIMIT', '0', '64')
  for _, m in ipairs(due) do
    local kind, rest = string.sub(m, 1, 1), string.sub(m, 2)
    if kind == 'l' then
      local lid, id = string.match(rest, '^(%d+):(%d+)$')
      if close_lease(K, lid, id, redis.call('HGET', addr(K, id), 's'), cap) then
        redis.call('HINCRBY', K.meta, 'expired', '1')
      end
    elseif kind == 'b' then
      unbind(K, rest)
    else
      redis.call('ZREM', K.due, m)
      if redis.call('HGET', addr(K, rest), 's') == 'quarantined' then
        redis.call('HSET', addr(K, rest), 'st', '0')
        set_state(K, rest, 'probing', 'quarantine wait over; half-open', now, cap)
      end
    end
  end
  return #due == 64 and 1 or 0
end

-- The call's context from the common arguments; sweeps if asked.
local function open(keys, args)
  local K = keys_of(keys[1])
  local now, cap = tonumber(args[1]), tonumber(args[3])
  local more = 0
  if args[2] == '1' then more = sweep(K, now, args[1], cap) end
  return K, now, cap, more
end

-- Health settings come as one space-separated argument, parsed when a judgement needs them:
-- recent, recent failures, quarantine cap fraction, minimum in service, backoff base ms,
-- backoff max ms, dead after cycles, rise successes, minimum dwell ms.
local HEALTH_FIELDS = {'recent', 'recent_failures', 'qcap', 'min_in_service', 'base', 'max', 'dead_after', 'rise', 'dwell'}
local parsed_health = {}

local function health(text)
  local h = parsed_health[text]
  if h then return h end
  h = {}
  local i = 1
  for v in string.gmatch(text, '%S+') do
    h[HEALTH_FIELDS[i]] = tonumber(v)
    i = i + 1
  end
  parsed_health[text] = h
  return h
end

local function quarantine(K, id, from, reason, now, cap, H, jitter)
  local a = addr(K, id)
  local total = redis.call('HLEN', K.state)
  local qcap = math.max(1, math.ceil(H.qcap * total))
  local m = redis.call('HMGET', K.meta, 'q', 'offered')
  local q, offered = num(m[1]), num(m[2])
  local min_in_service = math.min(H.min_in_service, total)
  local refusal = nil
  if not counted(from) and q >= qcap then
    refusal = 'quarantine cap ' .. qcap .. ' reached'
  elseif offered - 1 < min_in_service then
    refusal = 'minimum in service ' .. min_in_service
  end
  if refusal then
    if from == 'healthy' then
      set_state(K, id, 'degraded', reason .. '; kept in service at reduced weight: ' .. refusal, now, cap)
    elseif from == 'probing' then
      redis.call('HSET', a, 'st', '0')
    end
    return
  end
  local cycles = num(redis.call('HGET', a, 'cy'))
  if from == 'probing' then
    cycles = cycles + 1
    redis.call('HSET', a, 'cy', cycles)
  end
  redis.call('HDEL', a, 'w')
  if cycles >= H.dead_after then
    set_state(K, id, 'dead', reason .. '; ' .. cycles .. ' failed quarantine cycles in a row', now, cap)
    return
  end
  local level = redis.call('HINCRBY', a, 'lv', '1') - 1
  local wait = math.floor(math.min(H.base * 2 ^ level, H.max) * jitter)
  redis.call('ZADD', K.due, now + wait, 'q' .. id)
  set_state(K, id, 'quarantined', reason .. '; quarantined for ' .. math.floor(wait / 1000) .. ' s', now, cap)
end

-- One outcome of address `id` in state `s` with outcome window `win`: 's' success, 'f' failure,
-- 'c' captcha (neither: the in-memory engine judges it per site, by its rate), anything else
-- ('b' a block by a named site, 'r' a rate limit) no health news for the address as a whole. `settings` is the health argument, parsed only when a judgement needs it.
local function dwelt(a, now, H) return now - num(redis.call('HGET', a, 't')) >= H.dwell end

local function outcome(K, id, class, s, win, now, cap, settings, jitter)
  -- The common case, a success of a healthy address with a clean record, is no news.
  if not s or (class == 's' and s == 'healthy' and not win) then return end
  local a = addr(K, id)
  if s == 'probing' or s == 'dead' then
    if class == 's' then
      local H = health(settings)
      local streak = redis.call('HINCRBY', a, 'st', '1')
      if streak >= H.rise and dwelt(a, now, H) then
        redis.call('HSET', a, 'cy', '0')
        set_state(K, id, 'healthy', streak .. ' successes in a row', now, cap)
      end
    elseif class == 'f' and s == 'probing' then
      quarantine(K, id, s, 'failure while probing', now, cap, health(settings), jitter)
    elseif class == 'f' then
      redis.call('HSET', a, 'st', '0')
    end
    return
  end
  if s ~= 'healthy' and s ~= 'degraded' then return end
  if class ~= 's' and class ~= 'f' and class ~= 'c' then return end
  -- The last `recent` outcomes, kept only while one of them is a failure: a clean record is
  -- the common case and costs nothing more.
  if not win and class ~= 'f' then
    if s == 'degraded' and dwelt(a, now, health(settings)) then set_state(K, id, 'healthy', 'signals cleared', now, cap) end
    return
  end
  local H = health(settings)
  win = string.sub(class .. (win or ''), 1, H.recent)
  local _, fails = string.gsub(win, 'f', '')
  if fails == 0 then redis.call('HDEL', a, 'w') else redis.call('HSET', a, 'w', win) end
  if class == 'f' and fails >= H.recent_failures then
    quarantine(K, id, s, fails .. ' failures in the last ' .. #win .. ' outcomes', now, cap, H, jitter)
  elseif s == 'degraded' and fails == 0 and dwelt(a, now, H) then
    set_state(K, id, 'healthy', 'signals cleared', now, cap)
  end
end

-- The most ring points one placement looks at: with bounded loads the first fit is near.
local RING_WALK = 2048

-- How many bound keys an address may hold when one more is placed: the port of
-- `strategy::consistent_hash::Capacity`, with fingerprints and thresholds on 52 bits.
local TWO52 = 2 ^ 52
local function capacity(bound, addresses, factor)
  if addresses == 0 then return 0, 0 end
  local x = factor * (bound + 1) / addresses
  if x < 1 then return 1, 0 end
  local floor = math.floor(x)
  return floor, math.min((x - floor) * 8, 1) * TWO52
end

-- One acquire: `key` ('' = keyless) and its ring `point`. Returns lease id, address id and the
-- choice, or 0, address id or 0, and 'busy' | 'broken' | 'none'.
local function acquire_one(B, lease_deadline, session_deadline, factor, key, point, keyless_left)
  local K, cap = B.K, B.cap
  if key == '' then return keyless(B, lease_deadline, keyless_left) end
  local id = redis.call('HGET', K.bind, key)
  if id then
    local f = redis.call('HMGET', addr(K, id), 's', 'cool|' .. B.site)
    local s = f[1]
    if s == 'healthy' or s == 'degraded' then
      -- Rate limited there: the session is kept; the caller learns until when (in the lease
      -- id's place).
      if num(f[2]) > B.now then return tonumber(f[2]), tonumber(id), 'cooling' end
      local lid = take(B, id, s, lease_deadline, session_deadline, key)
      if not lid then return 0, tonumber(id), 'busy' end
      return lid, tonumber(id), 'bound'
    end
    -- Quarantined, probing, dead or removed: never moved silently (P2).
    unbind(K, key)
    return 0, tonumber(id), 'broken'
  end
  -- A new session: clockwise on the ring from the key's point to the first address in service
  -- (not probing) below the lease cap whose bound keys leave room (bounded loads).
  local m = redis.call('HMGET', K.meta, 'bound', 'offered')
  local floor, threshold = capacity(num(m[1]), num(m[2]), factor)
  local ceiling = floor + (threshold > 0 and 1 or 0)
  local seen, fallback = {}, nil
  local function bind(cid, s)
    local lid = take(B, cid, s, lease_deadline, session_deadline, key)
    redis.call('HSET', K.bind, key, cid)
    redis.call('HINCRBY', addr(K, cid), 'k', '1')
    redis.call('HINCRBY', K.meta, 'bound', '1')
    return lid, tonumber(cid), 'hashed'
  end
  -- Nothing offered below the cap: no walk (it would visit the whole ring).
  if redis.call('ZCARD', K.pass) == 0 then return 0, 0, 'none' end
  -- By rank from the key's point, with wrap-around; at most RING_WALK points, and never
  -- past the point where every address has been seen.
  local points, addresses = redis.call('ZCARD', K.ring), redis.call('HLEN', K.state)
  local start, seen_n = redis.call('ZCOUNT', K.ring, '-inf', '(' .. point), 0
  local walked = 0
  while walked < points and walked < RING_WALK and seen_n < addresses do
    local from = (start + walked) % points
    local to = math.min(from + 31, points - 1)
    for _, p in ipairs(redis.call('ZRANGE', K.ring, tostring(from), tostring(to))) do
      local cid = string.match(p, '^(%d+):')
      if not seen[cid] then
        seen[cid] = true
        seen_n = seen_n + 1
        local f = redis.call('HMGET', addr(K, cid), 's', 'n', 'k', 'fp', 'cool|' .. B.site)
        local s = f[1]
        if (s == 'healthy' or s == 'degraded') and num(f[2]) < cap and num(f[5]) <= B.now then
          local k = num(f[3])
          if k < floor + (num(f[4]) < threshold and 1 or 0) then return bind(cid, s) end
          if not fallback and k < ceiling then fallback = {cid, s} end
        end
      end
    end
    walked = walked + (to - from + 1)
  end
  if fallback then return bind(fallback[1], fallback[2]) end
  return 0, 0, 'none'
end

-- acquire, a batch of them in order: ARGV[4] the leases' deadline, [5] the sessions' deadline
-- (ms), [6] load factor, then per acquire: key ('' = keyless), the key's ring point, site
-- ('-' for none). Replies three elements per acquire (see acquire_one), then `more` and the
-- pool's epoch. An acquire that finds nothing
-- sweeps first if the call did not (expired leases may be what holds the capacity).
local function acquire(keys, args)
  local K, now, cap, more = open(keys, args)
  local swept = args[2] == '1'
  local lease_deadline, session_deadline, factor = args[4], args[5], tonumber(args[6])
  local size, keyless_left = (#args - 6) / 3, 0
  for i = 7, #args, 3 do
    if args[i] == '' then keyless_left = keyless_left + 1 end
  end
  local B = new_batch(K, cap, size)
  B.now = now
  local site_cools = {}
  local out = {}
  for i = 7, #args, 3 do
    local key, point = args[i], args[i + 1]
    B.site = args[i + 2]
    if site_cools[B.site] == nil then
      site_cools[B.site] = num(redis.call('HGET', K.prefix .. 'cools', B.site)) > now
    end
    B.site_cools = site_cools[B.site]
    local lid, id, tag = acquire_one(B, lease_deadline, session_deadline, factor, key, point, keyless_left)
    if tag == 'none' and not swept then
      -- The batch's pending deadlines first: the sweep must see refreshed bindings as such.
      swept = true
      flush_passes(B)
      B.cand = nil
      if #B.due > 0 then redis.call('ZADD', K.due, unpack(B.due)) end
      B.due = {}
      if sweep(K, now, args[1], cap) == 1 then more = 1 end
      -- Leases the sweep ended may have made room on addresses the batch filled.
      B.full = {}
      lid, id, tag = acquire_one(B, lease_deadline, session_deadline, factor, key, point, keyless_left)
    end
    if key == '' then keyless_left = keyless_left - 1 end
    if tag ~= 'weighted' and tag ~= 'bound' and tag ~= 'hashed' then redis.call('HINCRBY', K.meta, tag, '1') end
    out[#out + 1] = lid
    out[#out + 1] = id
    out[#out + 1] = tag
  end
  end_batch(B)
  out[#out + 1] = more
  -- Which incarnation of the pool answered (see `add`): a client that sees it change knows
  -- its cached ids are stale.
  out[#out + 1] = redis.call('HGET', K.meta, 'epoch') or ''
  return out
end

-- A rate limit: `id` cools for `site` until `until_ms` (never shortened); the site's latest
-- cooling end rises with it.
local function cool(K, id, site, until_ms)
  local field = 'cool|' .. site
  if tonumber(until_ms) > num(redis.call('HGET', addr(K, id), field)) then
    redis.call('HSET', addr(K, id), field, until_ms)
  end
  if tonumber(until_ms) > num(redis.call('HGET', K.prefix .. 'cools', site)) then
    redis.call('HSET', K.prefix .. 'cools', site, until_ms)
  end
end

-- The address × site pair (P9): blocks and captchas from one site are that pair's problem,
-- not the address's. When the pair's last `recent` outcomes hold `recent_failures` of them,
-- the address is kept away from the site (passed over there, bound sessions told to wait) for
-- the backoff base; its health elsewhere is untouched. The window is kept only while it holds
-- a block or captcha, and read with the address's own in one HMGET.
local function judge_pair(K, id, site, class, win, now, settings)
  local H = health(settings)
  local a = addr(K, id)
  win = string.sub(class .. (win or ''), 1, H.recent)
  local _, bad = string.gsub(win, '[bc]', '')
  if bad == 0 then
    redis.call('HDEL', a, 'w|' .. site)
  elseif bad >= H.recent_failures then
    redis.call('HDEL', a, 'w|' .. site)
    cool(K, id, site, tostring(now + H.base))
    redis.call('LPUSH', K.log, table.concat({now, redis.call('HGET', K.name, id) or id, 'ok', 'avoided',
      'on site ' .. site .. ': ' .. bad .. ' blocks or captchas in the last ' .. #win ..
      ' outcomes; kept away from it for ' .. math.floor(H.base / 1000) .. ' s'}, '\t'))
    redis.call('LTRIM', K.log, 0, 999)
  else
    redis.call('HSET', a, 'w|' .. site, win)
  end
end

-- release, a batch of them: ARGV[4] health settings, then per lease: lease id, address id,
-- outcome class ('a' for a lease dropped unreleased: no outcome), backoff jitter factor, site
-- ('-' for none), for a rate limit ('r') the end of the cooling it asks for (ms). A lease no
-- longer open frees nothing; its outcome is judged if it was granted in this epoch (expired),
-- not if it comes from before Redis lost the pool (its address id may name another address). Released leases are not
-- counted: every lease is released, expired, abandoned or open, so the snapshot derives it.
local function release(keys, args)
  local K, now, cap, more = open(keys, args)
  local settings = args[4]
  local leases = {}
  for i = 5, #args, 6 do leases[#leases + 1] = 'l' .. args[i] .. ':' .. args[i + 1] end
  -- Which are still open, and close them: two calls for the whole batch.
  local scores = redis.call('ZMSCORE', K.due, unpack(leases))
  local open_leases = {}
  for j = 1, #leases do
    if scores[j] then open_leases[#open_leases + 1] = leases[j] end
  end
  if #open_leases > 0 then redis.call('ZREM', K.due, unpack(open_leases)) end
  local abandoned = 0
  -- Lease ids of this epoch: an expired lease's outcome is still news about its address; one
  -- from before a loss names nothing.
  local ids = redis.call('HMGET', K.meta, 'seq0', 'seq')
  local first, last = num(ids[1]), num(ids[2])
  for j = 1, #leases do
    local i = 5 + (j - 1) * 6
    local lid = tonumber(args[i])
    if scores[j] or (lid and lid > first and lid <= last) then
      local id, class, site = args[i + 1], args[i + 2], args[i + 4]
      local f = redis.call('HMGET', addr(K, id), 's', 'w', 'w|' .. site)
      if scores[j] then freed(K, id, f[1], cap) end
      if class == 'a' then
        if scores[j] then abandoned = abandoned + 1 end
      elseif f[1] then
        redis.call('HINCRBY', K.prefix .. 'c:' .. id, site .. '|' .. class, '1')
        if class == 'r' then cool(K, id, site, args[i + 5]) end
        if site ~= '-' and (f[3] or class == 'b' or class == 'c') then
          judge_pair(K, id, site, class, f[3], now, settings)
        end
        outcome(K, id, class, f[1], f[2], now, cap, settings, tonumber(args[i + 3]))
      end
    end
  end
  if abandoned > 0 then redis.call('HINCRBY', K.meta, 'abandoned', tostring(abandoned)) end
  return more
end

-- probe report: ARGV[4] url, [5] '1' passed / '0' failed, [6] jitter, [7] health settings.
-- Probing or dead: a pass counts toward the rise; probing: a failure back to quarantine; in
-- service: a failure is one failed outcome; a pass there is not news. Replies 0 if unknown.
local function probe(keys, args)
  local K, now, cap = open(keys, args)
  local id = redis.call('HGET', K.byurl, args[4])
  if not id then return 0 end
  local f = redis.call('HMGET', addr(K, id), 's', 'w')
  local s = f[1]
  if args[5] == '1' then
    if s == 'probing' or s == 'dead' then outcome(K, id, 's', s, f[2], now, cap, args[7], tonumber(args[6])) end
  else
    outcome(K, id, 'f', s, f[2], now, cap, args[7], tonumber(args[6]))
  end
  return 1
end

-- add: ARGV[4] url, [5] redacted name, [6] fingerprint (52 bits), [7] an epoch token (16
-- random hex digits), [8..] ring points. Replies 0 if the URL is present already (every process may add the same
-- start list). The first add of a pool (or of a pool Redis lost) sets its epoch.
local function add(keys, args)
  local K, now, cap = open(keys, args)
  local url = args[4]
  if redis.call('HEXISTS', K.byurl, url) == 1 then return 0 end
  -- A new epoch starts lease ids at a random point below 2^44, so that leases granted before
  -- a loss cannot close the new ones. (Below 10^14: Lua 5.1 prints larger numbers with an
  -- exponent, and lease members are built from the printed id.)
  if redis.call('HSETNX', K.meta, 'epoch', args[7]) == 1 then
    local seq0 = tostring(tonumber(string.sub(args[7], 1, 11), 16))
    redis.call('HSET', K.meta, 'seq', seq0, 'seq0', seq0)
  end
  local id = redis.call('HINCRBY', K.meta, 'next_id', '1')
  redis.call('HSET', K.url, id, url)
  redis.call('HSET', K.name, id, args[5])
  redis.call('HSET', addr(K, id), 'n', '0', 'k', '0', 'fp', args[6], 'v', #args - 7)
  -- In chunks: Lua's unpack has a limit of a few thousand values.
  local points = {}
  for i = 8, #args do
    points[#points + 1] = args[i]
    points[#points + 1] = id .. ':' .. (i - 8)
    if #points == 1000 or i == #args then
      redis.call('ZADD', K.ring, unpack(points))
      points = {}
    end
  end
  set_state(K, id, 'healthy', 'added', now, cap)
  -- Last: until here a failed add leaves nothing that says the URL is present.
  redis.call('HSET', K.byurl, url, id)
  return 1
end

-- remove: ARGV[4] url. The url and name stay: bindings to it report a broken session with its
-- address. Replies 0 if unknown.
local function remove(keys, args)
  local K, now, cap = open(keys, args)
  local id = redis.call('HGET', K.byurl, args[4])
  if not id then return 0 end
  set_state(K, id, 'removed', 'removed', now, cap)
  local a = addr(K, id)
  local points, vnodes = {}, num(redis.call('HGET', a, 'v'))
  for v = 0, vnodes - 1 do
    points[#points + 1] = id .. ':' .. v
    if #points == 1000 or v == vnodes - 1 then
      redis.call('ZREM', K.ring, unpack(points))
      points = {}
    end
  end
  redis.call('HDEL', K.byurl, args[4])
  redis.call('HDEL', K.state, id)
  redis.call('DEL', a, K.prefix .. 'c:' .. id)
  redis.call('ZREM', K.due, 'q' .. id)
  return 1
end

-- end_session: ARGV[4] key. Replies 1 if it was bound.
local function end_session(keys, args)
  local K = open(keys, args)
  return unbind(K, args[4]) and 1 or 0
end

-- snapshot: everything the client needs to build a Snapshot, in one round trip: the state
-- index, URLs, names, each present address's hash and outcome counts (in the index's order),
-- quarantine deadlines, meta, the number of bindings and the newest 200 transitions.
local function snapshot(keys, args)
  local K = open(keys, args)
  local states = redis.call('HGETALL', K.state)
  local rows, cells, until_ms = {}, {}, {}
  for i = 1, #states, 2 do
    rows[#rows + 1] = redis.call('HGETALL', addr(K, states[i]))
    cells[#cells + 1] = redis.call('HGETALL', K.prefix .. 'c:' .. states[i])
    if states[i + 1] == 'quarantined' then
      until_ms[#until_ms + 1] = states[i]
      until_ms[#until_ms + 1] = redis.call('ZSCORE', K.due, 'q' .. states[i])
    end
  end
  return {
    states, redis.call('HGETALL', K.url), redis.call('HGETALL', K.name), rows, cells, until_ms,
    redis.call('HGETALL', K.meta), redis.call('HLEN', K.bind), redis.call('LRANGE', K.log, 0, 199)
  }
end

-- targets: what the prober needs and no more: per present address its state, URL and open
-- leases. ARGV[4] the asking prober's token, [5] how long (ms) its role holds: one prober
-- per pool probes (the others get nothing) until it stops asking for that long.
local function targets(keys, args)
  local K = open(keys, args)
  local role = K.prefix .. 'prober'
  local holder = redis.call('GET', role)
  if holder and holder ~= args[4] then return {} end
  redis.call('SET', role, args[4], 'PX', args[5])
  local states = redis.call('HGETALL', K.state)
  local out = {}
  for i = 1, #states, 2 do
    out[#out + 1] = states[i + 1]
    out[#out + 1] = redis.call('HGET', K.url, states[i])
    out[#out + 1] = redis.call('HGET', addr(K, states[i]), 'n') or '0'
  end
  return out
end

redis.register_function('__LIB___acquire', acquire)
redis.register_function('__LIB___release', release)
redis.register_function('__LIB___probe', probe)
redis.register_function('__LIB___add', add)
redis.register_function('__LIB___remove', remove)
redis.register_function('__LIB___end_session', end_session)
redis.register_function('__LIB___snapshot', snapshot)
redis.register_function('__LIB___targets', targets)

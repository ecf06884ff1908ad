#!lua name=__LIB__
-- The Redis store as one function library: loaded once per server (FUNCTION LOAD), called with
-- FCALL. Nothing is parsed or defined again per call, which matters: on Redis 7.0 a script's
-- fixed cost and each redis.call are the whole price of an acquire or a release.
--
-- Every function takes one key, the pool's meta hash `proxypool:{NAME}:meta`; the pool's other
-- keys share its prefix, so they share its hash tag and Cluster slot.
--
-- Arguments common to every function: ARGV[1] now (ms, the caller's pool clock), [2] '1' to
-- sweep due deadlines first, [3] the per-address lease cap, [4] the configuration (see
-- `health`). Acquires and releases travel together in batches (`ops`: the client coalesces
-- concurrent calls, one FCALL's fixed cost for many operations), whose reply carries a flag
-- `more`: 1 when the sweep stopped at its limit and the caller should sweep again.
--
-- Key layout (suffixes of the prefix):
--   meta   hash: counters (seq, reserved, granted, released, expired, …), `bound`, `offered`,
--          `q`, `next_id`, `orphans` (open leases of removed addresses), 'rr', 'rr@NAME' round-robin's cursor,
--          per sub-pool 'offered@NAME', 'bound@NAME', 'members@NAME' (see `pool_of`),
--          `layout` (see LAYOUT), `frozen` (P9: our side) and `sv` (moved by every site's
--          change, see `site`); per site 'd|SITE', 'sid|SITE' (see `site_fields`) and 'cool|SITE', the latest end
--          of any cooling for it, so acquires for a site without one skip the per-address
--          check; `site_ids`, the last site number given
--   url    hash id → full URL (kept after removal: broken sessions name their address)
--   name   hash id → redacted URL
--   byurl  hash full URL → id (present addresses only)
--   state  hash id → health state (present addresses only; the index for scans)
--   a:ID   hash of one address: s state, n open leases, k bound keys ('bound', 'bound@NAME':
--          those bound through the whole pool, through sub-pool NAME), t state since,
--          wb the time of its window's newest counted bad outcome (absent once the window is
--          clean: see `WENTRY`), su failures since suspect (P4), lv backoff level,
--          cy failed cycles, st success streak, qe quarantine entries, ss stable (healthy)
--          since, rs ramp start (P10), p keyless step (its `pass` member is 'ID:p'),
--          ver its version (moved by every transition: see `apply`),
--          fp fingerprint (52 bits), v ring points, sp its sub-pools' names (space
--          separated; absent: the whole pool only), qlat and ql its latency's and its
--          quality level (see `rate_level`),
--          'cool|<site>' end of a rate limit's
--          cooling or of an avoidance for that site ('-': tickets without a site),
--          'av|<site>' and 'avr|<site>' when the pair's avoidance ends by time alone and
--          why (see `pair`), 'pb|<site>' the time of the pair's newest counted bad outcome
--   w:ID, w:ID:SID  the outcome windows of an address and of its pair with site number SID
--          (see `WENTRY`)
--   c:ID   hash of one address's outcome counts per site: '<site>|<class>' → n ('-' for
--          tickets without a site; '-|a' its abandoned leases, '-|p' its failed probes in
--          service), for the address × site matrix
--          and the address's rates
--   due    zset of deadlines: 'l<lease>:<id>' lease TTL (P14), 'b<key>' binding TTL (P2),
--          'q<id>' end of a quarantine wait (P6), 'r<id>' next ramp stage (P10), 'v<id>|SITE'
--          end of a pair's avoidance (P9). Redis 7.0
--          has no per-field TTL.
--   bind   hash key → id, then ' NAME' if bound through sub-pool NAME (P2)
--   pass   zset 'id:step' → pass, of the addresses offered for keyless work and below the cap;
--          the step is the inverse of the weight (state × ramp share), as text; last, PASS_END
--   ring   zset 'id:v' → point, the consistent-hash ring (P1), at the points the client computes
--   ids    zset id → id of the pool's members (least connections draws from it by rank)
--   sp:NAME:pass, sp:NAME:ring, sp:NAME:ids  the same three for sub-pool NAME and its members
--   log    list of state transitions, newest first
--   prober the token of the process whose prober probes the pool, with a TTL
--   cooled:SITE  set of the addresses with a 'cool|SITE' field, deleted with those fields
--          once the site's latest cooling is over
--   sw:SITE  the site's outcome window (see `site_fields`)

-- A function of a library reads its globals through a metatable (Redis 7 gives it an empty
-- table whose `__index` is the real one), so each `redis`, `string`, `tonumber` … costs two
-- table lookups: about 3 % of a pair's server instructions. Those are taken once, at the first
-- call (`entry`), into locals of the same names; `call` is `redis.call`. (While the library
-- loads, the standard library is not reachable.)
local call, string, math, table, tonumber, tostring, unpack, ipairs, pairs

local function entry(f)
  return function(keys, args)
    if not call then
      local G = _G
      call, string, math, table = G.redis.call, G.string, G.math, G.table
      tonumber, tostring, unpack, ipairs, pairs = G.tonumber, G.tostring, G.unpack, G.ipairs, G.pairs
    end
    return f(keys, args)
  end
end

-- A field's value as a number, 0 when absent.
local function num(v)
  if not v then return 0 end
  return tonumber(v) or 0
end

-- Lua 5.1 writes a number as text with sprintf, which costs more than most commands here
-- (about half a microsecond): non-negative integers are written from memoized parts instead,
-- the thousands (few distinct ones at a time) and the last three digits.
local SMALL, LOW3 = nil, nil
local thousands, thousands_n = {}, 0
local function digits(n)
  if n < 0 or n >= 1e14 or n ~= math.floor(n) then return tostring(n) end
  if not SMALL then
    -- Built on first use: the standard library is not reachable while the library loads.
    SMALL, LOW3 = {}, {}
    for i = 0, 999 do SMALL[i], LOW3[i] = tostring(i), string.format('%03d', i) end
  end
  local hi = math.floor(n / 1000)
  if hi == 0 then return SMALL[n] end
  local h = thousands[hi]
  if not h then
    if thousands_n >= 4096 then thousands, thousands_n = {}, 0 end
    h = tostring(hi)
    thousands[hi], thousands_n = h, thousands_n + 1
  end
  return h .. LOW3[n - hi * 1000]
end

local NAMES = {'meta', 'url', 'name', 'byurl', 'state', 'due', 'bind', 'log', 'pass', 'ring', 'ids'}
local pools = {}

local function keys_of(meta)
  local K = pools[meta]
  if K then return K end
  local prefix = string.sub(meta, 1, -5)
  K = {
    prefix = prefix, sub = {}, sub_n = 0, specs = {}, lists = {}, lists_n = 0, a = {}, c = {}, w = {}, a_n = 0,
    sw = {}, sw_n = 0,
  }
  for _, n in ipairs(NAMES) do K[n] = prefix .. n end
  pools[meta] = K
  return K
end

-- The selection structures of the whole pool (name '') or of a sub-pool: its `pass`, `ring`
-- and `ids` zsets and its `meta` counters of offered addresses, keys bound through it and
-- members (the whole pool's members are the `state` index).
local function pool_of(K, name)
  local P = K.sub[name]
  if P then return P end
  -- Bounded: sub-pool names come from callers.
  if K.sub_n >= 10000 then K.sub, K.sub_n, K.specs = {}, 0, {} end
  if name == '' then
    P = {
      name = '', pass = K.pass, ring = K.ring, ids = K.ids, offered = 'offered', bound = 'bound',
      cursor = 'rr',
    }
  else
    local p = K.prefix .. 'sp:' .. name .. ':'
    P = {
      name = name, pass = p .. 'pass', ring = p .. 'ring', ids = p .. 'ids', offered = 'offered@' .. name,
      cursor = 'rr@' .. name,
      bound = 'bound@' .. name, members = 'members@' .. name,
    }
  end
  K.sub[name], K.sub_n = P, K.sub_n + 1
  return P
end

-- The pools an address belongs to, from its `sp` field (its sub-pools' names, space
-- separated; absent for the whole pool only): the whole pool first.
local function pools_in(K, sp)
  local text = sp or ''
  local L = K.lists[text]
  if L then return L end
  if K.lists_n >= 10000 then K.lists, K.lists_n = {}, 0 end
  L = {pool_of(K, '')}
  for name in string.gmatch(text, '%S+') do L[#L + 1] = pool_of(K, name) end
  K.lists[text], K.lists_n = L, K.lists_n + 1
  return L
end

-- How many addresses a pool has.
local function members_of(K, P)
  if P.members then return num(call('HGET', K.meta, P.members)) end
  return call('HLEN', K.state)
end

-- The keys of an address's hash, outcome counts and window, made once per address (and
-- server): most operations name one or more, and a string made in Lua costs about as much as a
-- command.
local function remember(K, id)
  if K.a_n >= 100000 then K.a, K.c, K.w, K.a_n = {}, {}, {}, 0 end
  local a = K.prefix .. 'a:' .. id
  K.a[id], K.c[id], K.w[id], K.a_n = a, K.prefix .. 'c:' .. id, K.prefix .. 'w:' .. id, K.a_n + 1
  return a
end

local function addr(K, id) return K.a[id] or remember(K, id) end

local function counts_key(K, id)
  local c = K.c[id]
  if c then return c end
  remember(K, id)
  return K.c[id]
end

-- The `meta` field names of a site, made once per site (and server): every release batch
-- reads them, and a string made in Lua costs as much as a command's reply.
local site_names, site_names_n = {}, 0
local function names_of(site)
  local f = site_names[site]
  if f then return f end
  -- Bounded: site names come from callers.
  if site_names_n >= 10000 then site_names, site_names_n = {}, 0 end
  -- [6]: the outcome count fields, by class. ([3], [4]: free since layout 8, [1] since layout
  -- 9, so that the others keep their places.)
  f = {
    false, 'd|' .. site, false, false, 'cool|' .. site, {}, 'sid|' .. site,
    'av|' .. site, 'pb|' .. site, 'avr|' .. site,
  }
  site_names[site], site_names_n = f, site_names_n + 1
  return f
end

-- The configuration comes as one argument in the encoding of `store/redis/encoding.rs`:
-- 'config=<version>', then 'name=<type><value>' per field (type 'i' whole number, 'f'
-- number, 'l' comma-separated numbers, 'w' comma-separated whole numbers, 'g' such lists
-- separated by ';', each led by a number that may be negative). It is parsed once per
-- distinct text; an encoding of another version, an unknown or missing field, or a value of
-- the wrong type is refused (the client checks at connect, see `config`), never misread.
local CONFIG_VERSION = '1'
local CONFIG_FIELDS = {
  recent = 'i', recent_failures = 'i', qcap = 'f', min_in_service = 'i', base = 'i', max = 'i',
  dead_after = 'i', rise = 'i', dwell = 'i', window = 'i', max_age = 'i', min_success = 'f',
  min_samples = 'i', max_captcha = 'f', degraded_weight = 'f', probing_weight = 'f',
  ramp_ms = 'i', reset_ms = 'i', site_window = 'i', site_recent = 'i', site_min_samples = 'i',
  site_min_addresses = 'i', site_spread = 'f', latency_factor = 'f', steps = 'l',
}
-- The weight arithmetic is Rust's alone (`health::tables`): the tables of its results come in
-- the same encoding, 'tables=<version>', kept by the pool (meta field `tables`, see `config`)
-- and loaded once per configuration text and server.
local TABLES_VERSION = '1'
local TABLES_FIELDS = {levels = 'i', healthy = 'w', degraded = 'w', probing = 'w', rates = 'g', ramp = 'w'}
local parsed_health = {}

-- Offered for selection (P3); the others are not in `pass` or the ring walk.
local OFFERED = {healthy = true, degraded = true, probing = true}

local function refuse_config(why)
  error({err = 'ERR proxypool config: ' .. why})
end

local function whole(name, v)
  local x = tonumber(v)
  if not x or x < 0 or x ~= math.floor(x) then refuse_config(name .. ' holds ' .. v .. ', not a whole number') end
  return x
end

local function typed(name, kind, v)
  if kind == 'l' or kind == 'w' then
    local list = {}
    for x in string.gmatch(v, '[^,]+') do
      list[#list + 1] = kind == 'w' and whole(name, x) or tonumber(x) or refuse_config(name .. ' holds ' .. x .. ', not a number')
    end
    return list
  elseif kind == 'g' then
    local groups = {}
    for g in string.gmatch(v, '[^;]+') do
      local first, rest = string.match(g, '^(%-?%d+)(.*)$')
      if not first then refuse_config(name .. ' holds ' .. g) end
      local group = typed(name, 'w', rest)
      table.insert(group, 1, tonumber(first))
      groups[#groups + 1] = group
    end
    return groups
  end
  local x = tonumber(v)
  if not x or (kind == 'i' and (x < 0 or x ~= math.floor(x))) then
    refuse_config(name .. ' = ' .. v .. ' is not ' .. (kind == 'i' and 'a whole number' or 'a number'))
  end
  return x
end

-- The fields of `text`, an encoding '<tag>=<version> …' with the fields `fields`.
local function decode(text, tag, version, fields)
  local H = {}
  for token in string.gmatch(text, '%S+') do
    local name, kind, v = string.match(token, '^([%w_]+)=(%a)(.*)$')
    if token == tag .. '=' .. version then
      H.version = version
    elseif not name or fields[name] ~= kind then
      refuse_config(string.match(token, '^' .. tag .. '=') and ('encoding ' .. token .. ', this library reads ' .. version)
        or ('unknown field or type ' .. token))
    elseif H[name] ~= nil then
      refuse_config(name .. ' given twice')
    else
      H[name] = typed(name, kind, v)
    end
  end
  if not H.version then refuse_config('no ' .. tag .. '=' .. version .. ' encoding given') end
  for name in pairs(fields) do
    if H[name] == nil then refuse_config('missing field ' .. name) end
  end
  return H
end

-- Puts the tables `text` into the configuration `H`: per state, stage (0 full weight) and
-- quality level the step as text (`step_text`), per window length the rate's levels
-- (`rate_level`), the ramp's stage ends (`ramp_stage`); refused unless they fit `H`.
local function load_tables(H, text)
  local T = decode(text, 'tables', TABLES_VERSION, TABLES_FIELDS)
  local per_stage, stages = 2 * T.levels + 1, #H.steps
  if #T.ramp ~= stages - 1 or #T.rates ~= H.window then refuse_config('tables of another configuration') end
  H.text, H.levels, H.rates, H.ramp = {}, T.levels, T.rates, T.ramp
  for s in pairs(OFFERED) do
    local list = T[s]
    if #list ~= per_stage * stages then refuse_config('tables of another configuration') end
    local by_stage = {}
    for k = 0, stages - 1 do
      local by_level = {}
      for level = -T.levels, T.levels do by_level[level] = digits(list[k * per_stage + level + T.levels + 1]) end
      by_stage[k] = by_level
    end
    H.text[s] = by_stage
  end
end

-- The configuration `text` with the tables of pool `K`, parsed once per text and server.
-- Without them, or with those of another configuration (Redis lost the pool's keys, another
-- process recorded its own since), the call is refused; the client checks its configuration
-- again, which puts them back or refuses it.
local function health(text, K)
  local H = parsed_health[text]
  if H then return H end
  H = decode(text, 'config', CONFIG_VERSION, CONFIG_FIELDS)
  local recorded = call('HMGET', K.meta, 'config', 'tables')
  if recorded[1] ~= text or not recorded[2] then
    error({err = 'ERR proxypool tables missing: ' .. K.prefix .. 'meta has none for this configuration'})
  end
  load_tables(H, recorded[2])
  parsed_health[text] = H
  return H
end

-- Keyless selection is stride scheduling (smooth weighted): the member of `pass` with the
-- lowest pass wins and its pass grows by its step, the inverse of its weight — state × ramp
-- share (stage `k`, 0 at full weight) × quality level: `health::weight::{scaled, step}`,
-- looked up, so that both stores take the same whole-number steps. The step is in the
-- member's name so that picking needs no second read.
local function step_text(H, s, k, level)
  return H.text[s][k][level]
end

-- Outcome windows (P4, P9) as the memory store keeps them: an address's ('w:ID') and one per
-- address × named site pair ('w:ID:SID'), each a string of one WENTRY per outcome, oldest
-- first: the class letter ('s', 'f', 'c'; upper case once excused, P9), the site's number in
-- 6 digits ('000000': no site), a success's latency in ms in 5 ('00000' for other outcomes:
-- every process's latencies, so the judge reads the address's whole tail, P4) and the time in
-- ms in 13. A push is one APPEND; a key holding twice the window is cut back to the window.
-- The judge (`judging.rs`) and the weights read the last `window` entries younger than the
-- maximum age, so entries age one by one.
local WENTRY = 25
local NO_SID = '000000'
local NO_LATENCY = '00000'
local EXCUSED = {s = 'S', f = 'F', c = 'C'}

local function pad13(at)
  local t = digits(at)
  return string.rep('0', 13 - #t) .. t
end

local function window_key(K, id, sid)
  local w = K.w[id]
  if not w then
    remember(K, id)
    w = K.w[id]
  end
  if sid then return w .. ':' .. sid end
  return w
end

-- Appends `text` to the window at `key`, which is cut back to its last `keep` bytes once it
-- holds twice that: one APPEND per push, the window read only at a cut.
local function append_cut(key, text, keep)
  local len = call('APPEND', key, text)
  if len > 2 * keep then call('SET', key, call('GETRANGE', key, -keep, -1)) end
end

local function push_entry(key, entry, H) append_cut(key, entry, H.window * WENTRY) end

-- The key of a site's window ('sw:SITE', see `end_sites`), made once per site (and server).
local function site_window_key(K, site)
  local key = K.sw[site]
  if key then return key end
  -- Bounded: site names come from callers.
  if K.sw_n >= 10000 then K.sw, K.sw_n = {}, 0 end
  key = K.prefix .. 'sw:' .. site
  K.sw[site], K.sw_n = key, K.sw_n + 1
  return key
end

local function entry_time(win, i)
  return tonumber(string.sub(win, i * WENTRY + 13, i * WENTRY + WENTRY))
end

-- The entries of window `win` that count at `now`: the last `window`, younger than the
-- maximum age (the first young one by bisection: entries are in time order).
local function young(win, now, H)
  if not win or win == '' then return '' end
  local n = math.min(#win / WENTRY, H.window)
  local tail = string.sub(win, -n * WENTRY)
  local horizon = now - H.max_age
  if entry_time(tail, 0) > horizon then return tail end
  local lo, hi = 0, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if entry_time(tail, mid) > horizon then hi = mid else lo = mid + 1 end
  end
  return string.sub(tail, lo * WENTRY + 1)
end

-- Quality (P1) is success rate ÷ normalised latency, as `health::weight::quality`, in
-- half-octave levels (-13 … 13; a level moves the step only when quality changes by a fifth
-- or more): the latency's level as the releasing processes report it (`qlat`, see `ops`),
-- plus the success rate's over every entry of the young window `win` (excused ones too, as
-- memory's weights), in `ql`: `health::weight::level`. The rate's level is looked up: for
-- the window's length, the level with no successes and the counts where it rises by one.
local function rate_level(H, win)
  local _, successes = string.gsub(win, '[sS]', '')
  local rises = H.rates[#win / WENTRY]
  local level = rises[1]
  for i = 2, #rises do
    if successes < rises[i] then break end
    level = level + 1
  end
  return level
end

-- A `pass` member is 'RANK:step': the address's tie-break rank among equal passes as 8 hex
-- digits, so that the sorted set orders equal passes as `smooth_weighted::tie` does (id ×
-- 0x9E3779B1 mod 2^32, an invertible scramble: the id comes back from it), then its step.
-- Products are taken in 16-bit halves so that they stay exact in doubles.
local function mul32(x, hi, lo)
  return (x * lo + ((x * hi) % 65536) * 65536) % 4294967296
end
local ranks, ranks_n = {}, 0
local function member(id, step)
  local r = ranks[id]
  if not r then
    if ranks_n >= 100000 then ranks, ranks_n = {}, 0 end
    r = string.format('%08x', mul32(tonumber(id), 40503, 31153))
    ranks[id], ranks_n = r, ranks_n + 1
  end
  return r .. ':' .. step
end

-- A `pass` member's address id, step and rank (numbers), made once per member (and server): a
-- keyless batch reads a few dozen of them. The inverse of 0x9E3779B1 is 0x0E8B2F51. The rank
-- orders equal passes as the sorted set does (8 hex digits: as their text), without comparing
-- strings (Lua's `<` on strings is `strcoll`).
local members, members_n = {}, 0
local function split_member(m)
  local parts = members[m]
  if parts then return parts end
  if members_n >= 100000 then members, members_n = {}, 0 end
  local rank, step = string.match(m, '^(%x+):(.+)$')
  local r = tonumber(rank, 16)
  parts = {digits(mul32(r, 3723, 12113)), tonumber(step), r}
  members[m], members_n = parts, members_n + 1
  return parts
end

-- One decision in the shared log (newest first, the last 1 000), numbered (`meta` field
-- `decided`) so that the prober's process can pass new ones to its logs. `subject` is an
-- address's name, or '@site NAME' or '@pool'.
local function decide(K, now, subject, from, to, reason)
  local n = call('HINCRBY', K.meta, 'decided', '1')
  call('LPUSH', K.log, table.concat({n, now, subject, from, to, reason}, '\t'))
  call('LTRIM', K.log, 0, 999)
end

-- Quarantined and probing count against the quarantine cap (the episode is still open).
local function counted(s) return s == 'quarantined' or s == 'probing' end

-- Every `pass` holds this member, last (score +inf): longer than `zset-max-listpack-value`
-- (64 bytes by default), it keeps the set a skiplist, where a batch's pass updates are a
-- lookup each. In the listpack Redis keeps a small sorted set in (up to 128 members), each
-- update scans and parses every score: a batch's ZADD took 12 % of a keyless pair's server
-- instructions at 50 addresses. Readers skip it.
local PASS_END = 'end of pass: this member keeps the sorted set a skiplist, see library.lua'

-- Joining afresh: at the current lowest pass, so no catch-up burst.
local function join_pass(pass, m)
  local head = call('ZRANGE', pass, 0, 0, 'WITHSCORES')
  call('ZADD', pass, head[1] ~= PASS_END and head[2] or 0, m)
end

-- Joins (back below the cap) the `pass` of every pool of the address.
local function join_passes(K, sp, m)
  for _, P in ipairs(pools_in(K, sp)) do join_pass(P.pass, m) end
end

-- The ramp stage (1 …) of an address ramping since `rs` (P10) and when the next one begins;
-- nil once the ramp is over: looked up in the stages' ends (`health::ramp::stage_ends`).
local function ramp_stage(H, rs, now)
  local ends = H.ramp
  if not rs or #ends < 1 then return nil end
  local start = tonumber(rs)
  -- Another process's clock may run a little behind this one's.
  local elapsed = math.max(now - start, 0)
  if elapsed >= ends[#ends] then return nil end
  local k = 1
  while ends[k] <= elapsed do k = k + 1 end
  return k, start + ends[k]
end

-- Moves `id`'s `pass` members (one per pool, `sp` its sub-pools) to step `to`, keeping
-- their passes; not where it is out (at the cap).
local function restep_member(K, id, sp, from, to)
  if from == to then return end
  for _, P in ipairs(pools_in(K, sp)) do
    local score = call('ZSCORE', P.pass, member(id, from))
    if score then
      call('ZREM', P.pass, member(id, from))
      call('ZADD', P.pass, score, member(id, to))
    end
  end
end

local function set_state(K, id, to, reason, now, cap, H)
  local a = addr(K, id)
  local f = call('HMGET', a, 's', 'n', 'p', 'rs', 'sp', 'ql')
  local from, n, rs = f[1] or 'absent', num(f[2]), f[4]
  local in_pools = pools_in(K, f[5])
  -- `sl`: degraded for its latency (see `outcome`).
  local set, del = {'s', to, 't', now, 'st', '0'}, {'su'}
  -- P10: entering service from outside it, or from probing, starts the ramp (a new address's
  -- slow start too); leaving service ends it.
  if to == 'healthy' and (not OFFERED[from] or from == 'probing') then
    rs = now
    set[#set + 1], set[#set + 2] = 'rs', now
  elseif not OFFERED[to] then
    rs = nil
    del[#del + 1] = 'rs'
    call('ZREM', K.due, 'r' .. id)
  end
  -- P6: the backoff level resets after a stable stretch, counted from entering healthy.
  if to == 'healthy' then
    set[#set + 1], set[#set + 2] = 'ss', now
  elseif to ~= 'probing' then
    del[#del + 1] = 'ss'
  end
  local step = nil
  if OFFERED[to] then
    local k, next_at = ramp_stage(H, rs, now)
    step = step_text(H, to, k or 0, num(f[6]))
    set[#set + 1], set[#set + 2] = 'p', step
    if next_at then call('ZADD', K.due, next_at, 'r' .. id) end
  else
    del[#del + 1] = 'p'
  end
  call('HSET', a, unpack(set))
  call('HDEL', a, unpack(del))
  -- Every transition moves the address's version: a decision taken before it is refused.
  call('HINCRBY', a, 'ver', '1')
  call('HSET', K.state, id, to)
  if counted(to) and not counted(from) then
    local q = call('HINCRBY', K.meta, 'q', '1')
    if q > num(call('HGET', K.meta, 'q_peak')) then call('HSET', K.meta, 'q_peak', q) end
  elseif counted(from) and not counted(to) then
    call('HINCRBY', K.meta, 'q', '-1')
  end
  if to == 'quarantined' then
    call('HINCRBY', K.meta, 'q_entries', '1')
    call('HINCRBY', a, 'qe', '1')
  end
  -- Per pool: the offered count, and membership of `pass` (offered and below the cap). A
  -- change of step keeps the pass.
  for _, P in ipairs(in_pools) do
    if OFFERED[to] and not OFFERED[from] then
      call('HINCRBY', K.meta, P.offered, '1')
    elseif OFFERED[from] and not OFFERED[to] then
      call('HINCRBY', K.meta, P.offered, '-1')
    end
    local score = nil
    if OFFERED[from] then
      local old = member(id, f[3] or step_text(H, from, 0, num(f[6])))
      score = call('ZSCORE', P.pass, old)
      call('ZREM', P.pass, old)
    end
    if OFFERED[to] and n < cap then
      if score then call('ZADD', P.pass, score, member(id, step)) else join_pass(P.pass, member(id, step)) end
    end
  end
  decide(K, now, call('HGET', K.name, id) or id, from, to, reason)
end

-- The next ramp stage of `id` is due: its step moves on, or the ramp is over — and with it
-- the quarantine cycle before it, which succeeded (P11).
local function ramp_on(K, id, now, H)
  local a = addr(K, id)
  local f = call('HMGET', a, 's', 'p', 'rs', 'sp', 'ql')
  local s = f[1]
  if not OFFERED[s] or not f[3] then return end
  local k, next_at = ramp_stage(H, f[3], now)
  if next_at then
    call('ZADD', K.due, next_at, 'r' .. id)
  else
    call('HDEL', a, 'rs')
    call('HSET', a, 'cy', '0')
  end
  local step = step_text(H, s, k or 0, num(f[5]))
  if step ~= f[2] then
    restep_member(K, id, f[4], f[2] or step, step)
    call('HSET', a, 'p', step)
  end
end

-- The quality level of `id` moved to `level` (its latency's to `latency`): its step follows
-- if it is offered.
local function requalify(K, id, level, latency, now, H)
  local a = addr(K, id)
  local f = call('HMGET', a, 's', 'p', 'rs', 'sp')
  local s = f[1]
  if not OFFERED[s] then
    call('HSET', a, 'ql', level, 'qlat', latency)
    return
  end
  local step = step_text(H, s, ramp_stage(H, f[3], now) or 0, level)
  call('HSET', a, 'ql', level, 'qlat', latency, 'p', step)
  restep_member(K, id, f[4], f[2] or step, step)
end

-- A binding's value: the address id, then the sub-pool it was bound through, if any.
local function binding(v)
  if not v or not string.find(v, ' ', 1, true) then return v, '' end
  return string.match(v, '^(%d+) (.*)$')
end

local function unbind(K, key)
  local id, via = binding(call('HGET', K.bind, key))
  call('ZREM', K.due, 'b' .. key)
  if not id then return false end
  call('HDEL', K.bind, key)
  -- A removed address took its keys out of its pools' counts already (see `remove`).
  if call('HEXISTS', K.state, id) == 1 then
    local bound = pool_of(K, via).bound
    call('HINCRBY', K.meta, bound, '-1')
    call('HINCRBY', addr(K, id), 'k', '-1')
    call('HINCRBY', addr(K, id), bound, '-1')
  end
  return true
end

-- An open lease of `id` (state `s`; nil if removed: one orphan fewer, see `remove`) has
-- ended. Its step and sub-pools are read only when it comes back below the cap (rarely: a
-- field a hash lacks costs a scan of all of it).
local function freed(K, id, s, cap, H)
  if not s then
    call('HINCRBY', K.meta, 'orphans', '-1')
    return
  end
  local a = addr(K, id)
  local n = call('HINCRBY', a, 'n', '-1')
  -- Back below the cap: offered for keyless work again.
  if n == cap - 1 and OFFERED[s] then
    local f = call('HMGET', a, 'p', 'sp')
    join_passes(K, f[2], member(id, f[1] or step_text(H, s, 0, 0)))
  end
end

-- Frees the slot of an open lease; false if it was closed or expired already.
local function close_lease(K, lid, id, cap, H)
  if call('ZREM', K.due, 'l' .. lid .. ':' .. id) == 0 then return false end
  freed(K, id, call('HGET', addr(K, id), 's'), cap, H)
  return true
end

-- A batch of acquires shares what does not depend on one acquire: one reservation of lease
-- ids, one ZADD of the deadlines, one read of the keyless candidates (the lowest passes) and
-- one write of their new passes. (Arguments to redis.call are strings where possible: Lua 5.1
-- turns each number into one with sprintf.) `first`: the caller's own ids (see `reserve`),
-- acquire k of the batch taking `first + k` whether granted or not; without them the batch
-- reserves ids here and gives back those it did not grant.
local function new_batch(K, cap, size, H, first)
  local own = first ~= nil
  if not own then first = call('HINCRBY', K.meta, 'seq', digits(size)) - size + 1 end
  return {
    K = K, cap = cap, H = H, own = own, first = first, next_lid = first, granted = 0,
    last_lid = first + size - 1, due = {}, ndue = 0, full = {}, cool_memo = {}, sel = {},
  }
end

-- Takes one more lease on `id` (`m` its `pass` member, false: read when needed, at the cap)
-- if the cap allows; its deadline (and the binding's, for a key) is set when the batch ends.
-- Returns the lease id, or nil at the cap.
local function take(B, id, m, lease_deadline, session_deadline, key)
  local a = addr(B.K, id)
  local n = call('HINCRBY', a, 'n', '1')
  if n > B.cap then
    call('HINCRBY', a, 'n', '-1')
    B.full[id] = true
    return nil
  end
  if n == B.cap then
    B.full[id] = true
    local f = call('HMGET', a, 'sp', 's', 'p')
    m = m or member(id, f[3] or step_text(B.H, f[2], 0, 0))
    for _, P in ipairs(pools_in(B.K, f[1])) do call('ZREM', P.pass, m) end
  end
  local lid = B.next_lid
  B.next_lid = lid + 1
  B.granted = B.granted + 1
  local due, k = B.due, B.ndue
  due[k + 1] = lease_deadline
  due[k + 2] = 'l' .. digits(lid) .. ':' .. id
  if key then
    due[k + 3] = session_deadline
    due[k + 4] = 'b' .. key
    k = k + 2
  end
  B.ndue = k + 2
  return lid
end

-- Writes the passes the batch advanced in pool `P`'s `pass` (XX: not for those that left
-- it meanwhile).
local function flush_pool(B, P, C)
  local c = C.cand
  if not c then return end
  local updates, u = {}, 0
  for i = 1, #c, 6 do
    if c[i + 3] and not B.full[c[i]] then
      updates[u + 1], updates[u + 2] = digits(c[i + 2]), c[i + 1]
      u = u + 2
      c[i + 3] = false
    end
  end
  if u > 0 then call('ZADD', P.pass, 'XX', unpack(updates, 1, u)) end
end

-- The same for every pool the batch picked from; their candidates are read again after.
local function flush_passes(B)
  for P, C in pairs(B.sel) do
    flush_pool(B, P, C)
    C.cand = nil
  end
end

local function end_batch(B)
  flush_passes(B)
  if B.ndue > 0 then call('ZADD', B.K.due, unpack(B.due, 1, B.ndue)) end
  -- Grants count as `seq` - `seq0` - `reserved` + `granted` (see `reserve`).
  if B.own then
    if B.granted > 0 then call('HINCRBY', B.K.meta, 'granted', digits(B.granted)) end
  else
    local unused = B.last_lid - B.next_lid + 1
    if unused > 0 then call('HINCRBY', B.K.meta, 'seq', tostring(-unused)) end
  end
end

-- Whether `id` cools for the current acquire's site, or is avoided there (P9: keyless work
-- passes it over; bound and new sessions do not, as in memory, where it only weighs least
-- there). Read once per batch and site.
local function cools(B, id)
  if not B.site_cools then return false end
  local memo = B.cool_memo[B.site]
  if not memo then
    memo = {}
    B.cool_memo[B.site] = memo
  end
  local c = memo[id]
  if c == nil then
    local names = names_of(B.site)
    local f = call('HMGET', addr(B.K, id), names[5], names[8])
    c = num(f[1]) > B.now or num(f[2]) > B.now
    memo[id] = c
  end
  return c
end

-- Whether candidate `i` (see `keyless`) comes before `pass` and `rank`: equal passes in rank
-- order.
local function before(c, i, pass, rank)
  local p = c[i + 2]
  return p < pass or (p == pass and c[i + 5] < rank)
end

-- Keyless, stride scheduling, as `strategy::smooth_weighted`: a batch reads the lowest
-- passes once (`wanted` of them, plus the next one as a bound) and then picks, each time, the
-- candidate whose pass plus its steps taken in this batch is lowest (equal passes in member
-- order, as the sorted set orders them); the passes are written back when the batch ends.
-- Read again (after writing back) when every candidate is full or the lowest would come after
-- the bound, where an address not read would be next; candidates cooling for the acquire's
-- site are passed over. Candidates are flat: id, member, pass (with this batch's picks),
-- changed, step, rank; `order` holds their indices by pass and rank from `C.head` to `C.tail`
-- (a pick moves one back), so that a pick takes the first eligible one rather than looking at
-- every candidate, and leaves the front without moving the others (table.remove did: 3 % of
-- a keyless pair's server instructions).
-- Per pool `P` (its state in the batch: `C`).
local function keyless(B, P, lease_deadline, wanted)
  local C = B.sel[P]
  if not C then
    C = {}
    B.sel[P] = C
  end
  for attempt = 1, 3 do
    if not C.cand then
      -- Wider when the first read held only full or cooling candidates; the third reads all.
      local n = attempt == 1 and wanted or attempt == 2 and wanted + 32 or -1
      local c = {}
      local r = call('ZRANGE', P.pass, '0', digits(n), 'WITHSCORES')
      if r[#r - 1] == PASS_END then r[#r], r[#r - 1] = nil, nil end
      C.bound, C.bound_rank = nil, nil
      if n >= 0 and #r > 2 * n then
        C.bound, C.bound_rank = tonumber(r[#r]), split_member(r[#r - 1])[3]
        r[#r], r[#r - 1] = nil, nil
      end
      local k, order = 0, {}
      for i = 1, #r, 2 do
        local parts = split_member(r[i])
        c[k + 1], c[k + 2], c[k + 3], c[k + 4] = parts[1], r[i], tonumber(r[i + 1]), false
        c[k + 5], c[k + 6] = parts[2], parts[3]
        order[k / 6 + 1] = k + 1
        k = k + 6
      end
      C.cand, C.order, C.head, C.tail = c, order, 1, k / 6
    end
    local c, order = C.cand, C.order
    -- Candidates passed over for this acquire (made on first need: most acquire none).
    local cooling = nil
    while true do
      -- The first in order that is neither full nor passed over.
      local best, at, full = nil, nil, B.full
      for k = C.head, C.tail do
        local i = order[k]
        if not full[c[i]] and not (cooling and cooling[i]) then
          best, at = i, k
          break
        end
      end
      local best_pass, best_rank = best and c[best + 2], best and c[best + 5]
      -- After the bound an address not read would be next.
      if not best or (C.bound and (best_pass > C.bound or (best_pass == C.bound and best_rank > C.bound_rank))) then
        break
      end
      local id = c[best]
      if cools(B, id) then
        -- Rate limited for this acquire's site: the next best, for this acquire only.
        cooling = cooling or {}
        cooling[best] = true
      else
        local lid = take(B, id, c[best + 1], lease_deadline)
        if lid then
          local p = best_pass + c[best + 4]
          c[best + 2] = p
          c[best + 3] = true
          -- Out of its place (those before it, passed over, move up one), then back in order
          -- from the end, where a pass that grew by a whole step usually goes.
          local head, k = C.head, C.tail
          for m = at, head + 1, -1 do order[m] = order[m - 1] end
          head = head + 1
          while k >= head and not before(c, order[k], p, best_rank) do
            order[k + 1] = order[k]
            k = k - 1
          end
          order[k + 1] = best
          C.head, C.tail = head, C.tail + 1
          -- Those passed over for cooling do not bank the turns they missed: no burst at
          -- the site when their cooling ends.
          if cooling then
            for i in pairs(cooling) do
              if c[i + 2] < best_pass then
                c[i + 2] = best_pass
                c[i + 3] = true
              end
            end
            local list = {}
            for m = C.head, C.tail do list[m - C.head + 1] = order[m] end
            table.sort(list, function(x, y) return before(c, x, c[y + 2], c[y + 5]) end)
            C.order, C.head, C.tail = list, 1, #list
          end
          return lid, id, 'weighted'
        end
        -- At the cap yet in `pass`: only if processes disagree on the cap. Out until a release.
        call('ZREM', P.pass, c[best + 1])
      end
    end
    flush_pool(B, P, C)
    C.cand = nil
  end
  return 0, 0, 'none'
end

-- How unwell an offered address is, for least connections' ties (lower is better).
local UNWELL = {healthy = 0, degraded = 1, probing = 2}

-- Whether `id` may be picked for keyless work (offered, below the cap, not cooling for the
-- acquire's site, as `Candidates::eligible`): its open leases, state and `pass` member if so.
local function eligible(B, id)
  if B.full[id] then return nil end
  local f = call('HMGET', addr(B.K, id), 'n', 's', 'p')
  local n, s = num(f[1]), f[2]
  if not OFFERED[s] or n >= B.cap or cools(B, id) then return nil end
  return n, s, member(id, f[3] or step_text(B.H, s, 0, 0))
end

-- Round-robin, as `strategy::round_robin`: a cursor (per pool, in `meta`) over the members by
-- id (`ids`, ordered as memory orders its slots), from which the first eligible one is taken;
-- the cursor moves past it. (Like memory's, it is an index: a removal shifts those after it.)
local function round_robin(B, P, lease_deadline)
  local n = call('ZCARD', P.ids)
  local cursor = num(call('HGET', B.K.meta, P.cursor))
  for step = 0, n - 1 do
    local i = (cursor + step) % n
    local id = call('ZRANGE', P.ids, digits(i), digits(i))[1]
    local _, _, m = eligible(B, id)
    if m then
      call('HSET', B.K.meta, P.cursor, digits((i + 1) % n))
      local lid = take(B, id, m, lease_deadline)
      if lid then return lid, id, 'round_robin' end
      return 0, 0, 'none'
    end
  end
  return 0, 0, 'none'
end

-- The draws of least connections from a seed, as `strategy::least_connections::Draws`: a
-- 32-bit LCG (its products stay below 2^53: exact in doubles), each state scaled to 0..len-1
-- by its high bits, the product taken in two halves so that it stays exact for any pool size.
local TWO32, TWO16 = 4294967296, 65536
local function draw_index(state, len)
  local hi = math.floor(state / TWO16)
  return math.floor((hi * len + math.floor((state - hi * TWO16) * len / TWO16)) / TWO16)
end
local function next_draw(state) return (state * 1664525 + 1013904223) % TWO32 end
local TRIES = 16

-- Least connections by the power of two choices, as `strategy::least_connections`: up to
-- TRIES members of pool `P` drawn by rank in `ids` (its members by id, as memory orders its
-- slots) from the caller's `seed`, the first two eligible (offered, below the cap, not cooling
-- for the acquire's site) weighed: the one with fewer open leases wins, then the one in the
-- better state, then the first drawn. Without two eligible draws, the lightest of all eligible
-- ones (the first by id among equals).
local function least(B, P, lease_deadline, seed)
  local len = call('ZCARD', P.ids)
  if len == 0 then return 0, 0, 'none' end
  local best, best_load, best_m
  -- Whether `id` is eligible; if so it is weighed against the best so far.
  local function weigh(id)
    local n, s, m = eligible(B, id)
    if not n then return false end
    local load = n * 4 + (UNWELL[s] or 3)
    if not best_load or load < best_load then best, best_load, best_m = id, load, m end
    return true
  end
  local state, first, pair = tonumber(seed) or 0, nil, false
  for _ = 1, TRIES do
    local i = draw_index(state, len)
    state = next_draw(state)
    local id = call('ZRANGE', P.ids, digits(i), digits(i))[1]
    if id and id ~= first and weigh(id) then
      if first then
        pair = true
        break
      end
      first = id
    end
  end
  if not pair then
    best, best_load, best_m = nil, nil, nil
    -- Every eligible one is in `pass` (cooling aside): weighed in id order.
    local ids = {}
    for k, m in ipairs(call('ZRANGE', P.pass, '0', '-2')) do ids[k] = tonumber(split_member(m)[1]) end
    table.sort(ids)
    for _, id in ipairs(ids) do weigh(tostring(id)) end
  end
  if not best then return 0, 0, 'none' end
  local lid = take(B, best, best_m, lease_deadline)
  if lid then return lid, best, 'least' end
  return 0, 0, 'none'
end

-- What the quarantine gate (P7, P8, P9) reads for address `id` (sub-pools `sp`), as one text:
-- frozen, addresses, counted against the cap, then offered and members of its pool with the
-- fewest to spare (P8 in each pool of the address). The judge decides with it (`judge::fall`
-- via `Gate`); `apply` refuses a transition decided on a text that no longer holds.
local function gate_facts(K, sp, H)
  local total = call('HLEN', K.state)
  local m = call('HMGET', K.meta, 'q', 'offered', 'frozen')
  local tightest, offered, members = nil, 0, 0
  for i, P in ipairs(pools_in(K, sp)) do
    local o = i == 1 and num(m[2]) or num(call('HGET', K.meta, P.offered))
    local n = i == 1 and total or members_of(K, P)
    local spare = o - math.min(H.min_in_service, n)
    if not tightest or spare < tightest then tightest, offered, members = spare, o, n end
  end
  return (m[3] == '1' and '1' or '0') .. ' ' .. total .. ' ' .. num(m[1]) .. ' ' .. offered .. ' ' .. members
end

-- What the judge (`judge.rs`, through `store/redis/judging.rs`) needs of address `id` after an
-- outcome: its version and standing, its young window, for a bad outcome the gate's facts,
-- and the young windows of its pairs — the outcome's (`sid`), and when the address's fall is
-- judged (`all_pairs`) those of every named site counted in its window (P9: a pair that
-- alone looks bad is left out). Appended to `out` after `head` (who asks, the outcome);
-- nothing if it is gone.
local FACT_FIELDS = {'s', 'ver', 'su', 't', 'rs', 'qe', 'lv', 'cy', 'ss', 'st', 'sp'}
local function facts(K, id, gate, H, head, now, sid, all_pairs)
  local f = call('HMGET', addr(K, id), unpack(FACT_FIELDS))
  if not f[1] then return nil end
  local out = head
  for k = 1, 10 do out[#out + 1] = f[k] or '' end
  local win = young(call('GET', window_key(K, id)), now, H)
  out[#out + 1] = win
  out[#out + 1] = gate and gate_facts(K, f[11], H) or ''
  local sids, seen = {}, {[NO_SID] = true}
  if sid and sid ~= NO_SID then sids[1], seen[sid] = sid, true end
  if all_pairs then
    for s in string.gmatch(win, '[sfc](%d%d%d%d%d%d)') do
      if not seen[s] then sids[#sids + 1], seen[s] = s, true end
    end
  end
  local pairs_out = {}
  if #sids > 0 then
    local keys = {}
    for i, s in ipairs(sids) do keys[i] = window_key(K, id, s) end
    local wins = call('MGET', unpack(keys))
    for i, s in ipairs(sids) do
      pairs_out[#pairs_out + 1] = s
      pairs_out[#pairs_out + 1] = young(wins[i] or '', now, H)
    end
  end
  out[#out + 1] = pairs_out
  return out
end

-- P9: the outcomes of site number `sid` at or after `from` in window `key` (all of them for
-- a pair's window, `sid` nil) say nothing about the address: excused (upper case).
local function excuse_window(key, sid, from)
  local w = call('GET', key)
  if not w then return end
  local n, parts, changed = #w / WENTRY, {}, false
  for i = 0, n - 1 do
    local e = string.sub(w, i * WENTRY + 1, i * WENTRY + WENTRY)
    local up = EXCUSED[string.sub(e, 1, 1)]
    if up and entry_time(w, i) >= from and (not sid or string.sub(e, 2, 7) == sid) then
      e, changed = up .. string.sub(e, 2), true
    end
    parts[i + 1] = e
  end
  if changed then call('SET', key, table.concat(parts)) end
end

-- A pair in the decision log: '@pair ADDRESS SITE'.
local function pair_subject(K, id, site)
  return '@pair ' .. (call('HGET', K.name, id) or id) .. ' ' .. site
end

-- The avoidance of pair `rest` ('ID|SITE') is over by time alone, as judged when it began
-- (`judge::pair_cleared_at`): forgiven at `at`, with the reason judged then.
local function pair_aged(K, rest, at)
  local id, site = string.match(rest, '^(%d+)|(.*)$')
  if not id then return end
  local names, a = names_of(site), addr(K, id)
  local f = call('HMGET', a, names[8], names[10])
  if f[1] and tonumber(f[1]) <= at then
    call('HDEL', a, names[8], names[10])
    decide(K, at, pair_subject(K, id, site), 'avoided', 'ok', f[2] or '')
  end
end

local function sweep(K, now, now_text, cap, H)
  local due = call('ZRANGE', K.due, '-inf', now_text, 'BYSCORE', 'LIMIT', '0', '64', 'WITHSCORES')
  for i = 1, #due, 2 do
    local m, at = due[i], tonumber(due[i + 1])
    local kind, rest = string.sub(m, 1, 1), string.sub(m, 2)
    if kind == 'l' then
      local lid, id = string.match(rest, '^(%d+):(%d+)$')
      if close_lease(K, lid, id, cap, H) then
        call('HINCRBY', K.meta, 'expired', '1')
      end
    elseif kind == 'b' then
      unbind(K, rest)
    elseif kind == 'r' then
      call('ZREM', K.due, m)
      ramp_on(K, rest, now, H)
    elseif kind == 'v' then
      call('ZREM', K.due, m)
      pair_aged(K, rest, at)
    else
      call('ZREM', K.due, m)
      -- Dated when the wait ended, not when a call noticed: the dwell counts from there.
      if call('HGET', addr(K, rest), 's') == 'quarantined' then
        set_state(K, rest, 'probing', 'quarantine wait over; half-open', at, cap, H)
      end
    end
  end
  return #due == 128 and 1 or 0
end

-- The call's context from the common arguments; sweeps if asked.
-- The layout of a pool's keys and fields. Processes running library versions with another
-- layout must not share a pool: the older one would write what this one misreads.
local LAYOUT = '11'

-- The call's context from the common arguments, and the values of the `meta` fields
-- `fields` ('layout', 'epoch', then what the caller needs; those two by default), read
-- before anything is written: a pool laid out by another version is refused. Sweeps if
-- asked.
local function open(keys, args, fields)
  local K = keys_of(keys[1])
  local now, cap, H = tonumber(args[1]), tonumber(args[3]), health(args[4], K)
  local got = call('HMGET', K.meta, unpack(fields or {'layout', 'epoch'}))
  if got[2] and got[1] ~= LAYOUT then
    error({err = 'ERR the pool ' .. K.prefix .. '* was laid out by another version of proxypool (layout ' ..
      (got[1] or '1') .. ', this one ' .. LAYOUT .. '): every process of a pool must run one version; ' ..
      'give the new version another pool name'})
  end
  local more = 0
  if args[2] == '1' then more = sweep(K, now, args[1], cap, H) end
  return K, now, cap, more, H, got
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

-- One acquire: `key` ('' = keyless) and its ring `point`, in pool `P` with keyless strategy
-- `strategy` ('w' weighted, 'r' round-robin, 'l' least connections). Returns lease id,
-- address id and the choice, or 0, address id or 0, and 'busy' | 'broken' | 'none'.
local function acquire_one(B, P, strategy, lease_deadline, session_deadline, factor, key, point, keyless_left, seed)
  local K, cap = B.K, B.cap
  if key == '' then
    if strategy == 'l' then return least(B, P, lease_deadline, seed) end
    if strategy == 'r' then return round_robin(B, P, lease_deadline) end
    return keyless(B, P, lease_deadline, keyless_left)
  end
  -- A bound key keeps its address whichever pool the ticket names.
  local id = binding(call('HGET', K.bind, key))
  if id then
    -- The address's cooling end for the site only when the site has one.
    local s, cool_end
    if B.site_cools then
      local f = call('HMGET', addr(K, id), 's', names_of(B.site)[5])
      s, cool_end = f[1], f[2]
    else
      s = call('HGET', addr(K, id), 's')
    end
    if s == 'healthy' or s == 'degraded' then
      -- Rate limited there: the session is kept; the caller learns until when (in the lease
      -- id's place).
      if num(cool_end) > B.now then return tonumber(cool_end), id, 'cooling' end
      local lid = take(B, id, false, lease_deadline, session_deadline, key)
      if not lid then return 0, id, 'busy' end
      return lid, id, 'bound'
    end
    -- Quarantined, probing, dead or removed: never moved silently (P2).
    unbind(K, key)
    return 0, id, 'broken'
  end
  -- A new session: clockwise on the ring from the key's point to the first address in service
  -- (not probing) below the lease cap whose bound keys leave room (bounded loads).
  local m = call('HMGET', K.meta, P.bound, P.offered)
  local floor, threshold = capacity(num(m[1]), num(m[2]), factor)
  local ceiling = floor + (threshold > 0 and 1 or 0)
  local seen, fallback = {}, nil
  local function bind(cid, m)
    local lid = take(B, cid, m, lease_deadline, session_deadline, key)
    call('HSET', K.bind, key, P.name == '' and cid or cid .. ' ' .. P.name)
    call('HINCRBY', addr(K, cid), 'k', '1')
    call('HINCRBY', addr(K, cid), P.bound, '1')
    call('HINCRBY', K.meta, P.bound, '1')
    return lid, cid, 'hashed'
  end
  -- Nothing offered below the cap: no walk (it would visit the whole ring).
  if call('ZCARD', P.pass) <= 1 then return 0, 0, 'none' end
  -- By rank from the key's point, with wrap-around; at most RING_WALK points, and never
  -- past the point where every address has been seen.
  local points, addresses = call('ZCARD', P.ring), members_of(K, P)
  local start, seen_n = call('ZCOUNT', P.ring, '-inf', '(' .. point), 0
  local walked = 0
  while walked < points and walked < RING_WALK and seen_n < addresses do
    local from = (start + walked) % points
    local to = math.min(from + 31, points - 1)
    for _, p in ipairs(call('ZRANGE', P.ring, tostring(from), tostring(to))) do
      local cid = string.match(p, '^(%d+):')
      if not seen[cid] then
        seen[cid] = true
        seen_n = seen_n + 1
        local f = call('HMGET', addr(K, cid), 's', 'n', 'k', 'fp', names_of(B.site)[5], 'p')
        local s = f[1]
        if (s == 'healthy' or s == 'degraded') and num(f[2]) < cap and num(f[5]) <= B.now then
          local k = num(f[3])
          local m = member(cid, f[6] or step_text(B.H, s, 0, 0))
          if k < floor + (num(f[4]) < threshold and 1 or 0) then return bind(cid, m) end
          if not fallback and k < ceiling then fallback = {cid, m} end
        end
      end
    end
    walked = walked + (to - from + 1)
  end
  if fallback then return bind(fallback[1], fallback[2]) end
  return 0, 0, 'none'
end

-- Clocks of the processes of a pool may differ by this much (ms): a cooling's fields are kept
-- until it is over for all of them.
local CLOCK_SLACK = 5000

-- Deletes the cooling fields of a site whose every cooling is over (the addresses cooled
-- there are kept in a set until then), 256 at a time: the site-level end goes last.
local function uncool(K, site)
  local cooled = K.prefix .. 'cooled:' .. site
  local field = names_of(site)[5]
  local ids = call('SPOP', cooled, 256)
  for _, id in ipairs(ids) do call('HDEL', addr(K, id), field) end
  if #ids < 256 then call('HDEL', K.meta, field) end
end

-- Arguments per acquire of an `ops` call.
local ACQUIRE_ARGS = 5

-- Refusals, counted in `meta` by their names.
local REFUSED = {none = true, broken = true, busy = true, cooling = true}

-- The acquires of an `ops` call, in order, from ARGV[from] (see `ops`), after its releases;
-- `cooling` gives the index in `got` of each of their sites' latest cooling end. Returns
-- three reply elements per acquire (see acquire_one), their count, and `more`. An acquire
-- that finds nothing sweeps first if the call did not (expired leases may be what holds the
-- capacity). `first`: the caller's lease ids (see `new_batch`).
local function acquire_part(K, now, cap, H, got, cooling, args, from, more, first)
  local out, n = {}, 0
  if from > #args then return out, n, more end
  local swept = args[2] == '1'
  local lease_deadline, session_deadline, factor = args[5], args[6], tonumber(args[7])
  -- Keyless acquires left in the batch, per pool.
  local size, keyless_left = (#args - from + 1) / ACQUIRE_ARGS, {}
  for i = from, #args, ACQUIRE_ARGS do
    if args[i] == '' then keyless_left[args[i + 3]] = (keyless_left[args[i + 3]] or 0) + 1 end
  end
  -- A site's latest cooling over: every cooling there is, and their fields go.
  for site, at in pairs(cooling) do
    if got[at] and num(got[at]) + CLOCK_SLACK <= now then uncool(K, site) end
  end
  local B = new_batch(K, cap, size, H, first)
  B.now = now
  for i = from, #args, ACQUIRE_ARGS do
    if B.own then B.next_lid = B.first + (i - from) / ACQUIRE_ARGS end
    local key, point, spec, seed = args[i], args[i + 1], args[i + 3], args[i + 4]
    local S = K.specs[spec]
    if not S then
      S = {pool_of(K, string.sub(spec, 2)), string.sub(spec, 1, 1)}
      K.specs[spec] = S
    end
    local P, strategy = S[1], S[2]
    B.site = args[i + 2]
    local cool_end = got[cooling[B.site]]
    B.site_cools = cool_end and num(cool_end) > now
    local left = keyless_left[spec]
    local lid, id, tag = acquire_one(B, P, strategy, lease_deadline, session_deadline, factor, key, point, left, seed)
    if tag == 'none' and not swept then
      -- The batch's pending deadlines first: the sweep must see refreshed bindings as such.
      swept = true
      flush_passes(B)
      if B.ndue > 0 then call('ZADD', K.due, unpack(B.due, 1, B.ndue)) end
      B.due, B.ndue = {}, 0
      if sweep(K, now, args[1], cap, H) == 1 then more = 1 end
      -- Leases the sweep ended may have made room on addresses the batch filled.
      B.full = {}
      lid, id, tag = acquire_one(B, P, strategy, lease_deadline, session_deadline, factor, key, point, left, seed)
    end
    if key == '' then keyless_left[spec] = left - 1 end
    if REFUSED[tag] then call('HINCRBY', K.meta, tag, '1') end
    out[n + 1], out[n + 2], out[n + 3] = lid, id, tag
    n = n + 3
  end
  end_batch(B)
  return out, n, more
end

-- Whether the current call cooled an address (see `ops`: its acquires must see it).
local cooled_in_call = false

-- A rate limit: `id` cools for `site` until `until_ms` (never shortened); the site's latest
-- cooling end rises with it.
local function cool(K, id, site, until_ms)
  cooled_in_call = true
  local field = names_of(site)[5]
  if tonumber(until_ms) > num(call('HGET', addr(K, id), field)) then
    call('HSET', addr(K, id), field, until_ms)
    call('SADD', K.prefix .. 'cooled:' .. site, id)
  end
  if tonumber(until_ms) > num(call('HGET', K.meta, field)) then
    call('HSET', K.meta, field, until_ms)
  end
end

-- P9, the sites' windows (judged by `store/redis/verdicts.rs`). Each site ('-' for tickets
-- without one) keeps a window of its outcomes over all addresses ('sw:SITE': oldest first,
-- one ENTRY per outcome: its class letter, the address id padded to 9 digits and its time in
-- ms padded to 13, so that entries age one by one as in memory), of which the last
-- `site_window` count, and in `meta` the time it was degraded ('d|SITE', absent when it is
-- not). A batch's entries are appended once, at its end, and the window is read only when the
-- judge needs it: aged entries are left for the judge to drop (as memory's window drops them
-- when the next outcome comes) and for the next cut (see `append_cut`). The `meta` fields
-- come with the read of `meta` a release batch makes anyway.
local ENTRY = 23
-- Appends the `meta` fields of the distinct sites among `args[from]`, `args[from + step]`, …
-- (up to `to`) to `fields`; the sites in order.
local function site_fields(args, from, to, step, fields)
  local order, known = {}, {}
  for i = from, to, step do
    local site = args[i]
    if not known[site] then
      known[site] = true
      order[#order + 1] = site
      local f = names_of(site)
      fields[#fields + 1], fields[#fields + 2] = f[2], f[7]
    end
  end
  return order
end

-- The sites' state from the values of their fields in `got`, from index `at`. (An absent
-- field reads as false.) A named site gets its number (`sid`, for the outcome windows) on
-- first sight.
local function sites_from(K, order, got, at)
  local S = {}
  for _, site in ipairs(order) do
    local st = {name = site, deg = got[at] or nil, sid = got[at + 1] or nil}
    at = at + 2
    if site == '-' then
      st.sid = NO_SID
    elseif not st.sid then
      local n = call('HINCRBY', K.meta, 'site_ids', '1')
      if n > 999999 then error({err = 'ERR the pool ' .. K.prefix .. '* has used up its site numbers'}) end
      local t = digits(n)
      st.sid = string.rep('0', 6 - #t) .. t
      call('HSET', K.meta, names_of(site)[7], st.sid)
    end
    S[site] = st
  end
  return S
end

-- An entry's time.
local function entry_at(win, i)
  return tonumber(string.sub(win, i * ENTRY + 11, i * ENTRY + ENTRY))
end

-- An address id padded to 9 digits, made once per id (and server).
local padded_ids, padded_n = {}, 0
local function pad9(id)
  local p = padded_ids[id]
  if p then return p end
  if padded_n >= 100000 then padded_ids, padded_n = {}, 0 end
  p = string.rep('0', 9 - #id) .. id
  padded_ids[id], padded_n = p, padded_n + 1
  return p
end

-- An outcome at site `st` ('s', 'f' or 'c') by address `id`, release `j` of the batch (0: a
-- probe report), at `now13` (the time padded to 13 digits). Returns whether the site is
-- degraded, when the outcome says nothing about the address. The site is to be judged after
-- a bad outcome while ok and after any while degraded (to see it recover).
local function observe(st, j, id, class, now13)
  local pending = st.pending
  if not pending then
    pending = {}
    st.pending, st.releases = pending, {}
  end
  pending[#pending + 1] = class .. pad9(id) .. now13
  st.releases[#st.releases + 1] = j
  if class ~= 's' or st.deg then st.judge = true end
  return st.deg ~= nil
end

-- Adds the batch's entries to its sites' windows. Returns what the judge needs of the sites
-- to judge: name, degraded since, the window before the batch (its last `site_window`
-- entries: aged ones the judge drops, as memory's window does when the next outcome comes),
-- the batch's entries (oldest first) and their releases.
local function end_sites(K, S, H)
  local judge = {}
  local keep = H.site_window * ENTRY
  for _, st in pairs(S) do
    local pending = st.pending
    if pending then
      local key = site_window_key(K, st.name)
      local batch = table.concat(pending)
      if st.judge then
        local old = call('GETRANGE', key, -keep, -1)
        judge[#judge + 1] = {st.name, st.deg or '', old, batch, st.releases}
      end
      append_cut(key, batch, keep)
    end
  end
  return judge
end

-- The weight of address `id` follows its quality (P1): its latency's level and, while its
-- window holds a bad outcome, the success rate's, from the window the outcome left. `q` its
-- 'qlat' and 'ql' fields and `latency` the new latency level, when the caller has read them;
-- `had_bad` if its 'wb' was set (cleared here once the window is clean again).
local function reweigh(K, id, q, latency, now, H, had_bad)
  local a = addr(K, id)
  q = q or call('HMGET', a, 'qlat', 'ql')
  latency = latency or num(q[1])
  local level = latency
  local win = young(call('GET', window_key(K, id)), now, H)
  if win ~= '' then level = level + rate_level(H, win) end
  -- Clean again: back to the common case.
  if had_bad and not string.find(win, '[fc]') then call('HDEL', a, 'wb') end
  level = math.min(math.max(level, -H.levels), H.levels)
  if level ~= num(q[2]) or latency ~= num(q[1]) then requalify(K, id, level, latency, now, H) end
end

-- Arguments per release of an `ops` call.
local RELEASE_ARGS = 6

-- The releases of an `ops` call, ARGV[from..to] (see `ops`): a lease no longer open frees
-- nothing; its outcome is judged if it was granted in this epoch (expired), not if it comes
-- from before Redis lost the pool (its address id may name another address). Releases whose
-- outcome is judged are counted (`released`, one HINCRBY per batch), a late one of an expired
-- lease too, as in memory. `S`, the batch's sites (see `sites_from`).
local function release_part(K, now, cap, H, got, S, args, from, to, judged)
  local now13 = pad13(now)
  local leases, count = {}, 0
  for i = from, to, RELEASE_ARGS do
    count = count + 1
    leases[count] = args[i]
  end
  -- Which were still open, closing them: a ZREM each, whose number reply says. (One ZMSCORE
  -- for the batch cost more, 2.4 % of a pair's server instructions: Redis 7.0 prints each
  -- score with `%.17g` into an array reply that becomes a Lua table. A lease named twice in
  -- a batch is closed once.)
  local was_open = {}
  for j = 1, count do was_open[j] = call('ZREM', K.due, leases[j]) == 1 end
  local abandoned, released = 0, 0
  -- Lease ids of this epoch: an expired lease's outcome is still news about its address; one
  -- from before a loss names nothing.
  local first, last = num(got[3]), num(got[4])
  for j = 1, count do
    local i = from + (j - 1) * RELEASE_ARGS
    local lid = not was_open[j] and tonumber(string.match(args[i], '^l(%d+):'))
    if was_open[j] or (lid and lid > first and lid <= last) then
      local id, class, site = args[i + 1], args[i + 2], args[i + 3]
      local names = names_of(site)
      -- A success's latency level, as its process judged it from its own successes, when
      -- that changed (see `ops`); with the quality levels it may move.
      local hint = class == 's' and tonumber(args[i + 4])
      -- One read of what the release needs: state, newest bad outcome, suspect since; the
      -- pair's avoidance and newest bad outcome only for a named site (tickets without one
      -- have no pair); the quality levels (`q`: latency's, whole) only with a hint.
      local a, f, av, pb, q = addr(K, id), nil, nil, nil, nil
      if site == '-' then
        if hint then
          f = call('HMGET', a, 's', 'wb', 'su', 'qlat', 'ql')
          q = {f[4], f[5]}
        else
          f = call('HMGET', a, 's', 'wb', 'su')
        end
      else
        if hint then
          f = call('HMGET', a, 's', 'wb', 'su', names[8], names[9], 'qlat', 'ql')
          q = {f[6], f[7]}
        else
          f = call('HMGET', a, 's', 'wb', 'su', names[8], names[9])
        end
        av, pb = f[4], f[5]
      end
      if was_open[j] then freed(K, id, f[1], cap, H) end
      if class == 'a' then
        if was_open[j] then
          abandoned = abandoned + 1
          if f[1] then call('HINCRBY', counts_key(K, id), '-|a', '1') end
        end
      elseif f[1] then
        released = released + 1
        local by_class = names[6]
        local cell = by_class[class]
        if not cell then
          cell = site .. '|' .. class
          by_class[class] = cell
        end
        call('HINCRBY', counts_key(K, id), cell, '1')
        if class == 'r' then cool(K, id, site, args[i + 4]) end
        local latency, moved = hint or nil, class ~= 's'
        if hint and latency ~= num(q[1]) then moved = true end
        -- A success's latency in 5 digits, and whether it may have grown the tail (see `ops`).
        local ms, slow = NO_LATENCY, false
        if class == 's' then
          ms = args[i + 5]
          if #ms > 5 then ms, slow = string.sub(ms, 1, 5), true end
        end
        -- A block is a failure in the windows (the counts keep it apart).
        local k = class == 'b' and 'f' or class
        if k ~= 'r' then
          local st = S[site]
          -- At a degraded site, outcomes say nothing about the address (P9).
          local excused = observe(st, j, id, k, now13)
          local entry = (excused and EXCUSED[k] or k) .. st.sid .. ms .. now13
          local bad = k ~= 's' and not excused
          push_entry(window_key(K, id), entry, H)
          if site ~= '-' then push_entry(window_key(K, id, st.sid), entry, H) end
          if bad and site ~= '-' then
            call('HSET', a, 'wb', now13, names[9], now13)
          elseif bad then
            call('HSET', a, 'wb', now13)
          end
          -- The judge is asked about every outcome but a success of a healthy address that
          -- is not suspect, not slow enough to grow its latency tail, at a pair neither
          -- avoided nor recently bad (the common case: no news for the address, whose
          -- signals only a bad outcome or a slow success raises, nor for the pair).
          local pair_news = site ~= '-' and (k ~= 's' or av or (pb and now - tonumber(pb) <= H.max_age))
          if pair_news or not (k == 's' and f[1] == 'healthy' and not f[3] and not slow) then
            judged[#judged + 1] = facts(K, id, bad, H,
              {tostring(j), id, k, excused and '1' or '0', k == 's' and args[i + 5] or '', site, av and '1' or '0'},
              now, st.sid, bad or f[3] ~= nil)
          end
        end
        -- Only a latency level that moved, or an outcome that found a bad window or may
        -- have made one, can have changed its weight.
        if moved or f[2] then reweigh(K, id, q, latency, now, H, f[2] ~= nil) end
      end
    end
  end
  if abandoned > 0 then call('HINCRBY', K.meta, 'abandoned', tostring(abandoned)) end
  if released > 0 then call('HINCRBY', K.meta, 'released', tostring(released)) end
end

-- ops: a batch of releases, then a batch of acquires, in one call (a call's fixed cost is a
-- large share of a small operation's). ARGV[5] the leases' deadline, [6] the sessions'
-- deadline (ms), [7] load factor, [8] the number of releases, [9] the first of the caller's
-- lease ids for the acquires ('0': none) and [10] the epoch they were reserved in (see
-- `reserve`; ids of another epoch are not used); then per release: the lease's member in
-- `due` ('l<lease>:<id>'), address id, outcome class ('a' for a lease dropped unreleased: no
-- outcome), site ('-' for none), and for a rate limit ('r') the end of the cooling it asks
-- for (ms), for a success the quality level of its latency as its process judged it from the
-- successes it released (a sample of the address's traffic), when that changed or every 16th
-- success of the address (empty otherwise, and for other outcomes), then for a success its
-- latency in ms in 5 digits, followed by '!' when it was slower than the latency factor ×
-- the address's running mean (it may have grown the tail: the judge reads the window), ''
-- for other outcomes;
-- then per acquire: key ('' = keyless), the key's ring point, site ('-' for none),
-- pool: the keyless strategy's letter (see acquire_one) and the sub-pool's name (none for
-- the whole pool), least connections' seed (see `least`; '0' for other acquires). Replies three elements per acquire (see acquire_one), then the facts the
-- judge needs of the releases that are news (see `facts`; each led by the release's number,
-- its address id, class, '1' if excused, a success's latency (5 digits, then '!' if it may have grown the tail), its site and '1' if
-- that pair was avoided), the sites to judge (see `end_sites`), `more` and the pool's epoch.
local function ops(keys, args)
  local releases = tonumber(args[8]) or 0
  local last_release = 10 + releases * RELEASE_ARGS
  -- What the batch needs of `meta` comes with the context: the epoch's lease ids, the
  -- judgement of the releases' sites (P9), the latest cooling end of the acquires' sites.
  local fields = {'layout', 'epoch', 'seq0', 'seq'}
  local order = site_fields(args, 14, last_release, RELEASE_ARGS, fields)
  -- `cooling`: site → index in `got`; `cool_fields` and `cool_at`: the same as two lists.
  local cooling, cool_fields, cool_at = {}, {}, {}
  for i = last_release + 3, #args, ACQUIRE_ARGS do
    local site = args[i]
    if not cooling[site] then
      fields[#fields + 1] = names_of(site)[5]
      cooling[site] = #fields
      cool_fields[#cool_fields + 1], cool_at[#cool_at + 1] = fields[#fields], #fields
    end
  end
  local K, now, cap, more, H, got = open(keys, args, fields)
  cooled_in_call = false
  local judged, sites = {}, {}
  if releases > 0 then
    local S = sites_from(K, order, got, 5)
    release_part(K, now, cap, H, got, S, args, 11, last_release, judged)
    sites = end_sites(K, S, H)
  end
  if cooled_in_call and #cool_fields > 0 then
    -- The releases cooled an address: the acquires after them read the sites' ends again.
    local fresh = call('HMGET', K.meta, unpack(cool_fields))
    for k, i in ipairs(cool_at) do got[i] = fresh[k] end
  end
  local first = args[9] ~= '0' and args[10] == got[2] and tonumber(args[9]) or nil
  local out, n
  out, n, more = acquire_part(K, now, cap, H, got, cooling, args, last_release + 1, more, first)
  out[n + 1] = judged
  out[n + 2] = sites
  out[n + 3] = more
  -- Which incarnation of the pool answered (see `add`): a client that sees it change knows
  -- its cached ids are stale.
  out[n + 4] = got[2] or ''
  return out
end

-- reserve: ARGV[5] how many lease ids. Reserves them for the caller, which numbers its
-- acquires with them (see `ops`): it then knows the ids of grants whose reply it lost, and
-- can find them (`reclaim`). Replies the first id and the pool's epoch; nil before the
-- first add (the epoch sets where ids start).
local function reserve(keys, args)
  local K, _, _, _, _, got = open(keys, args)
  if not got[2] then return false end
  local last = call('HINCRBY', K.meta, 'seq', args[5])
  call('HINCRBY', K.meta, 'reserved', args[5])
  return {last - tonumber(args[5]) + 1, got[2]}
end

-- reclaim: ARGV[5] the leases' deadline of an `ops` call whose reply was lost, [6] its first
-- lease id, [7] its number of acquires. Replies the leases it granted that are still open
-- (`l<lease>:<address id>`, as in `due`: every grant of the call is due at that deadline),
-- for the caller to give back.
local function reclaim(keys, args)
  local K = open(keys, args)
  local first = tonumber(args[6])
  local last = first + tonumber(args[7]) - 1
  local out = {}
  for _, m in ipairs(call('ZRANGEBYSCORE', K.due, args[5], args[5])) do
    local lid = tonumber(string.match(m, '^l(%d+):'))
    if lid and lid >= first and lid <= last then out[#out + 1] = m end
  end
  return out
end

-- probe report: ARGV[5] url, [6] '1' passed / '0' failed. In service, a failure is one
-- failed outcome without a site, as a release would be (counts, windows, weight, the site '-'); a pass
-- there is not news (replies 1). Otherwise replies the facts the judge needs (see `facts`:
-- the judge decides as `PoolState::report_probe` does) and the site to judge, if any (see
-- `end_sites`). Replies 0 if unknown.
local function probe(keys, args)
  local fields = {'layout', 'epoch'}
  local order = site_fields({'-'}, 1, 1, 1, fields)
  local K, now, _, _, H, got = open(keys, args, fields)
  local id = call('HGET', K.byurl, args[5])
  if not id then return 0 end
  local s, passed, excused, sites = call('HGET', addr(K, id), 's'), args[6] == '1', false, {}
  if passed and s ~= 'probing' and s ~= 'dead' then return 1 end
  if not passed and (s == 'healthy' or s == 'degraded') then
    -- Counted ('p': a failure without a lease), windowed and weighed as a siteless release's
    -- failure is (`release_part`).
    call('HINCRBY', counts_key(K, id), '-|p', '1')
    local S = sites_from(K, order, got, 3)
    local now13 = pad13(now)
    excused = observe(S['-'], 0, id, 'f', now13)
    push_entry(window_key(K, id), (excused and 'F' or 'f') .. NO_SID .. NO_LATENCY .. now13, H)
    if not excused then call('HSET', addr(K, id), 'wb', now13) end
    reweigh(K, id, nil, nil, now, H, true)
    sites = end_sites(K, S, H)
  end
  local class = passed and 's' or 'f'
  local bad = not passed and not excused
  local record = facts(K, id, bad, H, {'', id, class, excused and '1' or '0', '', '-', '0'}, now, nil, bad)
  return record and {record, sites} or 0
end

-- Adds ring points `args[from..]` of address `id` to `ring`, or removes them; in chunks:
-- Lua's unpack has a limit of a few thousand values.
local function place(ring, id, args, from)
  local points = {}
  for i = from, #args do
    points[#points + 1] = args[i]
    points[#points + 1] = id .. ':' .. (i - from)
    if #points == 1000 or i == #args then
      call('ZADD', ring, unpack(points))
      points = {}
    end
  end
end

local function unplace(ring, id, vnodes)
  local points = {}
  for v = 0, vnodes - 1 do
    points[#points + 1] = id .. ':' .. v
    if #points == 1000 or v == vnodes - 1 then
      call('ZREM', ring, unpack(points))
      points = {}
    end
  end
end

-- add: ARGV[5] url, [6] redacted name, [7] fingerprint (52 bits), [8] an epoch token (16
-- random hex digits), [9] its sub-pools' names (space separated), [10..] ring points.
-- Replies 0 if the URL is present already (every process may add the same start list). The
-- first add of a pool (or of a pool Redis lost) sets its epoch.
local function add(keys, args)
  local K, now, cap, _, H = open(keys, args)
  local url = args[5]
  if call('HEXISTS', K.byurl, url) == 1 then return 0 end
  -- A new epoch starts lease ids at a random point below 2^44, so that leases granted before
  -- a loss cannot close the new ones. (Below 10^14: Lua 5.1 prints larger numbers with an
  -- exponent, and lease members are built from the printed id.)
  if call('HSETNX', K.meta, 'epoch', args[8]) == 1 then
    local seq0 = tostring(tonumber(string.sub(args[8], 1, 11), 16))
    call('HSET', K.meta, 'seq', seq0, 'seq0', seq0, 'layout', LAYOUT)
  end
  -- Site windows hold ids in 9 digits.
  if num(call('HGET', K.meta, 'next_id')) >= 999999999 then
    error({err = 'ERR the pool ' .. K.prefix .. '* has used up its address ids; give it another name'})
  end
  local id = call('HINCRBY', K.meta, 'next_id', '1')
  call('HSET', K.url, id, url)
  call('HSET', K.name, id, args[6])
  call('HSET', addr(K, id), 'n', '0', 'k', '0', 'fp', args[7], 'v', #args - 9)
  local sp = args[9] ~= '' and args[9] or nil
  if sp then call('HSET', addr(K, id), 'sp', sp) end
  for i, P in ipairs(pools_in(K, sp)) do
    if i > 1 then call('HINCRBY', K.meta, P.members, '1') end
    call('ZADD', P.pass, 'NX', '+inf', PASS_END)
    place(P.ring, id, args, 10)
    call('ZADD', P.ids, id, id)
  end
  set_state(K, id, 'healthy', 'added (slow start)', now, cap, H)
  -- Last: until here a failed add leaves nothing that says the URL is present.
  call('HSET', K.byurl, url, id)
  return 1
end

-- Whether address `id` belongs to pool `P`.
local function in_pool(K, id, P)
  if P.name == '' then return true end
  for _, Q in ipairs(pools_in(K, call('HGET', addr(K, id), 'sp'))) do
    if Q.name == P.name then return true end
  end
  return false
end

-- The present addresses that are not offered (or, `counted`, that count against the
-- quarantine cap), of pool `P`, as {id, rank, until}: the end of their quarantine wait
-- (0 if none), dead ones ranked last.
local function out_of_service(K, P, want_counted)
  local states = call('HGETALL', K.state)
  local out = {}
  for i = 1, #states, 2 do
    local id, s = states[i], states[i + 1]
    local wanted = want_counted and counted(s) or (not want_counted and not OFFERED[s])
    if wanted and in_pool(K, id, P) then
      -- Returning the excess: probing ones before quarantined ones; bringing members back:
      -- the dead last.
      local last = want_counted and s == 'quarantined' or (not want_counted and s == 'dead')
      out[#out + 1] = {tonumber(id), last and 1 or 0, num(call('ZSCORE', K.due, 'q' .. id))}
    end
  end
  table.sort(out, function(x, y)
    if x[2] ~= y[2] then return x[2] < y[2] end
    if x[3] ~= y[3] then return x[3] < y[3] end
    return x[1] < y[1]
  end)
  return out
end

-- P8 after a removal: out-of-service members of pool `P` come back early (probing) until it
-- offers its minimum again — quarantined ones closest to their return first, the dead last.
local function keep_minimum(K, P, now, cap, H)
  local min = math.min(H.min_in_service, members_of(K, P))
  local short = min - num(call('HGET', K.meta, P.offered))
  if short <= 0 then return end
  for _, c in ipairs(out_of_service(K, P, false)) do
    if short <= 0 then return end
    set_state(K, tostring(c[1]), 'probing', 'brought back early to keep ' .. min .. ' in service', now, cap, H)
    short = short - 1
  end
end

-- P7 after a removal: a smaller pool has a smaller cap; the excess returns to service on a
-- ramp (probing ones first, then those closest to the end of their wait).
local function keep_cap(K, now, cap, H)
  local qcap = math.max(1, math.ceil(H.qcap * call('HLEN', K.state)))
  local excess = num(call('HGET', K.meta, 'q')) - qcap
  if excess <= 0 then return end
  for _, c in ipairs(out_of_service(K, pool_of(K, ''), true)) do
    if excess <= 0 then return end
    set_state(K, tostring(c[1]), 'healthy', 'returned early: the pool shrank and its quarantine cap is ' .. qcap, now, cap, H)
    excess = excess - 1
  end
end

-- The named sites in an address's outcome counts (an HGETALL of 'c:ID'), once each.
local function sites_counted(cells)
  local out, seen = {}, {['-'] = true}
  for i = 1, #cells, 2 do
    local name = string.match(cells[i], '^(.*)|[^|]*$')
    if name and not seen[name] then out[#out + 1], seen[name] = name, true end
  end
  return out
end

-- remove: ARGV[5] url. The url and name stay: bindings to it report a broken session with its
-- address. Replies 0 if unknown.
local function remove(keys, args)
  local K, now, cap, _, H = open(keys, args)
  local id = call('HGET', K.byurl, args[5])
  if not id then return 0 end
  -- Out of every pool and count first; logged as the memory store logs it.
  set_state(K, id, 'absent', 'removed', now, cap, H)
  local a = addr(K, id)
  local f = call('HMGET', a, 'v', 'sp')
  local in_pools = pools_in(K, f[2])
  for i, P in ipairs(in_pools) do
    if i > 1 then call('HINCRBY', K.meta, P.members, '-1') end
    -- Its sessions are broken: they no longer weigh on the mean of bounded loads.
    local bound = num(call('HGET', a, P.bound))
    if bound > 0 then call('HINCRBY', K.meta, P.bound, digits(-bound)) end
    unplace(P.ring, id, num(f[1]))
    call('ZREM', P.ids, id)
  end
  -- Its open leases still count until they end (as in memory): as orphans, its hash going.
  local open_leases = num(call('HGET', a, 'n'))
  if open_leases > 0 then call('HINCRBY', K.meta, 'orphans', digits(open_leases)) end
  call('HDEL', K.byurl, args[5])
  call('HDEL', K.state, id)
  -- Its windows: the address's, and its pairs' (their sites' numbers from its counts).
  local windows = {window_key(K, id)}
  for _, name in ipairs(sites_counted(call('HGETALL', K.prefix .. 'c:' .. id))) do
    local sid = call('HGET', K.meta, names_of(name)[7])
    if sid then windows[#windows + 1] = window_key(K, id, sid) end
  end
  call('DEL', a, K.prefix .. 'c:' .. id, unpack(windows))
  call('ZREM', K.due, 'q' .. id)
  for _, P in ipairs(in_pools) do keep_minimum(K, P, now, cap, H) end
  keep_cap(K, now, cap, H)
  return 1
end

-- end_session: ARGV[5] key. Replies 1 if it was bound.
local function end_session(keys, args)
  local K = open(keys, args)
  return unbind(K, args[5]) and 1 or 0
end

-- snapshot: everything the client needs to build a Snapshot, in one round trip: the state
-- index, URLs, names, each present address's hash and outcome counts (in the index's order),
-- quarantine deadlines, meta (with the sites' judgement), the number of bindings, the
-- newest 200 transitions and each present address's windows (its own, then its pairs').
local function snapshot(keys, args)
  local K = open(keys, args)
  local states = call('HGETALL', K.state)
  local rows, cells, until_ms, windows = {}, {}, {}, {}
  for i = 1, #states, 2 do
    local id = states[i]
    rows[#rows + 1] = call('HGETALL', addr(K, id))
    local c = call('HGETALL', K.prefix .. 'c:' .. id)
    cells[#cells + 1] = c
    -- Its window, then site name and window per pair.
    local w = {call('GET', window_key(K, id)) or ''}
    for _, name in ipairs(sites_counted(c)) do
      local sid = call('HGET', K.meta, names_of(name)[7])
      if sid then
        w[#w + 1] = name
        w[#w + 1] = call('GET', window_key(K, id, sid)) or ''
      end
    end
    windows[#windows + 1] = w
    if states[i + 1] == 'quarantined' then
      until_ms[#until_ms + 1] = states[i]
      until_ms[#until_ms + 1] = call('ZSCORE', K.due, 'q' .. states[i])
    end
  end
  local meta = call('HGETALL', K.meta)
  -- Expired leases are counted in one process's metrics each: the reading one takes those not
  -- yet counted (`expired` above `told`, as of the meta returned).
  local expired = call('HGET', K.meta, 'expired')
  if expired then call('HSET', K.meta, 'told', expired) end
  return {
    states, call('HGETALL', K.url), call('HGETALL', K.name), rows, cells, until_ms,
    meta, call('HLEN', K.bind), call('LRANGE', K.log, 0, 199), windows,
  }
end

-- targets: what the prober needs and no more: per present address its state, URL and open
-- leases, and the decisions since ARGV[7] (see below). ARGV[5] the asking prober's token,
-- [6] how long (ms) its role holds: one prober
-- per pool probes (the others get nothing) until it stops asking for that long.
local function targets(keys, args)
  local K = open(keys, args)
  local role = K.prefix .. 'prober'
  local holder = call('GET', role)
  if holder and holder ~= args[5] then return {{}, 0, {}} end
  call('SET', role, args[5], 'PX', args[6])
  local states = call('HGETALL', K.state)
  local out = {}
  for i = 1, #states, 2 do
    out[#out + 1] = states[i + 1]
    out[#out + 1] = call('HGET', K.url, states[i])
    out[#out + 1] = call('HGET', addr(K, states[i]), 'n') or '0'
  end
  -- Decisions numbered above ARGV[7] (none for 0: a new prober starts from now), newest
  -- first, at most 100 per round.
  local decided, since, new = num(call('HGET', K.meta, 'decided')), num(args[7]), {}
  if since > 0 and decided > since then
    for _, e in ipairs(call('LRANGE', K.log, 0, math.min(decided - since, 100) - 1)) do
      new[#new + 1] = e
    end
  end
  return {out, decided, new}
end

-- Checks a process's configuration and tables (ARGV[5]) at connect: readable (see `health`),
-- and the pool's, so that every process of a pool judges alike. The first process records
-- them (any process again once Redis lost them); a process configured otherwise is refused,
-- naming the first field that differs, as is one whose tables differ (another version).
local function config(keys, args)
  local H = decode(args[4], 'config', CONFIG_VERSION, CONFIG_FIELDS)
  load_tables(H, args[5] or '')
  local K = keys_of(keys[1])
  local recorded = call('HMGET', K.meta, 'config', 'tables')
  if not recorded[1] then
    call('HSET', K.meta, 'config', args[4], 'tables', args[5])
  elseif recorded[1] ~= args[4] then
    local theirs = {}
    for token in string.gmatch(recorded[1], '%S+') do
      local name, v = string.match(token, '^([%w_]+)=(.*)$')
      if name then theirs[name] = v end
    end
    for token in string.gmatch(args[4], '%S+') do
      local name, v = string.match(token, '^([%w_]+)=(.*)$')
      if name and theirs[name] ~= v then
        -- Words the client turns into the configuration's names (`encoding::refusal`).
        refuse_config('differs ' .. name .. ' ' .. tostring(theirs[name]) .. ' ' .. v)
      end
    end
  elseif not recorded[2] then
    call('HSET', K.meta, 'tables', args[5])
  elseif recorded[2] ~= args[5] then
    refuse_config('the pool was given other weight tables for this configuration: every process of a pool must run one version of proxypool')
  end
  parsed_health[args[4]] = H
  return CONFIG_VERSION
end

-- facts: ARGV[5] address id, [6] '1' to include the gate's, [7] the outcome's site ('' or '-'
-- for none: its pair's window comes first). The judge's facts again, after `apply` refused a
-- decision taken on older ones or the site changed its verdict (see `facts`); 0 if the
-- address is gone.
local function refacts(keys, args)
  local K, now, _, _, H = open(keys, args)
  local site, sid = args[7], nil
  if site ~= '' and site ~= '-' then sid = call('HGET', K.meta, names_of(site)[7]) or nil end
  return facts(K, args[5], args[6] == '1', H, {}, now, sid, true) or 0
end

-- The fields of an address a decided transition may write (see `apply`).
local DECIDED = {su = true, st = true, lv = true, cy = true}

-- apply: a transition the judge decided on an address's facts. ARGV[5] address id, [6] the
-- version it was decided on, [7] the gate's facts it depended on ('' if none), [8] the state
-- to enter ('' for none), [9] the reason, [10] the end of a quarantine wait ('' for none),
-- then field, value pairs among `DECIDED` ('' deletes), written after the state. Refused
-- (replies 0) when the version or the gate's facts moved meanwhile: the caller judges again
-- on fresh facts. Replies -1 if the address is gone, 1 once applied.
local function apply(keys, args)
  local K, now, cap, _, H = open(keys, args)
  local id = args[5]
  local a = addr(K, id)
  local f = call('HMGET', a, 's', 'ver', 'sp')
  if not f[1] then return -1 end
  if (f[2] or '0') ~= args[6] then return 0 end
  if args[7] ~= '' and gate_facts(K, f[3], H) ~= args[7] then return 0 end
  -- Checked before anything is written: a script's writes are not undone by an error.
  for i = 11, #args - 1, 2 do
    if not DECIDED[args[i]] then error({err = 'ERR apply: not a decided field: ' .. args[i]}) end
  end
  if args[10] ~= '' then call('ZADD', K.due, args[10], 'q' .. id) end
  if args[8] ~= '' then set_state(K, id, args[8], args[9], now, cap, H) end
  for i = 11, #args - 1, 2 do
    local field, v = args[i], args[i + 1]
    if v == '' then call('HDEL', a, field) else call('HSET', a, field, v) end
  end
  call('HINCRBY', a, 'ver', '1')
  return 1
end

-- pair: the judge's decision on an address × site pair (P9, `judge::judge_pair`). ARGV[5]
-- address id, [6] site, [7] '1' if decided on an avoided pair, [8] '1' to avoid it, '0' to
-- forgive it, [9] the reason; to avoid, [10] when it is forgiven by time alone and [11] the
-- reason then (`judge::pair_cleared_at`): until then keyless work there passes it over (see
-- `cools`; the site's latest cooling end rises with it, so acquires there look). Refused (0)
-- when the pair's avoidance moved meanwhile; -1 if the address is gone, 1 once applied.
local function pair(keys, args)
  local K, now = open(keys, args)
  local id, site = args[5], args[6]
  local names, a = names_of(site), addr(K, id)
  local f = call('HMGET', a, 's', names[8])
  if not f[1] then return -1 end
  if (f[2] and '1' or '0') ~= args[7] then return 0 end
  local due = 'v' .. id .. '|' .. site
  if args[8] == '1' then
    call('HSET', a, names[8], args[10], names[10], args[11])
    call('ZADD', K.due, args[10], due)
    if tonumber(args[10]) > num(call('HGET', K.meta, names[5])) then
      call('HSET', K.meta, names[5], args[10])
    end
    decide(K, now, pair_subject(K, id, site), 'ok', 'avoided', args[9])
  else
    call('HDEL', a, names[8], names[10])
    call('ZREM', K.due, due)
    decide(K, now, pair_subject(K, id, site), 'avoided', 'ok', args[9])
  end
  return 1
end

-- P9: the outcomes at site `site` since `from` (the stretch that convicted it) say nothing
-- about the addresses: excused in the address and pair windows of the addresses that had
-- them (every such outcome is still in the site window).
local function excuse(K, site, from, H)
  local keep = H.site_window * ENTRY
  local win = call('GETRANGE', site_window_key(K, site), -keep, -1)
  local sid = site == '-' and NO_SID or call('HGET', K.meta, names_of(site)[7])
  local ids = {}
  -- Newest first, back to the stretch's start.
  for i = #win / ENTRY - 1, 0, -1 do
    if entry_at(win, i) < from then break end
    ids[tonumber(string.sub(win, i * ENTRY + 2, i * ENTRY + 10))] = true
  end
  for id in pairs(ids) do
    local t = digits(id)
    excuse_window(window_key(K, t), sid, from)
    if sid ~= NO_SID then excuse_window(window_key(K, t, sid), nil, from) end
  end
end

-- site: the judge's change of a site's verdict (P9, `judge::sites::judge_site`). ARGV[5] the
-- site, [6] its 'd|SITE' the change was decided on ('' if ok), [7] '1' to degrade it (its
-- outcomes since [9], ms, excused), '0' to clear it, [8] the reason. Refused when the site's
-- state moved meanwhile (another process decided: its decision stands). Replies '1' if
-- applied, the site's 'd|SITE' now, then what our side is judged on: `sv`, `frozen` and per
-- site its window and '1' if degraded.
local function site(keys, args)
  local K, now, _, _, H = open(keys, args)
  local name = args[5]
  local field = names_of(name)[2]
  local d = call('HGET', K.meta, field) or ''
  if d ~= args[6] then return {'0', d, '', '', {}} end
  if args[7] == '1' then
    d = args[1]
    call('HSET', K.meta, field, d)
    excuse(K, name, tonumber(args[9]), H)
    decide(K, now, '@site ' .. name, 'ok', 'degraded', args[8])
  else
    d = ''
    call('HDEL', K.meta, field)
    decide(K, now, '@site ' .. name, 'degraded', 'ok', args[8])
  end
  local version = call('HINCRBY', K.meta, 'sv', '1')
  -- Every site: '-' and those given a number.
  local all, fields, names = call('HGETALL', K.meta), {}, {'-'}
  for i = 1, #all, 2 do
    fields[all[i]] = all[i + 1]
    if string.sub(all[i], 1, 4) == 'sid|' then names[#names + 1] = string.sub(all[i], 5) end
  end
  local keep, sites = H.site_window * ENTRY, {}
  -- Their windows, in chunks (Lua's unpack has a limit of a few thousand values).
  for from = 1, #names, 512 do
    local to, wkeys = math.min(from + 511, #names), {}
    for i = from, to do wkeys[#wkeys + 1] = site_window_key(K, names[i]) end
    local wins = call('MGET', unpack(wkeys))
    for i = from, to do
      local win = wins[i - from + 1]
      if win and win ~= '' then
        sites[#sites + 1] = #win > keep and string.sub(win, -keep) or win
        sites[#sites + 1] = fields[names_of(names[i])[2]] and '1' or '0'
      end
    end
  end
  return {'1', d, tostring(version), fields.frozen or '0', sites}
end

-- our_side: the judge's change of our side (P9, `judge::sites::judge_our_side`). ARGV[5] the
-- `sv` it was judged at, [6] '1' to freeze quarantining, '0' to end the freeze, [7] the
-- reason. Refused (0) when a site changed since: that change's process judges again.
local function our_side(keys, args)
  local K, now = open(keys, args)
  if (call('HGET', K.meta, 'sv') or '0') ~= args[5] then return 0 end
  call('HSET', K.meta, 'frozen', args[6])
  if args[6] == '1' then
    decide(K, now, '@pool', 'quarantining', 'frozen', args[7])
  else
    decide(K, now, '@pool', 'frozen', 'quarantining', args[7])
  end
  return 1
end

redis.register_function('__LIB___pair', entry(pair))
redis.register_function('__LIB___site', entry(site))
redis.register_function('__LIB___our_side', entry(our_side))
redis.register_function('__LIB___ops', entry(ops))
redis.register_function('__LIB___reserve', entry(reserve))
redis.register_function('__LIB___reclaim', entry(reclaim))
redis.register_function('__LIB___facts', entry(refacts))
redis.register_function('__LIB___apply', entry(apply))
redis.register_function('__LIB___probe', entry(probe))
redis.register_function('__LIB___add', entry(add))
redis.register_function('__LIB___remove', entry(remove))
redis.register_function('__LIB___end_session', entry(end_session))
redis.register_function('__LIB___snapshot', entry(snapshot))
redis.register_function('__LIB___targets', entry(targets))
redis.register_function('__LIB___config', entry(config))

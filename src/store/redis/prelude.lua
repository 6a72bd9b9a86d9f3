-- The helpers every script starts with. ARGV[1] is the key prefix in every script (P). A script
-- that dispatch.lua runs (batched_scripts) reads its call's arguments as ARGV[O + n], n from 2: O is
-- 0 when it runs alone, and where its call's arguments start in dispatch.lua's ARGV when it is one
-- call of many (there ARGV[O] and ARGV[O + 1] are the call's script and argument count, not the
-- prefix). A helper that reads arguments itself takes their position in ARGV: O + n.
local P = ARGV[1]
local JOBS_DUE = P .. ':jobs:due'
local CB_DUE = P .. ':callbacks:due'
local FAILED = P .. ':callbacks:failed'
-- A tenant's own dead letters, beside FAILED (every tenant's): the set of the tenant a key
-- ("tenant/id"; tenant names and ids hold no '/') or a listing's id prefix ("tenant/...") names,
-- so that a tenant's listing never walks another's. nil for the default tenant's keys (no '/'):
-- those are in FAILED alone.
local function tenant_failed(id)
  local slash = string.find(id, '/', 1, true)
  if slash and slash > 1 then return P .. ':callbacks:failed-of:' .. string.sub(id, 1, slash - 1) end
  return nil
end
local function failed_add(score, id)
  redis.call('ZADD', FAILED, score, id)
  local own = tenant_failed(id)
  if own then redis.call('ZADD', own, score, id) end
end
local function failed_rem(id)
  redis.call('ZREM', FAILED, id)
  local own = tenant_failed(id)
  if own then redis.call('ZREM', own, id) end
end
-- The dead letters a listing with `prefix` walks: its tenant's own set once the store has them
-- all (P:schema 3, tenants.lua), else everyone's.
local function failed_walked(prefix)
  if (tonumber(redis.call('GET', P .. ':schema')) or 0) < 3 then return FAILED end
  return tenant_failed(prefix) or FAILED
end
local UNFINISHED = P .. ':unfinished'
local QUEUED = P .. ':queued'
-- Every job by creation time, for listings: trimmed past the retention as jobs are put.
local ALL = P .. ':jobs'
-- Jobs are filed in JOBS_DUE by priority, then due time: a score of priority * BAND + ms, exact in
-- a double (below 2^53) for every priority 0..9 and any time before the year 2109.
local BAND = 4398046511104
local function job_score(priority, ms) return string.format('%.0f', tonumber(priority) * BAND + tonumber(ms)) end
local function job_priority(key) return tonumber(redis.call('HGET', key, 'priority') or '5') end
-- True when the job's end is called back: a URL, and `completed` (2) among its events (1..3).
local function wants_callback(key)
  local f = redis.call('HMGET', key, 'url', 'events')
  return f[1] ~= nil and f[1] ~= false and f[1] ~= '' and tonumber(f[2] or '2') % 4 >= 2
end
local function job_key(id) return P .. ':job:' .. id end
-- True when `a` sorts before `b` byte by byte, as C++, SQLite and Redis's sorted sets compare
-- strings (Lua's `<` follows the server's locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
-- Jobs not final are filed per tenant, so that a claim takes turns across tenants (claim.lua):
-- the default tenant's (keys without '/') in JOBS_DUE, each other tenant's in a set of its own,
-- named in DUE_TENANTS. A server of an older build files every tenant's in JOBS_DUE: a claim
-- takes those in the default tenant's turn and files them in their own set, and every write
-- that takes a job out of its set takes it out of JOBS_DUE too.
local DUE_TENANTS = P .. ':jobs:due-tenants'
local function tenant_of(id)
  local slash = string.find(id, '/', 1, true)
  if slash and slash > 1 then return string.sub(id, 1, slash - 1) end
  return nil
end
local function jobs_due_of(tenant)
  if tenant then return P .. ':jobs:due-of:' .. tenant end
  return JOBS_DUE
end
local function jobs_due(id) return jobs_due_of(tenant_of(id)) end
local function is_final(status)
  return status == 'succeeded' or status == 'failed' or status == 'expired' or
         status == 'cancelled'
end
-- The lease on a job (before its outcome) or on its callback (after): held by `holder`, live.
local function held_by(holder_field, until_field, holder, now)
  -- (`+ 0` rather than tonumber: Lua 5.1's tonumber reads a text twice, and this runs at every
  -- transition.)
  return holder_field and holder_field ~= '' and holder_field == holder and
         (until_field or 0) + 0 > now + 0
end
local function holds(key, holder, now)
  local f = redis.call('HMGET', key, 'holder', 'until')
  return held_by(f[1], f[2], holder, now)
end
-- ALL forgets the jobs that expired: `count` of its oldest members looked at, from a rank kept in
-- SWEEP. A member whose job lives on (not finished, or within its retention) is stepped over; the
-- sweep starts again from the oldest at the members too young to have expired (created within
-- the retention, `now` - `retention` ms), or at the end.
local function sweep(count, now, retention)
  if tonumber(retention) <= 0 then return end
  local SWEEP = ALL .. ':sweep'
  local from = tonumber(redis.call('GET', SWEEP) or '0')
  local at = from
  local horizon = tonumber(now) - tonumber(retention)
  -- The member at `at` first: most often it is too young to have expired, and the sweep is done
  -- without fetching the others. (By rank: a score range's LIMIT offset walks the set before
  -- Redis 7.2.)
  local first = redis.call('ZRANGE', ALL, at, at, 'WITHSCORES')
  local members = {}
  if #first == 2 and tonumber(first[2]) < horizon then
    members = redis.call('ZRANGE', ALL, at, at + count - 1, 'WITHSCORES')
  end
  local restart = #members < 2 * count
  for i = 1, #members, 2 do
    if tonumber(members[i + 1]) >= horizon then restart = true; break end
    if redis.call('EXISTS', job_key(members[i])) == 0 then
      redis.call('ZREM', ALL, members[i])
      -- A dead letter that expired leaves the count of failed callbacks too.
      failed_rem(members[i])
    else
      at = at + 1
    end
  end
  local next_at = restart and 0 or at
  if next_at ~= from then redis.call('SET', SWEEP, next_at) end
end
-- Within dispatch.lua: the puts of the call sweep ALL once, after them (two members a put).
local BATCH, PUTS, PUT_NOW, PUT_RETENTION = false, 0, '0', '0'
-- The sorted-set writes of the calls a dispatch.lua runs: gathered, and sent by zflush as one ZADD
-- and one ZREM per set (a ZADD XX too, for renewals), so that a batch of N jobs costs Redis a few
-- commands a set rather than N (each command is also an entry in the AOF). The last write of a
-- member wins, as it would have in order; zflush runs before anything reads a set (the sweep) and
-- at the end. Outside dispatch.lua they are written at once. Every transition writes the sets after
-- its hash, and checks what could fail before either: a call refused (its hash write at
-- maxmemory, say) has noted nothing. ZW: set -> {v = member -> score, or REMOVED; xx = member ->
-- true while its only write is a ZADD XX; m = members in order}.
local REMOVED = {}
local ZW, ZSETS = {}, {}
local function zwrite(set, id, score, xx)
  -- (A missing field, as a score, fails its call here. A text that is not a number is left to
  -- Redis: checking it here would cost more than the rest of this function, and zsend loses only
  -- that member's write.)
  if score ~= REMOVED and type(score) ~= 'string' then error('not a score: ' .. tostring(score)) end
  if not BATCH then
    if score == REMOVED then
      redis.call('ZREM', set, id)
    elseif xx then
      redis.call('ZADD', set, 'XX', score, id)
    else
      redis.call('ZADD', set, score, id)
    end
    return
  end
  local w = ZW[set]
  if not w then
    w = {v = {}, xx = {}, m = {}}
    ZW[set] = w
    ZSETS[#ZSETS + 1] = set
  end
  local was = w.v[id]
  if was == nil then
    w.m[#w.m + 1] = id
  elseif xx then
    -- XX after a removal: nothing to update; after an add: the add, with this score.
    if was ~= REMOVED then w.v[id] = score end
    return
  end
  w.v[id] = score
  w.xx[id] = xx or nil
end
local function zadd(set, score, id) zwrite(set, id, score, false) end
local function zadd_xx(set, score, id) zwrite(set, id, score, true) end
local function zrem(set, id) zwrite(set, id, REMOVED, false) end
-- failed_add and failed_rem through these writes.
local function zadd_failed(score, id)
  zadd(FAILED, score, id)
  local own = tenant_failed(id)
  if own then zadd(own, score, id) end
end
local function zrem_failed(id)
  zrem(FAILED, id)
  local own = tenant_failed(id)
  if own then zrem(own, id) end
end
-- A job's entry among the jobs not final (jobs_due), and in JOBS_DUE where an older server
-- filed it.
local NAMED = {}  -- tenants named in DUE_TENANTS by this script run
local function zadd_due(score, id)
  local tenant = tenant_of(id)
  if tenant and not NAMED[tenant] then
    redis.call('SADD', DUE_TENANTS, tenant)
    NAMED[tenant] = true
  end
  zadd(jobs_due_of(tenant), score, id)
end
local function zrem_due(id)
  zrem(JOBS_DUE, id)
  local tenant = tenant_of(id)
  if tenant then zrem(jobs_due_of(tenant), id) end
end
-- (unpack passes at most a few thousand values: the members go out in slices.)
-- A slice Redis refuses (a ZADD checks every score first: one it does not take, from a job's hash
-- that something else wrote, fails them all) goes again member by member, so that only that
-- member's write is lost, not the batch's.
local function zsend(command, set, xx, values)
  local per = command == 'ZREM' and 1 or 2
  for i = 1, #values, 2000 do
    local last = math.min(i + 1999, #values)
    local answer
    if xx then
      answer = redis.pcall(command, set, 'XX', unpack(values, i, last))
    else
      answer = redis.pcall(command, set, unpack(values, i, last))
    end
    if type(answer) == 'table' and answer.err then
      for k = i, last, per do
        if xx then
          redis.pcall(command, set, 'XX', values[k], values[k + 1])
        else
          redis.pcall(command, set, unpack(values, k, k + per - 1))
        end
      end
    end
  end
end
local function zflush()
  for _, set in ipairs(ZSETS) do
    local w = ZW[set]
    local add, add_xx, rem = {}, {}, {}
    for _, id in ipairs(w.m) do
      local score = w.v[id]
      if score == REMOVED then
        rem[#rem + 1] = id
      else
        local to = w.xx[id] and add_xx or add
        to[#to + 1] = score
        to[#to + 1] = id
      end
    end
    zsend('ZREM', set, false, rem)
    zsend('ZADD', set, false, add)
    zsend('ZADD', set, true, add_xx)
  end
  ZW, ZSETS = {}, {}
end
-- Fields at their defaults are not written (a job's hash holds what it needs): a missing field
-- reads as its default here and in read_record.
-- A finished job (final, its callback delivered, given up or not wanted) expires.
local function finish(key, id, now, retention)
  zrem(UNFINISHED, id)
  redis.call('HSET', key, 'finished', now)
  if tonumber(retention) > 0 then redis.call('PEXPIRE', key, retention) end
end
local function unfinish(key, id)
  redis.call('PERSIST', key)
  redis.call('HSET', key, 'finished', '')
  zadd(UNFINISHED, redis.call('HGET', key, 'created'), id)
end
-- Writes a callback's state from ARGV[first ..] (first: O + n; state, attempts, last error, next attempt,
-- delivery attempts, delivery start, previous delay) and files the job by it.
local function write_callback(key, id, first, now, retention)
  local state = ARGV[first]
  redis.call('HSET', key, 'cb_state', state, 'cb_attempts', ARGV[first + 1],
             'cb_error', ARGV[first + 2], 'cb_next', ARGV[first + 3], 'cb_da', ARGV[first + 4],
             'cb_started', ARGV[first + 5], 'cb_prev', ARGV[first + 6])
  if state == 'pending' then
    redis.call('ZADD', CB_DUE, ARGV[first + 3], id)
    failed_rem(id)
    local finished = redis.call('HGET', key, 'finished')
    if finished and finished ~= '' then unfinish(key, id) end
    return
  end
  redis.call('ZREM', CB_DUE, id)
  if state == 'failed' then
    failed_add(redis.call('HGET', key, 'created'), id)
  else
    failed_rem(id)
  end
  if is_final(redis.call('HGET', key, 'status')) and (state == 'delivered' or state == 'failed') then
    finish(key, id, now, retention)
  end
end
-- Writes an outcome from ARGV[first ..] (first: O + n; status, result, has error, code, message).
local function write_outcome(key, first)
  redis.call('HSET', key, 'status', ARGV[first], 'result', ARGV[first + 1])
  if ARGV[first + 2] == '1' then
    redis.call('HSET', key, 'err_code', ARGV[first + 3], 'err_msg', ARGV[first + 4])
  else
    redis.call('HDEL', key, 'err_code', 'err_msg')
  end
end
-- Records (id, fields, id, fields, ...) of the members `ids`, dropping those that expired.
local function records(set, ids, out, limit)
  for _, id in ipairs(ids) do
    if #out >= 2 * limit then return end
    local fields = redis.call('HGETALL', job_key(id))
    if #fields == 0 or (set == FAILED and redis.call('HGET', job_key(id), 'cb_state') ~= 'failed') then
      if set == FAILED then failed_rem(id) else redis.call('ZREM', set, id) end
    else
      out[#out + 1] = id
      out[#out + 1] = fields
    end
  end
end

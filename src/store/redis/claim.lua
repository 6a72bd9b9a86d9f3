-- claim: ARGV which ("jobs" or "callbacks"), now, max, holder, until, and for jobs the versions
-- to leave alone ("name version" lines: JobLeaseStore::claim_jobs_except). Callbacks by due time. Jobs
-- by turns across tenants (job_state::claim_turns): each tenant's due jobs by priority, 0 first,
-- then due time; one job a tenant a turn, from the tenant after the one that took the last job
-- of the claim before (TURN, shared by every server of the store).
local max = tonumber(ARGV[4])
local out = {}
local function take(set, id, score)
  local key = job_key(id)
  -- Gone, or (callbacks) not pending: a stale member, of a job that expired and whose id was used
  -- again, say.
  if redis.call('EXISTS', key) == 0 or
     (set == CB_DUE and redis.call('HGET', key, 'cb_state') ~= 'pending') then
    redis.call('ZREM', set, id)
    return false
  end
  redis.call('ZADD', set, score, id)
  redis.call('HSET', key, 'holder', ARGV[5], 'until', ARGV[6])
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGETALL', key)
  return true
end
if ARGV[2] ~= 'jobs' then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', CB_DUE, '-inf', ARGV[3], 'LIMIT', 0, max)) do
    take(CB_DUE, id, ARGV[6])
  end
  return out
end
local TURN = P .. ':jobs:turn'
-- The tenants with jobs not final, by name: the default tenant ('') first. A tenant whose set
-- emptied leaves DUE_TENANTS (a put names it again).
local tenants = redis.call('SMEMBERS', DUE_TENANTS)
table.sort(tenants, before)
local names, sets = {''}, {JOBS_DUE}
for _, tenant in ipairs(tenants) do
  local set = jobs_due_of(tenant)
  if redis.call('EXISTS', set) == 1 then
    names[#names + 1], sets[#sets + 1] = tenant, set
  else
    redis.call('SREM', DUE_TENANTS, tenant)
  end
end
-- The versions left alone: a job of one stays in its place for the servers that serve it.
local skip = nil
for line in string.gmatch(ARGV[7] or '', '[^\n]+') do
  skip = skip or {}
  skip[line] = true
end
local function skipped(id)
  if not skip then return false end
  local m = redis.call('HMGET', job_key(id), 'model', 'mver')
  return skip[(m[1] or '') .. ' ' .. (m[2] or '')] == true
end
-- Where the last claim with the same versions to skip got to in a tenant's priority: the last
-- of the skipped jobs it read before the first it could take ("since score id", `since` the
-- time of the claim that read from the front). The next one goes on after it, so that jobs
-- behind more skipped ones than a claim reads are reached in a few claims (read from the front
-- each time, 1,000 jobs of a version this server leaves alone held the others back for good).
-- The point only ever passes skipped jobs; it is used for 300 s from `since` (a job filed before
-- it meanwhile, by a lease that ran out, waits at most that for these servers; a claim that
-- skips nothing reads from the front) and ends when a claim reads to the end and finds nothing.
-- One key per due set, priority and list of versions (the list, which may be long, digested once
-- a claim).
local skip_digest = ARGV[7] and redis.sha1hex(ARGV[7]) or ''
local function resume_key(set, p)
  return P .. ':jobs:resume:' .. redis.sha1hex(set .. '\n' .. p .. '\n' .. skip_digest)
end
-- Each tenant's due jobs, at most `max`, in its order: (id, priority) pairs. With versions to
-- skip, read in pages of 100 by rank from the resume point, past at most 1,000 jobs a tenant's
-- priority and 5,000 in all (the rest wait for the next claim: one script holds Redis for every
-- server).
local due, with = {}, {}
local looked_all = 0
for i, set in ipairs(sets) do
  local mine = {}
  for p = 0, 9 do
    if #mine >= 2 * max then break end
    if not skip then
      local ids = redis.call('ZRANGEBYSCORE', set, job_score(p, 0), job_score(p, ARGV[3]), 'LIMIT',
                             0, max - #mine / 2)
      for _, id in ipairs(ids) do
        mine[#mine + 1] = id
        mine[#mine + 1] = p
      end
    else
      -- The due jobs of priority p are the ranks first .. last of the set.
      local first = redis.call('ZCOUNT', set, '-inf', '(' .. job_score(p, 0))
      local last = first + redis.call('ZCOUNT', set, job_score(p, 0), job_score(p, ARGV[3])) - 1
      local resume = last >= first and resume_key(set, p)
      local from = resume and redis.call('GET', resume)
      local rank, since = first, ARGV[3]
      if from then
        -- Young enough (300 s either way: another server's clock may be ahead), and its job still
        -- there with the same score (not claimed or moved since), among them: after it.
        local since_was, score, id = string.match(from, '^(%d+) (%S+) (.+)$')
        local age = since_was and tonumber(ARGV[3]) - tonumber(since_was)
        local r = age and math.abs(age) < 300000 and redis.call('ZRANK', set, id)
        if r and r >= first and r < last and redis.call('ZSCORE', set, id) == score then
          rank, since = r + 1, since_was
        end
      end
      -- (Past the budget of all, a page still: a tenant after a crowded one is looked at.)
      local looked, found, passed = 0, 0, nil
      while rank <= last and #mine < 2 * max and looked < 1000 and
            (looked_all < 5000 or looked == 0) do
        local page = redis.call('ZRANGE', set, rank, math.min(rank + 99, last), 'WITHSCORES')
        for k = 1, #page, 2 do
          if #mine >= 2 * max then break end
          local id = page[k]
          rank, looked, looked_all = rank + 1, looked + 1, looked_all + 1
          if not skipped(id) then
            found = found + 1
            mine[#mine + 1] = id
            mine[#mine + 1] = p
          elseif found == 0 then
            passed = page[k + 1] .. ' ' .. id
          end
        end
      end
      if found == 0 and rank > last then
        if from then redis.call('DEL', resume) end
      elseif passed then
        redis.call('SET', resume, since .. ' ' .. passed, 'EX', 300)
      end
    end
  end
  if #mine > 0 then
    due[#due + 1] = mine
    with[#with + 1] = i
  end
end
if #due == 0 then return out end
-- The first turn: the first tenant after the last one served, wrapping round.
local last = redis.call('GET', TURN)
local first = 1
if last then
  while first <= #due and not before(last, names[with[first]]) do first = first + 1 end
  if first > #due then first = 1 end
end
local taken_by = nil
for position = 1, 2 * max, 2 do
  local any = false
  for k = 0, #due - 1 do
    if #out >= 2 * max then break end
    local t = (first - 1 + k) % #due + 1
    local mine = due[t]
    if position < #mine then
      any = true
      local id, p = mine[position], mine[position + 1]
      local set = sets[with[t]]
      if take(set, id, job_score(p, ARGV[6])) then
        taken_by = names[with[t]]
        -- An older server's entry of a tenant's job (in JOBS_DUE) moves to the tenant's own set.
        local own = jobs_due(id)
        if own ~= set then
          redis.call('ZREM', set, id)
          redis.call('SADD', DUE_TENANTS, tenant_of(id))
          redis.call('ZADD', own, job_score(p, ARGV[6]), id)
        end
      end
    end
  end
  if not any or #out >= 2 * max then break end
end
if taken_by then redis.call('SET', TURN, taken_by) end
return out

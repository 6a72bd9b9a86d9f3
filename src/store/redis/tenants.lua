-- Brings a store written by an older build up to date, in slices, so that no one call holds Redis
-- long; answers {the next start, the end} to be called with as ARGV[2], ARGV[3], or {-1} once done,
-- after which P:schema says so and later starts skip it. Best effort: what it does not reach (a
-- record an older server writes during a rolling upgrade) is read as before.
-- Schema 2: jobs written before the tenant was a field of its own: from ARGV[2] on, the next 1,000
-- jobs of ALL get a 'tenant' field from their key ("tenant/id": tenant names and ids hold no '/'),
-- where their hash exists and has none. ARGV[3]: where ALL ended when the migration began (empty on
-- the first call), so that puts of other servers meanwhile do not keep it going. Those it does not
-- reach read their tenant from their key (read_record).
-- Schema 3: each tenant's dead letters get their own set beside FAILED (tenant_failed). Walked with
-- ZSCAN (ARGV[2] its cursor, from 0), which reaches every member that stays in FAILED throughout
-- whatever is added or removed meanwhile (by rank, a removal would make it skip one). Until the
-- mark says 3, listings walk FAILED (page.lua, list.lua): a walk that failed hides nothing.
local SCHEMA = P .. ':schema'
local schema = tonumber(redis.call('GET', SCHEMA)) or 0
if schema >= 3 then return {-1} end
-- ARGV[3] is -2 once the caller walks FAILED: a caller still in the first step when another server
-- ended it starts the second from its beginning, not from a rank taken for a cursor.
local walking_failed = ARGV[3] == '-2'
if schema < 2 then
  local from = tonumber(ARGV[2])
  local stop = tonumber(ARGV[3]) or redis.call('ZCARD', ALL)
  local last = math.min(from + 999, stop - 1)
  if last >= from then
    for _, id in ipairs(redis.call('ZRANGE', ALL, from, last)) do
      local slash = string.find(id, '/', 1, true)
      local key = job_key(id)
      if slash and slash > 1 and redis.call('EXISTS', key) == 1 then
        redis.call('HSETNX', key, 'tenant', string.sub(id, 1, slash - 1))
      end
    end
  end
  if last + 1 < stop then return {last + 1, stop} end
  redis.call('SET', SCHEMA, '2')
  return {0, -2}  -- the next step, from the start
end
local scan = redis.call('ZSCAN', FAILED, walking_failed and ARGV[2] or '0', 'COUNT', 1000)
local members = scan[2]
for i = 1, #members, 2 do
  local own = tenant_failed(members[i])
  if own then redis.call('ZADD', own, members[i + 1], members[i]) end
end
if scan[1] ~= '0' then return {tonumber(scan[1]), -2} end
redis.call('SET', SCHEMA, '3')
return {-1}

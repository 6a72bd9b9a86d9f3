-- A store written before the tenant was a field of its own: from ARGV[2] on, the next 1,000 jobs
-- of ALL get a 'tenant' field from their key ("tenant/id": tenant names and ids hold no '/'),
-- where their hash exists and has none. ARGV[3]: where ALL ended when the migration began (empty
-- on the first call), so that puts of other servers meanwhile do not keep it going. Answers {the
-- next start, that end}, or {-1} once done, after which P:schema says so and later starts skip
-- it. In slices, so that no one call holds Redis long. Best effort: a record it does not reach
-- (an older server's, during a rolling upgrade) reads its tenant from its key (read_record).
local SCHEMA = P .. ':schema'
if (tonumber(redis.call('GET', SCHEMA)) or 0) >= 2 then return {-1} end
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
if last + 1 >= stop then
  redis.call('SET', SCHEMA, '2')
  return {-1}
end
return {last + 1, stop}

-- stats: no ARGV. {queued, running, callbacks waiting, oldest queued ms ('' none), callbacks
-- failed, then per priority with jobs: priority, count}. QUEUED holds the jobs not started
-- (priority * BAND + creation), the due sets (jobs_due: JOBS_DUE and each tenant's) every job not
-- final: what is in the second and not the first runs.
local queued = redis.call('ZCARD', QUEUED)
local not_final = redis.call('ZCARD', JOBS_DUE)
for _, tenant in ipairs(redis.call('SMEMBERS', DUE_TENANTS)) do
  not_final = not_final + redis.call('ZCARD', jobs_due_of(tenant))
end
local out = {queued, math.max(0, not_final - queued), redis.call('ZCARD', CB_DUE), '',
             redis.call('ZCARD', FAILED)}
local oldest = nil
for p = 0, 9 do
  local low, high = job_score(p, 0), job_score(p + 1, 0)
  local n = redis.call('ZCOUNT', QUEUED, low, '(' .. high)
  if n > 0 then
    out[#out + 1] = p
    out[#out + 1] = n
    local first = redis.call('ZRANGEBYSCORE', QUEUED, low, '(' .. high, 'WITHSCORES', 'LIMIT', 0, 1)
    local ms = tonumber(first[2]) - p * BAND
    if not oldest or ms < oldest then oldest = ms end
  end
end
if oldest then out[4] = string.format('%.0f', oldest) end
return out

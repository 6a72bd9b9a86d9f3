-- claim: ARGV which ("jobs" or "callbacks"), now, max, holder, until. Jobs one priority band at
-- a time, 0 first.
local jobs = ARGV[2] == 'jobs'
local due = jobs and JOBS_DUE or CB_DUE
local out = {}
local max = tonumber(ARGV[4])
for p = 0, jobs and 9 or 0 do
  if #out >= 2 * max then break end
  local ids
  if jobs then
    ids = redis.call('ZRANGEBYSCORE', due, job_score(p, 0), job_score(p, ARGV[3]), 'LIMIT', 0,
                     max - #out / 2)
  else
    ids = redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[3], 'LIMIT', 0, max)
  end
  for _, id in ipairs(ids) do
    local key = job_key(id)
    -- Gone, or (callbacks) not pending: a stale member, of a job that expired and whose id was
    -- used again, say.
    if redis.call('EXISTS', key) == 0 or
       (not jobs and redis.call('HGET', key, 'cb_state') ~= 'pending') then
      redis.call('ZREM', due, id)
    else
      redis.call('ZADD', due, jobs and job_score(p, ARGV[6]) or ARGV[6], id)
      redis.call('HSET', key, 'holder', ARGV[5], 'until', ARGV[6])
      out[#out + 1] = id
      out[#out + 1] = redis.call('HGETALL', key)
    end
  end
end
return out

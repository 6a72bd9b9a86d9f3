-- renew: ARGV id, holder, until, now. 1: renewed.
local key = job_key(ARGV[O + 2])
if not holds(key, ARGV[O + 3], ARGV[O + 5]) then return 0 end
redis.call('HSET', key, 'until', ARGV[O + 4])
if is_final(redis.call('HGET', key, 'status')) then
  zadd_xx(CB_DUE, ARGV[O + 4], ARGV[O + 2])
else
  -- (Held by this claim or put: in its own set, see jobs_due.)
  zadd_xx(jobs_due(ARGV[O + 2]), job_score(job_priority(key), ARGV[O + 4]), ARGV[O + 2])
end
return 1

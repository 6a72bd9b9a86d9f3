-- complete: ARGV id, now, retention, then the outcome (5 fields), then when it finished.
local id = ARGV[2]
local key = job_key(id)
if redis.call('EXISTS', key) == 0 then return 0 end
write_outcome(key, O + 5)
redis.call('HSET', key, 'holder', '', 'until', '0', 'ended', ARGV[10])
zrem_due(id)
redis.call('ZREM', QUEUED, id)
local state = redis.call('HGET', key, 'cb_state')
if not wants_callback(key) or state == 'delivered' or state == 'failed' then
  finish(key, id, ARGV[3], ARGV[4])
end
return 1

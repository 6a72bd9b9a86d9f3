-- cancel: ARGV id, now, retention, then the outcome (5 fields), then when it finished.
-- 0: not found; 1: cancelled; 2: already final.
local id = ARGV[2]
local key = job_key(id)
local status = redis.call('HGET', key, 'status')
if not status then return 0 end
if is_final(status) then return 2 end
write_outcome(key, O + 5)
redis.call('HSET', key, 'ended', ARGV[10], 'holder', '', 'until', '0')
zrem_due(id)
redis.call('ZREM', QUEUED, id)
if not wants_callback(key) then
  finish(key, id, ARGV[3], ARGV[4])
  return 1
end
redis.call('HSET', key, 'cb_state', 'pending', 'cb_next', ARGV[3], 'cb_da', '0',
           'cb_started', ARGV[3], 'cb_prev', '0')
redis.call('ZADD', CB_DUE, ARGV[3], id)
return 1

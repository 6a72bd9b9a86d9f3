-- mark_running: ARGV id, now.
local key = job_key(ARGV[O + 2])
if redis.call('HGET', key, 'status') == 'queued' then
  redis.call('HSET', key, 'status', 'running', 'started', ARGV[O + 3])
  zrem(QUEUED, ARGV[O + 2])
end
return 1

-- queue_position: ARGV id. The jobs queued ahead, or -1 when it is not queued.
if redis.call('HGET', job_key(ARGV[2]), 'status') ~= 'queued' then return -1 end
return redis.call('ZRANK', QUEUED, ARGV[2]) or -1

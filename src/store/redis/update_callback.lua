-- update_callback: ARGV id, now, retention, then the callback (7 fields).
local id = ARGV[2]
local key = job_key(id)
if redis.call('EXISTS', key) == 0 then return 0 end
if is_final(redis.call('HGET', key, 'status')) then
  redis.call('HSET', key, 'holder', '', 'until', '0')
end
write_callback(key, id, O + 5, ARGV[3], ARGV[4])
return 1

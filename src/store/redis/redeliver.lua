-- redeliver: ARGV id, holder, until, now. 0: not found; 1: redelivered; 2: not failed.
local id = ARGV[2]
local key = job_key(id)
local f = redis.call('HMGET', key, 'created', 'cb_state')
if not f[1] then return 0 end
if f[2] ~= 'failed' then return 2 end
redis.call('HSET', key, 'cb_state', 'pending', 'cb_error', '', 'cb_next', ARGV[5], 'cb_da', '0',
           'cb_started', ARGV[5], 'cb_prev', '0', 'holder', ARGV[3], 'until', ARGV[4])
redis.call('ZADD', CB_DUE, ARGV[4], id)
failed_rem(id)
unfinish(key, id)
return 1

-- finish_job: ARGV id, holder, now, status, result, has error, code, message, deliver holder,
-- deliver until, retention, finished at, when it started ('' when mark_running said so already;
-- a batch folds a job's mark_running into its finish_job), and the version that ran it when
-- another than the stored one ('': that one), and '1' to be answered the job's hash as written.
-- 1 (or the hash): acknowledged.
local id = ARGV[O + 2]
local key = job_key(id)
local f = redis.call('HMGET', key, 'holder', 'until', 'url', 'events', 'status', 'cb_da', 'cb_prev')
-- The lease on the job itself: once final, the lease the hash holds is its callback's.
if is_final(f[5]) or not held_by(f[1], f[2], ARGV[O + 3], ARGV[O + 4]) then return 0 end
-- One write of the hash. (A job not final has no outcome yet: no error fields to drop.)
-- (The fields are appended at n: no temporary tables, which cost as much as a command here.)
local fields = {'status', ARGV[O + 5], 'result', ARGV[O + 6], 'ended', ARGV[O + 13]}
local n = 6
if ARGV[O + 14] ~= '' and f[5] == 'queued' then
  fields[n + 1], fields[n + 2] = 'started', ARGV[O + 14]; n = n + 2
end
if ARGV[O + 15] ~= '' then fields[n + 1], fields[n + 2] = 'mver', ARGV[O + 15]; n = n + 2 end
if ARGV[O + 7] == '1' then
  fields[n + 1], fields[n + 2] = 'err_code', ARGV[O + 8]
  fields[n + 3], fields[n + 4] = 'err_msg', ARGV[O + 9]
  n = n + 4
end
-- (Every sorted-set write after the hash's: see zwrite.)
local queued = f[5] == 'queued'  -- (else mark_running took it out of QUEUED)
-- Called back when there is a URL and `completed` (2) is among its events (1..3).
if not (f[3] and f[3] ~= '' and (f[4] or 2) % 4 >= 2) then
  fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = 'holder', '', 'until', '0'
  fields[n + 5], fields[n + 6] = 'finished', ARGV[O + 4]
  redis.call('HSET', key, unpack(fields))
  zrem_due(id)
  if queued then zrem(QUEUED, id) end
  zrem(UNFINISHED, id)
  if ARGV[O + 12] + 0 > 0 then redis.call('PEXPIRE', key, ARGV[O + 12]) end
  if ARGV[O + 16] == '1' then return redis.call('HGETALL', key) end
  return 1
end
fields[n + 1], fields[n + 2] = 'cb_state', 'pending'
fields[n + 3], fields[n + 4] = 'cb_next', ARGV[O + 4]
fields[n + 5], fields[n + 6] = 'cb_started', ARGV[O + 4]
n = n + 6
-- A new delivery's attempts and previous delay are 0: written only over another value (a missing
-- field reads as 0; the service writes no callback field before a job's outcome).
if f[6] and f[6] ~= '0' then fields[n + 1], fields[n + 2] = 'cb_da', '0'; n = n + 2 end
if f[7] and f[7] ~= '0' then fields[n + 1], fields[n + 2] = 'cb_prev', '0'; n = n + 2 end
local due = ARGV[O + 4]
if ARGV[O + 10] ~= '' then
  due = ARGV[O + 11]
  fields[n + 1], fields[n + 2] = 'holder', ARGV[O + 10]
  fields[n + 3], fields[n + 4] = 'until', ARGV[O + 11]
else
  fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = 'holder', '', 'until', '0'
end
redis.call('HSET', key, unpack(fields))
zrem_due(id)
if queued then zrem(QUEUED, id) end
zadd(CB_DUE, due, id)
if ARGV[O + 16] == '1' then return redis.call('HGETALL', key) end
return 1

-- record_attempt: ARGV id, holder, now, retention, then the callback (7 fields), then the attempt
-- ('' for a deferral; else one JSON object) and the most attempts kept. 1: recorded.
-- The attempt log is one field: the latest attempts, one JSON object a line, oldest first.
local id = ARGV[O + 2]
local key = job_key(id)
local f = redis.call('HMGET', key, 'holder', 'until', 'status', 'attempts', 'cb_state')
-- Only a pending callback's lease: a lease on the job itself (before its outcome) is not one.
if f[5] ~= 'pending' or not held_by(f[1], f[2], ARGV[O + 3], ARGV[O + 4]) then return 0 end
local status, log, was = f[3], f[4], f[5]
local state = ARGV[O + 6]
-- The creation time (which a given-up callback is filed by) and whether the job had finished (a
-- callback pending again makes it unfinished) only where they count: most attempts deliver, and
-- every field read is a lookup in the hash.
local created, finished = false, false
if state == 'failed' or state == 'pending' then
  local g = redis.call('HMGET', key, 'created', 'finished')
  created, finished = g[1], g[2]
end
-- One write of the hash: the lease ended, the callback's state (ARGV[O + 6 ..]), the attempt log.
-- The schedule (next attempt, delivery attempts, delivery start, previous delay) only while the
-- callback stays pending: nothing reads it once the callback ended, and a redelivery writes it
-- afresh. (Every other callback field: reading them to write only those that changed cost Redis
-- more than writing them, measured in instructions a job: docs/benchmarks.md.)
local fields = {'holder', '', 'until', '0', 'cb_state', state, 'cb_attempts', ARGV[O + 7],
                'cb_error', ARGV[O + 8]}
if state == 'pending' then
  fields[11], fields[12], fields[13], fields[14] = 'cb_next', ARGV[O + 9], 'cb_da', ARGV[O + 10]
  fields[15], fields[16] = 'cb_started', ARGV[O + 11]
  fields[17], fields[18] = 'cb_prev', ARGV[O + 12]
end
local attempt = ARGV[O + 13]
if attempt ~= '' then
  -- (An attempt is one line: its JSON is written compact, a line break in a string escaped.)
  local lines = 0
  if log and log ~= '' then
    log = log .. '\n' .. attempt
    local _, breaks = string.gsub(log, '\n', '')
    lines = breaks
  else
    log = attempt
  end
  local keep = ARGV[O + 14] + 0
  while lines + 1 > keep do
    log = string.sub(log, string.find(log, '\n', 1, true) + 1)
    lines = lines - 1
  end
  fields[#fields + 1] = 'attempts'; fields[#fields + 1] = log
end
-- (What the sets are filed by is checked before anything is written: see zwrite. The creation
-- time files a given-up callback, and a job that is unfinished again.)
if not created and (state == 'failed' or (state == 'pending' and finished and finished ~= '')) then
  error('job ' .. id .. ' has no creation time')
end
if state == 'pending' then
  redis.call('HSET', key, unpack(fields))
  zadd(CB_DUE, ARGV[O + 9], id)
  if was == 'failed' then zrem_failed(id) end
  if finished and finished ~= '' then unfinish(key, id) end
  return 1
end
local ends = is_final(status) and (state == 'delivered' or state == 'failed')
if ends then fields[#fields + 1] = 'finished'; fields[#fields + 1] = ARGV[O + 4] end
redis.call('HSET', key, unpack(fields))
zrem(CB_DUE, id)
if state == 'failed' then
  zadd_failed(created, id)
elseif was == 'failed' then
  zrem_failed(id)
end
if ends then
  zrem(UNFINISHED, id)
  if ARGV[O + 5] + 0 > 0 then redis.call('PEXPIRE', key, ARGV[O + 5]) end
end
return 1

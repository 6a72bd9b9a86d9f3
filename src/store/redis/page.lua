-- page: ARGV limit, id prefix, cursor ms ('' from the newest), cursor id, the set to walk
-- ('failed', 'unfinished' or 'jobs', each scored by creation), and the filter: status, callback
-- state, priority ('' for any). Newest first by (created, id), as the sorted set orders equal
-- scores (bytes). Reads only: stale members are skipped, not removed, so offsets stay put. Answers
-- the next cursor (ms, id; '' at the end), then (id, fields, ...) without input or result. What
-- does not match is scanned up to a bound; past it the answer is short and its cursor goes on from
-- the last entry scanned.
local limit = tonumber(ARGV[2])
local prefix = ARGV[3]
local cursor_ms, cursor_id = ARGV[4], ARGV[5]
local SET = ARGV[6] == 'failed' and FAILED or (ARGV[6] == 'unfinished' and UNFINISHED or ALL)
-- One tenant's dead letters (a prefix "tenant/..."): its own set, whatever the others hold.
if SET == FAILED then SET = failed_walked(prefix) end
local want_status, want_cb, want_priority = ARGV[7], ARGV[8], ARGV[9]
local FIELDS = {'url', 'created', 'status', 'err_code', 'err_msg', 'cb_state', 'cb_attempts',
  'cb_error', 'cb_next', 'cb_da', 'cb_started', 'cb_prev', 'priority', 'maxq', 'events', 'trace',
  'started', 'ended', 'tenant', 'model', 'mver'}
local found = {}
local offset, scanned, budget = 0, 0, 20 * limit + 1000
local last_ms, last_id = '', ''
local max = cursor_ms == '' and '+inf' or cursor_ms
while #found <= limit and scanned < budget do
  local batch = redis.call('ZREVRANGEBYSCORE', SET, max, '-inf', 'WITHSCORES', 'LIMIT', offset,
                           limit + 1)
  if #batch == 0 then last_ms = ''; break end
  offset = offset + #batch / 2
  for i = 1, #batch, 2 do
    local id, ms = batch[i], string.format('%.0f', tonumber(batch[i + 1]))
    scanned = scanned + 1
    local newer = cursor_ms ~= '' and ms == cursor_ms and not before(id, cursor_id)
    if not newer and string.sub(id, 1, #prefix) == prefix then
      local values = redis.call('HMGET', job_key(id), unpack(FIELDS))
      if values[2] and (want_status == '' or values[3] == want_status) and
         (want_cb == '' or (values[6] or 'none') == want_cb) and
         (want_priority == '' or (values[13] or '5') == want_priority) then
        local fields = {}
        for f = 1, #FIELDS do
          if values[f] then
            fields[#fields + 1] = FIELDS[f]
            fields[#fields + 1] = values[f]
          end
        end
        found[#found + 1] = {id, fields, ms}
        if #found > limit then break end
      end
    end
    if not newer then last_ms, last_id = ms, id end
    if scanned >= budget then break end
  end
end
local out = {'', ''}
if #found > limit then
  found[#found] = nil
  out[1], out[2] = found[#found][3], found[#found][1]
elseif last_ms ~= '' and scanned >= budget then
  out[1], out[2] = last_ms, last_id
end
for _, e in ipairs(found) do
  out[#out + 1] = e[1]
  out[#out + 1] = e[2]
end
return out

-- page: ARGV limit, id prefix, cursor ms ('' from the newest), cursor id, the set to walk
-- ('failed', 'unfinished' or 'jobs', each scored by creation), and the filter: status, callback
-- state, priority ('' for any). Newest first by (created, id), as the sorted set orders equal
-- scores (bytes). Reads only: stale members are skipped, not removed, so offsets stay put. Answers
-- the next cursor (ms, id; '' at the end), then (id, fields, ...) without input or result. What
-- does not match is scanned up to a bound; past it the answer is short and its cursor goes on from
-- the last entry scanned.
-- The walk starts at the first entry after the cursor, found by rank: the members of a newer
-- millisecond are counted, and those of the cursor's own millisecond, which the set orders by id,
-- are searched in halves for the first one before the cursor's id. (Skipping them one by one
-- spent the bound on entries already listed: past 1,000 jobs of one millisecond, a filtered
-- listing ended early with a cursor of '', as if nothing were left.)
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
local rank = 0
if cursor_ms ~= '' then
  rank = redis.call('ZCOUNT', SET, '(' .. cursor_ms, '+inf')
  local lo, hi = 0, redis.call('ZCOUNT', SET, cursor_ms, cursor_ms)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if before(redis.call('ZREVRANGE', SET, rank + mid, rank + mid)[1], cursor_id) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  rank = rank + lo
end
local found = {}
-- At most 20,000 entries a call whatever the limit (a library caller may ask for 100,000): one
-- script blocks Redis for every server, and a page may be short with a cursor.
local scanned, budget, ended = 0, math.min(20 * limit + 1000, 20000), false
local last_ms, last_id = '', ''
while #found <= limit and scanned < budget do
  local batch = redis.call('ZREVRANGE', SET, rank, rank + math.min(limit, budget - scanned - 1),
                           'WITHSCORES')
  if #batch == 0 then ended = true; break end
  rank = rank + #batch / 2
  for i = 1, #batch, 2 do
    local id, ms = batch[i], string.format('%.0f', tonumber(batch[i + 1]))
    scanned = scanned + 1
    if string.sub(id, 1, #prefix) == prefix then
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
    last_ms, last_id = ms, id
  end
end
local out = {'', ''}
if #found > limit then
  found[#found] = nil
  out[1], out[2] = found[#found][3], found[#found][1]
elseif not ended and last_ms ~= '' then
  out[1], out[2] = last_ms, last_id
end
for _, e in ipairs(found) do
  out[#out + 1] = e[1]
  out[#out + 1] = e[2]
end
return out

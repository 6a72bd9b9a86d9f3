-- waiting: ARGV since (ms), the versions asked about ("name version" lines), where to start among
-- the tenants (a number that each call raises). Answers those of the versions with a job nobody
-- claimed since `since` or before (FleetStore::waiting_versions): each tenant's jobs filed by
-- then, by priority, from a different tenant each call, at most 2,000 jobs and range reads in all.
local asked = {}
local left = 0
for line in string.gmatch(ARGV[3] or '', '[^\n]+') do
  if not asked[line] then
    asked[line] = true
    left = left + 1
  end
end
local out = {}
if left == 0 then return out end
local sets = {JOBS_DUE}
for _, tenant in ipairs(redis.call('SMEMBERS', DUE_TENANTS)) do
  sets[#sets + 1] = jobs_due_of(tenant)
end
local first = math.floor(tonumber(ARGV[4]) or 0) % #sets
local looked = 0
for k = 0, #sets - 1 do
  local set = sets[(first + k) % #sets + 1]
  for p = 0, 9 do
    if left == 0 or looked >= 2000 then return out end
    local ids = redis.call('ZRANGEBYSCORE', set, job_score(p, 0), job_score(p, ARGV[2]), 'LIMIT',
                           0, 2000 - looked)
    looked = looked + 1 + #ids
    for _, id in ipairs(ids) do
      local m = redis.call('HMGET', job_key(id), 'model', 'mver', 'until')
      local line = (m[1] or '') .. ' ' .. (m[2] or '')
      if m[1] and asked[line] and tonumber(m[3] or '0') <= tonumber(ARGV[2]) then
        out[#out + 1] = line
        asked[line] = nil
        left = left - 1
      end
    end
  end
end
return out

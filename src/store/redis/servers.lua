-- servers: ARGV server id ('' to only read), now, leases, retention (ms). Notes the server as seen
-- now, forgets those not seen for an hour, and answers (id, "last seen ms:leases", ...).
-- A report also sweeps ALL a little (prelude's sweep, as puts do): a store that takes no puts for
-- a while still forgets the jobs that expired, and a dead letter that expired leaves the count of
-- failed callbacks (stats.lua) instead of staying in it until the next put.
local SERVERS = P .. ':servers'
local now = tonumber(ARGV[3])
if ARGV[2] ~= '' then
  redis.call('HSET', SERVERS, ARGV[2], ARGV[3] .. ':' .. ARGV[4])
  sweep(100, ARGV[3], ARGV[5] or '0')
end
local all = redis.call('HGETALL', SERVERS)
local out = {}
for i = 1, #all, 2 do
  local seen = tonumber(string.match(all[i + 1], '^(%d+)') or '0')
  if seen < now - 3600000 then
    if ARGV[2] ~= '' then redis.call('HDEL', SERVERS, all[i]) end
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out

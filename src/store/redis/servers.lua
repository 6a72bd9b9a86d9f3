-- servers: ARGV server id ('' to only read), now, leases. Notes the server as seen now, forgets
-- those not seen for an hour, and answers (id, "last seen ms:leases", ...).
local SERVERS = P .. ':servers'
local now = tonumber(ARGV[3])
if ARGV[2] ~= '' then redis.call('HSET', SERVERS, ARGV[2], ARGV[3] .. ':' .. ARGV[4]) end
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

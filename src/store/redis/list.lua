-- list: ARGV which ("failed": most recently created first; "unfinished": oldest first), limit.
local limit = tonumber(ARGV[3])
local prefix = ARGV[4] or ''
local set = ARGV[2] == 'failed' and FAILED or UNFINISHED
-- One tenant's dead letters (a prefix "tenant/..."): its own set, whatever the others hold.
local walked = set == FAILED and failed_walked(prefix) or set
local out = {}
local start = 0
-- Another tenant's entries are skipped, up to a bound: one script blocks Redis for every server.
local scanned = 0
while #out < 2 * limit and scanned < 20 * limit + 1000 do
  local ids
  if ARGV[2] == 'failed' then
    ids = redis.call('ZREVRANGE', walked, start, start + limit - 1)
  else
    ids = redis.call('ZRANGE', walked, start, start + limit - 1)
  end
  if #ids == 0 then break end
  scanned = scanned + #ids
  local mine, skipped = ids, 0
  if prefix ~= '' then
    mine = {}
    for _, id in ipairs(ids) do
      if string.sub(id, 1, #prefix) == prefix then
        mine[#mine + 1] = id
      else
        skipped = skipped + 1
      end
    end
  end
  local had = #out
  records(set, mine, out, limit)
  -- Expired members were removed from the set: what follows moved up.
  start = start + (#out - had) / 2 + skipped
end
return out

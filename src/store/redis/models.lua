-- models: ARGV model name ('' to only read), config, the generation it must have now (0: none).
-- Writes the config with the next generation when the stored one matches; answers
-- (name, generation, config, ...) for every model, 0 when the generation differed (nothing
-- written), -1 when the store keeps as many models as it will (10,000) and this is a new one.
local CONFIGS = P .. ':models'
local GENERATIONS = P .. ':models:generation'
if ARGV[2] ~= '' then
  local now = tonumber(redis.call('HGET', GENERATIONS, ARGV[2]) or '0')
  if now ~= tonumber(ARGV[4]) then return 0 end
  if now == 0 and redis.call('HLEN', CONFIGS) >= 10000 then return -1 end
  redis.call('HSET', CONFIGS, ARGV[2], ARGV[3])
  redis.call('HSET', GENERATIONS, ARGV[2], now + 1)
end
local out = {}
local all = redis.call('HGETALL', CONFIGS)
for i = 1, #all, 2 do
  out[#out + 1] = all[i]
  out[#out + 1] = redis.call('HGET', GENERATIONS, all[i]) or '0'
  out[#out + 1] = all[i + 1]
end
return out

-- paused: ARGV origin ('' to only read), '1' pause / '0' resume. Answers every origin paused.
local PAUSED = P .. ':paused'
if ARGV[2] ~= '' then
  if ARGV[3] == '1' then
    if redis.call('SISMEMBER', PAUSED, ARGV[2]) == 0 and redis.call('SCARD', PAUSED) >= 10000 then
      return 0
    end
    redis.call('SADD', PAUSED, ARGV[2])
  else
    redis.call('SREM', PAUSED, ARGV[2])
  end
end
return redis.call('SMEMBERS', PAUSED)

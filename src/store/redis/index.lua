-- index: no ARGV. Makes ALL from the unfinished jobs and the dead letters when it does not exist.
if redis.call('EXISTS', ALL) == 0 then
  redis.call('ZUNIONSTORE', ALL, 2, UNFINISHED, FAILED, 'AGGREGATE', 'MIN')
end
return 1

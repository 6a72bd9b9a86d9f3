-- Many calls in one (RedisJobStoreOptions::batch_writes): ARGV prefix, then for each call its
-- script (a Script number), its argument count and its arguments. Each script in OPS is one above,
-- made a function of where its call's arguments are (script_text): its ARGV[O + 2] is the call's
-- first argument, dispatch.lua's ARGV[at + 2]. (Not a table of each call's arguments: making one
-- cost a few percent of a job's instructions.) Answers one reply per call, in order (an error
-- reply for a call that failed); the calls run one after another, as they would have one call
-- each.
BATCH = true
local out = {}
local at, n = 2, #ARGV
while at <= n do
  -- (OPS is keyed by the script's number as text: no conversion.)
  local op, count = ARGV[at], ARGV[at + 1] + 0
  -- A call that fails answers its error; the calls before it stand, and those after it run.
  local ok, answer = pcall(OPS[op], ARGV, at)
  if ok then
    out[#out + 1] = answer
  elseif type(answer) == 'table' and answer.err then
    out[#out + 1] = answer
  else
    out[#out + 1] = {err = tostring(answer)}
  end
  at = at + 2 + count
end
zflush()
if PUTS > 0 then sweep(2 * PUTS, PUT_NOW, PUT_RETENTION) end
return out

-- wrk script for filling a server's queue: submits jobs with fresh ids (as submit.lua) and stops
-- its thread at the first refusal, so that a full server is not also a server under a flood of
-- 503s while its memory is read. bench/run.py stops wrk once the server's counters settle.
math.randomseed(os.time())
local counter = 0
local cb = os.getenv("CALLBACK_URL") or "http://127.0.0.1:9/v1/results"
function setup(thread) thread:set("tid", tostring(math.random(1, 1e9))) end
request = function()
  counter = counter + 1
  local body = string.format('{"id":"%s-%d","callback_url":"%s"}', tid, counter, cb)
  return wrk.format("POST", "/v1/inferences", {["Content-Type"] = "application/json"}, body)
end
response = function(status, headers, body)
  if status >= 300 then wrk.thread:stop() end
end

-- put: ARGV id, url, input, created, holder, until, due, priority, max queue ms, webhook events,
-- traceparent, retention ms, then its scores (job_score, made by the caller) in jobs_due (by the
-- due time) and in QUEUED (by creation), its tenant, its model's name and version. {0}: created;
-- {1}: the same request was there; {2}: another request has the id; {3, stored input}: the same
-- but for the input's text.
local key = job_key(ARGV[O + 2])
-- (EXISTS first: most puts are of new jobs, and it costs less than reading five missing fields.)
local old = redis.call('EXISTS', key) == 1 and
            redis.call('HMGET', key, 'url', 'input', 'priority', 'maxq', 'events', 'model') or {}
if old[1] then
  -- The same request again ({1}), or another under a taken id ({2}): told apart here, so that the
  -- answer is a number whatever the size of the stored input. An input whose text differs may
  -- still be the same JSON (1 and 1.0): {3, the stored input}, for the caller to compare, only
  -- when it is not much longer than the one sent (a small request never brings back a large
  -- input; the same JSON written that differently is told a conflict).
  -- (The model's name is the request's, its version the server's choice: Job::same_request_as. A
  -- job stored with no model, by an older server, matches any.)
  local input, model = old[2] or '', old[6] or ''
  if old[1] == ARGV[O + 3] and (old[3] or '5') == ARGV[O + 9] and
     (old[4] or '0') == ARGV[O + 10] and (old[5] or '2') == ARGV[O + 11] and
     (model == ARGV[O + 17] or model == '' or ARGV[O + 17] == '') then
    if input == ARGV[O + 4] then return {1} end
    if #input <= 2 * #ARGV[O + 4] + 64 then return {3, input} end
  end
  return {2}
end
-- Priority, max queue time and events only when not at their defaults (5, 0, 2). cb_state and
-- finished at their defaults all the same: older servers on the same Redis test them.
-- The fields every transition reads come first (the lease, the status): Redis looks a field up in
-- a small hash (a listpack) by reading it from the start, and the large input last.
local fields, n
if ARGV[O + 6] ~= '' then
  fields = {'holder', ARGV[O + 6], 'until', ARGV[O + 7], 'status', 'queued', 'url', ARGV[O + 3],
            'cb_state', 'none', 'created', ARGV[O + 5], 'finished', '', 'input', ARGV[O + 4]}
  n = 16
else
  fields = {'status', 'queued', 'url', ARGV[O + 3], 'cb_state', 'none', 'created', ARGV[O + 5],
            'finished', '', 'input', ARGV[O + 4]}
  n = 12
end
if ARGV[O + 9] ~= '5' then fields[n + 1], fields[n + 2] = 'priority', ARGV[O + 9]; n = n + 2 end
if ARGV[O + 10] ~= '0' then fields[n + 1], fields[n + 2] = 'maxq', ARGV[O + 10]; n = n + 2 end
if ARGV[O + 11] ~= '2' then fields[n + 1], fields[n + 2] = 'events', ARGV[O + 11]; n = n + 2 end
if ARGV[O + 12] ~= '' then fields[n + 1], fields[n + 2] = 'trace', ARGV[O + 12]; n = n + 2 end
-- The tenant, a field of its own (the key holds it too, but nothing splits a key).
if ARGV[O + 16] ~= '' then fields[n + 1], fields[n + 2] = 'tenant', ARGV[O + 16]; n = n + 2 end
-- The model it runs on (a job submitted to an older server names none).
if ARGV[O + 17] ~= '' then fields[n + 1], fields[n + 2] = 'model', ARGV[O + 17]; n = n + 2 end
if ARGV[O + 18] ~= '' then fields[n + 1], fields[n + 2] = 'mver', ARGV[O + 18] end
redis.call('HSET', key, unpack(fields))
-- (The HSET first: Redis checks maxmemory at a script's first write, and lets the rest through.)
zadd_due(ARGV[O + 14], ARGV[O + 2])
zadd(QUEUED, ARGV[O + 15], ARGV[O + 2])
zadd(UNFINISHED, ARGV[O + 5], ARGV[O + 2])
zadd(ALL, ARGV[O + 5], ARGV[O + 2])
-- Finished jobs expire after the retention (ARGV[O + 13], ms; 0: never): ALL forgets them in a sweep
-- of two of its oldest members a put.
if BATCH then
  PUTS, PUT_NOW, PUT_RETENTION = PUTS + 1, ARGV[O + 5], ARGV[O + 13]
else
  sweep(2, ARGV[O + 5], ARGV[O + 13])
end
-- (The id of a dead letter that expired may still be in FAILED: listings and pages skip a member
-- whose job's callback is not failed, and drop it. Never in CB_DUE: a job whose callback is
-- pending does not expire.)
return {0}

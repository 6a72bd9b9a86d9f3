// RedisJobStore: one Lua script per call over a small pool of hiredis connections.
#include "rebound/store/redis_job_store.hpp"

#include <hiredis.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/attempt_log.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/error.hpp"

namespace rebound {
namespace {

using TimePoint = std::chrono::system_clock::time_point;

std::int64_t to_ms(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

TimePoint from_ms(std::int64_t ms) {
  return TimePoint(std::chrono::milliseconds(ms));
}

std::string ms_text(TimePoint t) {
  return std::to_string(to_ms(t));
}

// The score of a job filed by priority, then time (the scripts' job_score): priority * 2^42 + ms.
std::string job_score(int priority, TimePoint t) {
  // (Clamped far outside 0..9 only so that the product cannot overflow.)
  return std::to_string(
      static_cast<std::int64_t>(std::clamp(priority, -1000, 1000)) * 4398046511104LL + to_ms(t));
}

// The helpers every script starts with. ARGV[1] is the key prefix in every script (P). A script
// that kDispatch runs (batched_scripts) reads its call's arguments as ARGV[O + n], n from 2: O is
// 0 when it runs alone, and where its call's arguments start in kDispatch's ARGV when it is one
// call of many (there ARGV[O] and ARGV[O + 1] are the call's script and argument count, not the
// prefix). A helper that reads arguments itself takes their position in ARGV: O + n.
constexpr const char* kPrelude = R"lua(
local P = ARGV[1]
local JOBS_DUE = P .. ':jobs:due'
local CB_DUE = P .. ':callbacks:due'
local FAILED = P .. ':callbacks:failed'
local UNFINISHED = P .. ':unfinished'
local QUEUED = P .. ':queued'
-- Every job by creation time, for listings: trimmed past the retention as jobs are put.
local ALL = P .. ':jobs'
-- Jobs are filed in JOBS_DUE by priority, then due time: a score of priority * BAND + ms, exact in
-- a double (below 2^53) for every priority 0..9 and any time before the year 2109.
local BAND = 4398046511104
local function job_score(priority, ms) return string.format('%.0f', tonumber(priority) * BAND + tonumber(ms)) end
local function job_priority(key) return tonumber(redis.call('HGET', key, 'priority') or '5') end
-- True when the job's end is called back: a URL, and `completed` (2) among its events (1..3).
local function wants_callback(key)
  local f = redis.call('HMGET', key, 'url', 'events')
  return f[1] ~= nil and f[1] ~= false and f[1] ~= '' and tonumber(f[2] or '2') % 4 >= 2
end
local function job_key(id) return P .. ':job:' .. id end
local function is_final(status)
  return status == 'succeeded' or status == 'failed' or status == 'expired' or
         status == 'cancelled'
end
-- The lease on a job (before its outcome) or on its callback (after): held by `holder`, live.
local function held_by(holder_field, until_field, holder, now)
  -- (`+ 0` rather than tonumber: Lua 5.1's tonumber reads a text twice, and this runs at every
  -- transition.)
  return holder_field and holder_field ~= '' and holder_field == holder and
         (until_field or 0) + 0 > now + 0
end
local function holds(key, holder, now)
  local f = redis.call('HMGET', key, 'holder', 'until')
  return held_by(f[1], f[2], holder, now)
end
-- ALL forgets the jobs that expired: `count` of its oldest members looked at, from a rank kept in
-- SWEEP. A member whose job lives on (not finished, or within its retention) is stepped over; the
-- sweep starts again from the oldest at the members too young to have expired (created within
-- the retention, `now` - `retention` ms), or at the end.
local function sweep(count, now, retention)
  if tonumber(retention) <= 0 then return end
  local SWEEP = ALL .. ':sweep'
  local from = tonumber(redis.call('GET', SWEEP) or '0')
  local at = from
  local horizon = tonumber(now) - tonumber(retention)
  -- The member at `at` first: most often it is too young to have expired, and the sweep is done
  -- without fetching the others. (By rank: a score range's LIMIT offset walks the set before
  -- Redis 7.2.)
  local first = redis.call('ZRANGE', ALL, at, at, 'WITHSCORES')
  local members = {}
  if #first == 2 and tonumber(first[2]) < horizon then
    members = redis.call('ZRANGE', ALL, at, at + count - 1, 'WITHSCORES')
  end
  local restart = #members < 2 * count
  for i = 1, #members, 2 do
    if tonumber(members[i + 1]) >= horizon then restart = true; break end
    if redis.call('EXISTS', job_key(members[i])) == 0 then
      redis.call('ZREM', ALL, members[i])
      -- A dead letter that expired leaves the count of failed callbacks too.
      redis.call('ZREM', FAILED, members[i])
    else
      at = at + 1
    end
  end
  local next_at = restart and 0 or at
  if next_at ~= from then redis.call('SET', SWEEP, next_at) end
end
-- Within kDispatch: the puts of the call sweep ALL once, after them (two members a put).
local BATCH, PUTS, PUT_NOW, PUT_RETENTION = false, 0, '0', '0'
-- The sorted-set writes of the calls a kDispatch runs: gathered, and sent by zflush as one ZADD
-- and one ZREM per set (a ZADD XX too, for renewals), so that a batch of N jobs costs Redis a few
-- commands a set rather than N (each command is also an entry in the AOF). The last write of a
-- member wins, as it would have in order; zflush runs before anything reads a set (the sweep) and
-- at the end. Outside kDispatch they are written at once. Every transition writes the sets after
-- its hash, and checks what could fail before either: a call refused (its hash write at
-- maxmemory, say) has noted nothing. ZW: set -> {v = member -> score, or REMOVED; xx = member ->
-- true while its only write is a ZADD XX; m = members in order}.
local REMOVED = {}
local ZW, ZSETS = {}, {}
local function zwrite(set, id, score, xx)
  -- (A missing field, as a score, fails its call here. A text that is not a number is left to
  -- Redis: checking it here would cost more than the rest of this function, and zsend loses only
  -- that member's write.)
  if score ~= REMOVED and type(score) ~= 'string' then error('not a score: ' .. tostring(score)) end
  if not BATCH then
    if score == REMOVED then
      redis.call('ZREM', set, id)
    elseif xx then
      redis.call('ZADD', set, 'XX', score, id)
    else
      redis.call('ZADD', set, score, id)
    end
    return
  end
  local w = ZW[set]
  if not w then
    w = {v = {}, xx = {}, m = {}}
    ZW[set] = w
    ZSETS[#ZSETS + 1] = set
  end
  local was = w.v[id]
  if was == nil then
    w.m[#w.m + 1] = id
  elseif xx then
    -- XX after a removal: nothing to update; after an add: the add, with this score.
    if was ~= REMOVED then w.v[id] = score end
    return
  end
  w.v[id] = score
  w.xx[id] = xx or nil
end
local function zadd(set, score, id) zwrite(set, id, score, false) end
local function zadd_xx(set, score, id) zwrite(set, id, score, true) end
local function zrem(set, id) zwrite(set, id, REMOVED, false) end
-- (unpack passes at most a few thousand values: the members go out in slices.)
-- A slice Redis refuses (a ZADD checks every score first: one it does not take, from a job's hash
-- that something else wrote, fails them all) goes again member by member, so that only that
-- member's write is lost, not the batch's.
local function zsend(command, set, xx, values)
  local per = command == 'ZREM' and 1 or 2
  for i = 1, #values, 2000 do
    local last = math.min(i + 1999, #values)
    local answer
    if xx then
      answer = redis.pcall(command, set, 'XX', unpack(values, i, last))
    else
      answer = redis.pcall(command, set, unpack(values, i, last))
    end
    if type(answer) == 'table' and answer.err then
      for k = i, last, per do
        if xx then
          redis.pcall(command, set, 'XX', values[k], values[k + 1])
        else
          redis.pcall(command, set, unpack(values, k, k + per - 1))
        end
      end
    end
  end
end
local function zflush()
  for _, set in ipairs(ZSETS) do
    local w = ZW[set]
    local add, add_xx, rem = {}, {}, {}
    for _, id in ipairs(w.m) do
      local score = w.v[id]
      if score == REMOVED then
        rem[#rem + 1] = id
      else
        local to = w.xx[id] and add_xx or add
        to[#to + 1] = score
        to[#to + 1] = id
      end
    end
    zsend('ZREM', set, false, rem)
    zsend('ZADD', set, false, add)
    zsend('ZADD', set, true, add_xx)
  end
  ZW, ZSETS = {}, {}
end
-- Fields at their defaults are not written (a job's hash holds what it needs): a missing field
-- reads as its default here and in read_record.
-- A finished job (final, its callback delivered, given up or not wanted) expires.
local function finish(key, id, now, retention)
  zrem(UNFINISHED, id)
  redis.call('HSET', key, 'finished', now)
  if tonumber(retention) > 0 then redis.call('PEXPIRE', key, retention) end
end
local function unfinish(key, id)
  redis.call('PERSIST', key)
  redis.call('HSET', key, 'finished', '')
  zadd(UNFINISHED, redis.call('HGET', key, 'created'), id)
end
-- Writes a callback's state from ARGV[first ..] (first: O + n; state, attempts, last error, next attempt,
-- delivery attempts, delivery start, previous delay) and files the job by it.
local function write_callback(key, id, first, now, retention)
  local state = ARGV[first]
  redis.call('HSET', key, 'cb_state', state, 'cb_attempts', ARGV[first + 1],
             'cb_error', ARGV[first + 2], 'cb_next', ARGV[first + 3], 'cb_da', ARGV[first + 4],
             'cb_started', ARGV[first + 5], 'cb_prev', ARGV[first + 6])
  if state == 'pending' then
    redis.call('ZADD', CB_DUE, ARGV[first + 3], id)
    redis.call('ZREM', FAILED, id)
    local finished = redis.call('HGET', key, 'finished')
    if finished and finished ~= '' then unfinish(key, id) end
    return
  end
  redis.call('ZREM', CB_DUE, id)
  if state == 'failed' then
    redis.call('ZADD', FAILED, redis.call('HGET', key, 'created'), id)
  else
    redis.call('ZREM', FAILED, id)
  end
  if is_final(redis.call('HGET', key, 'status')) and (state == 'delivered' or state == 'failed') then
    finish(key, id, now, retention)
  end
end
-- Writes an outcome from ARGV[first ..] (first: O + n; status, result, has error, code, message).
local function write_outcome(key, first)
  redis.call('HSET', key, 'status', ARGV[first], 'result', ARGV[first + 1])
  if ARGV[first + 2] == '1' then
    redis.call('HSET', key, 'err_code', ARGV[first + 3], 'err_msg', ARGV[first + 4])
  else
    redis.call('HDEL', key, 'err_code', 'err_msg')
  end
end
-- Records (id, fields, id, fields, ...) of the members `ids`, dropping those that expired.
local function records(set, ids, out, limit)
  for _, id in ipairs(ids) do
    if #out >= 2 * limit then return end
    local fields = redis.call('HGETALL', job_key(id))
    if #fields == 0 or (set == FAILED and redis.call('HGET', job_key(id), 'cb_state') ~= 'failed') then
      redis.call('ZREM', set, id)
    else
      out[#out + 1] = id
      out[#out + 1] = fields
    end
  end
end
)lua";

// put: ARGV id, url, input, created, holder, until, due, priority, max queue ms, webhook events,
// traceparent, retention ms, then its scores (job_score, made by the caller) in JOBS_DUE (by the
// due time) and in QUEUED (by creation). {0}: created; {1}: the same request was there; {2}:
// another request has the id; {3, stored input}: the same but for the input's text.
constexpr const char* kPut = R"lua(
local key = job_key(ARGV[O + 2])
-- (EXISTS first: most puts are of new jobs, and it costs less than reading five missing fields.)
local old = redis.call('EXISTS', key) == 1 and
            redis.call('HMGET', key, 'url', 'input', 'priority', 'maxq', 'events') or {}
if old[1] then
  -- The same request again ({1}), or another under a taken id ({2}): told apart here, so that the
  -- answer is a number whatever the size of the stored input. An input whose text differs may
  -- still be the same JSON (1 and 1.0): {3, the stored input}, for the caller to compare, only
  -- when it is not much longer than the one sent (a small request never brings back a large
  -- input; the same JSON written that differently is told a conflict).
  local input = old[2] or ''
  if old[1] == ARGV[O + 3] and (old[3] or '5') == ARGV[O + 9] and
     (old[4] or '0') == ARGV[O + 10] and (old[5] or '2') == ARGV[O + 11] then
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
if ARGV[O + 16] ~= '' then fields[n + 1], fields[n + 2] = 'tenant', ARGV[O + 16] end
redis.call('HSET', key, unpack(fields))
-- (The HSET first: Redis checks maxmemory at a script's first write, and lets the rest through.)
zadd(JOBS_DUE, ARGV[O + 14], ARGV[O + 2])
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
)lua";

// claim: ARGV which ("jobs" or "callbacks"), now, max, holder, until. Jobs one priority band at
// a time, 0 first.
constexpr const char* kClaim = R"lua(
local jobs = ARGV[2] == 'jobs'
local due = jobs and JOBS_DUE or CB_DUE
local out = {}
local max = tonumber(ARGV[4])
for p = 0, jobs and 9 or 0 do
  if #out >= 2 * max then break end
  local ids
  if jobs then
    ids = redis.call('ZRANGEBYSCORE', due, job_score(p, 0), job_score(p, ARGV[3]), 'LIMIT', 0,
                     max - #out / 2)
  else
    ids = redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[3], 'LIMIT', 0, max)
  end
  for _, id in ipairs(ids) do
    local key = job_key(id)
    -- Gone, or (callbacks) not pending: a stale member, of a job that expired and whose id was
    -- used again, say.
    if redis.call('EXISTS', key) == 0 or
       (not jobs and redis.call('HGET', key, 'cb_state') ~= 'pending') then
      redis.call('ZREM', due, id)
    else
      redis.call('ZADD', due, jobs and job_score(p, ARGV[6]) or ARGV[6], id)
      redis.call('HSET', key, 'holder', ARGV[5], 'until', ARGV[6])
      out[#out + 1] = id
      out[#out + 1] = redis.call('HGETALL', key)
    end
  end
end
return out
)lua";

// renew: ARGV id, holder, until, now. 1: renewed.
constexpr const char* kRenew = R"lua(
local key = job_key(ARGV[O + 2])
if not holds(key, ARGV[O + 3], ARGV[O + 5]) then return 0 end
redis.call('HSET', key, 'until', ARGV[O + 4])
if is_final(redis.call('HGET', key, 'status')) then
  zadd_xx(CB_DUE, ARGV[O + 4], ARGV[O + 2])
else
  zadd_xx(JOBS_DUE, job_score(job_priority(key), ARGV[O + 4]), ARGV[O + 2])
end
return 1
)lua";

// mark_running: ARGV id, now.
constexpr const char* kMarkRunning = R"lua(
local key = job_key(ARGV[O + 2])
if redis.call('HGET', key, 'status') == 'queued' then
  redis.call('HSET', key, 'status', 'running', 'started', ARGV[O + 3])
  zrem(QUEUED, ARGV[O + 2])
end
return 1
)lua";

// queue_position: ARGV id. The jobs queued ahead, or -1 when it is not queued.
constexpr const char* kQueuePosition = R"lua(
if redis.call('HGET', job_key(ARGV[2]), 'status') ~= 'queued' then return -1 end
return redis.call('ZRANK', QUEUED, ARGV[2]) or -1
)lua";

// finish_job: ARGV id, holder, now, status, result, has error, code, message, deliver holder,
// deliver until, retention, finished at, and when it started ('' when mark_running said so
// already; a batch folds a job's mark_running into its finish_job). 1: acknowledged.
constexpr const char* kFinish = R"lua(
local id = ARGV[O + 2]
local key = job_key(id)
local f = redis.call('HMGET', key, 'holder', 'until', 'url', 'events', 'status', 'cb_da', 'cb_prev')
if not held_by(f[1], f[2], ARGV[O + 3], ARGV[O + 4]) then return 0 end
-- One write of the hash. (A job under a live lease has no outcome yet: no error fields to drop.)
-- (The fields are appended at n: no temporary tables, which cost as much as a command here.)
local fields = {'status', ARGV[O + 5], 'result', ARGV[O + 6], 'ended', ARGV[O + 13]}
local n = 6
if ARGV[O + 14] ~= '' and f[5] == 'queued' then
  fields[n + 1], fields[n + 2] = 'started', ARGV[O + 14]; n = n + 2
end
if ARGV[O + 7] == '1' then
  fields[n + 1], fields[n + 2] = 'err_code', ARGV[O + 8]
  fields[n + 3], fields[n + 4] = 'err_msg', ARGV[O + 9]
  n = n + 4
end
-- (Every sorted-set write after the hash's: see zwrite.)
local queued = f[5] == 'queued'  -- (else mark_running took it out of QUEUED)
-- Called back when there is a URL and `completed` (2) is among its events (1..3).
if not (f[3] and f[3] ~= '' and (f[4] or 2) % 4 >= 2) then
  fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = 'holder', '', 'until', '0'
  fields[n + 5], fields[n + 6] = 'finished', ARGV[O + 4]
  redis.call('HSET', key, unpack(fields))
  zrem(JOBS_DUE, id)
  if queued then zrem(QUEUED, id) end
  zrem(UNFINISHED, id)
  if ARGV[O + 12] + 0 > 0 then redis.call('PEXPIRE', key, ARGV[O + 12]) end
  return 1
end
fields[n + 1], fields[n + 2] = 'cb_state', 'pending'
fields[n + 3], fields[n + 4] = 'cb_next', ARGV[O + 4]
fields[n + 5], fields[n + 6] = 'cb_started', ARGV[O + 4]
n = n + 6
-- A new delivery's attempts and previous delay are 0: written only over another value (a missing
-- field reads as 0; the service writes no callback field before a job's outcome).
if f[6] and f[6] ~= '0' then fields[n + 1], fields[n + 2] = 'cb_da', '0'; n = n + 2 end
if f[7] and f[7] ~= '0' then fields[n + 1], fields[n + 2] = 'cb_prev', '0'; n = n + 2 end
local due = ARGV[O + 4]
if ARGV[O + 10] ~= '' then
  due = ARGV[O + 11]
  fields[n + 1], fields[n + 2] = 'holder', ARGV[O + 10]
  fields[n + 3], fields[n + 4] = 'until', ARGV[O + 11]
else
  fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = 'holder', '', 'until', '0'
end
redis.call('HSET', key, unpack(fields))
zrem(JOBS_DUE, id)
if queued then zrem(QUEUED, id) end
zadd(CB_DUE, due, id)
return 1
)lua";

// cancel: ARGV id, now, retention, then the outcome (5 fields), then when it finished.
// 0: not found; 1: cancelled; 2: already final.
constexpr const char* kCancel = R"lua(
local id = ARGV[2]
local key = job_key(id)
local status = redis.call('HGET', key, 'status')
if not status then return 0 end
if is_final(status) then return 2 end
write_outcome(key, O + 5)
redis.call('HSET', key, 'ended', ARGV[10], 'holder', '', 'until', '0')
redis.call('ZREM', JOBS_DUE, id)
redis.call('ZREM', QUEUED, id)
if not wants_callback(key) then
  finish(key, id, ARGV[3], ARGV[4])
  return 1
end
redis.call('HSET', key, 'cb_state', 'pending', 'cb_next', ARGV[3], 'cb_da', '0',
           'cb_started', ARGV[3], 'cb_prev', '0')
redis.call('ZADD', CB_DUE, ARGV[3], id)
return 1
)lua";

// record_attempt: ARGV id, holder, now, retention, then the callback (7 fields), then the attempt
// ('' for a deferral; else one JSON object) and the most attempts kept. 1: recorded.
// The attempt log is one field: the latest attempts, one JSON object a line, oldest first.
constexpr const char* kRecordAttempt = R"lua(
local id = ARGV[O + 2]
local key = job_key(id)
local f = redis.call('HMGET', key, 'holder', 'until', 'status', 'attempts', 'cb_state')
if not held_by(f[1], f[2], ARGV[O + 3], ARGV[O + 4]) then return 0 end
local status, log, was = f[3], f[4], f[5]
local state = ARGV[O + 6]
-- The creation time (which a given-up callback is filed by) and whether the job had finished (a
-- callback pending again makes it unfinished) only where they count: most attempts deliver, and
-- every field read is a lookup in the hash.
local created, finished = false, false
if state == 'failed' or state == 'pending' then
  local g = redis.call('HMGET', key, 'created', 'finished')
  created, finished = g[1], g[2]
end
-- One write of the hash: the lease ended, the callback's state (ARGV[O + 6 ..]), the attempt log.
-- The schedule (next attempt, delivery attempts, delivery start, previous delay) only while the
-- callback stays pending: nothing reads it once the callback ended, and a redelivery writes it
-- afresh. (Every other callback field: reading them to write only those that changed cost Redis
-- more than writing them, measured in instructions a job: docs/benchmarks.md.)
local fields = {'holder', '', 'until', '0', 'cb_state', state, 'cb_attempts', ARGV[O + 7],
                'cb_error', ARGV[O + 8]}
if state == 'pending' then
  fields[11], fields[12], fields[13], fields[14] = 'cb_next', ARGV[O + 9], 'cb_da', ARGV[O + 10]
  fields[15], fields[16] = 'cb_started', ARGV[O + 11]
  fields[17], fields[18] = 'cb_prev', ARGV[O + 12]
end
local attempt = ARGV[O + 13]
if attempt ~= '' then
  -- (An attempt is one line: its JSON is written compact, a line break in a string escaped.)
  local lines = 0
  if log and log ~= '' then
    log = log .. '\n' .. attempt
    local _, breaks = string.gsub(log, '\n', '')
    lines = breaks
  else
    log = attempt
  end
  local keep = ARGV[O + 14] + 0
  while lines + 1 > keep do
    log = string.sub(log, string.find(log, '\n', 1, true) + 1)
    lines = lines - 1
  end
  fields[#fields + 1] = 'attempts'; fields[#fields + 1] = log
end
-- (What the sets are filed by is checked before anything is written: see zwrite. The creation
-- time files a given-up callback, and a job that is unfinished again.)
if not created and (state == 'failed' or (state == 'pending' and finished and finished ~= '')) then
  error('job ' .. id .. ' has no creation time')
end
if state == 'pending' then
  redis.call('HSET', key, unpack(fields))
  zadd(CB_DUE, ARGV[O + 9], id)
  if was == 'failed' then zrem(FAILED, id) end
  if finished and finished ~= '' then unfinish(key, id) end
  return 1
end
local ends = is_final(status) and (state == 'delivered' or state == 'failed')
if ends then fields[#fields + 1] = 'finished'; fields[#fields + 1] = ARGV[O + 4] end
redis.call('HSET', key, unpack(fields))
zrem(CB_DUE, id)
if state == 'failed' then
  zadd(FAILED, created, id)
elseif was == 'failed' then
  zrem(FAILED, id)
end
if ends then
  zrem(UNFINISHED, id)
  if ARGV[O + 5] + 0 > 0 then redis.call('PEXPIRE', key, ARGV[O + 5]) end
end
return 1
)lua";

// redeliver: ARGV id, holder, until, now. 0: not found; 1: redelivered; 2: not failed.
constexpr const char* kRedeliver = R"lua(
local id = ARGV[2]
local key = job_key(id)
local f = redis.call('HMGET', key, 'created', 'cb_state')
if not f[1] then return 0 end
if f[2] ~= 'failed' then return 2 end
redis.call('HSET', key, 'cb_state', 'pending', 'cb_error', '', 'cb_next', ARGV[5], 'cb_da', '0',
           'cb_started', ARGV[5], 'cb_prev', '0', 'holder', ARGV[3], 'until', ARGV[4])
redis.call('ZADD', CB_DUE, ARGV[4], id)
redis.call('ZREM', FAILED, id)
unfinish(key, id)
return 1
)lua";

// complete: ARGV id, now, retention, then the outcome (5 fields), then when it finished.
constexpr const char* kComplete = R"lua(
local id = ARGV[2]
local key = job_key(id)
if redis.call('EXISTS', key) == 0 then return 0 end
write_outcome(key, O + 5)
redis.call('HSET', key, 'holder', '', 'until', '0', 'ended', ARGV[10])
redis.call('ZREM', JOBS_DUE, id)
redis.call('ZREM', QUEUED, id)
local state = redis.call('HGET', key, 'cb_state')
if not wants_callback(key) or state == 'delivered' or state == 'failed' then
  finish(key, id, ARGV[3], ARGV[4])
end
return 1
)lua";

// update_callback: ARGV id, now, retention, then the callback (7 fields).
constexpr const char* kUpdateCallback = R"lua(
local id = ARGV[2]
local key = job_key(id)
if redis.call('EXISTS', key) == 0 then return 0 end
if is_final(redis.call('HGET', key, 'status')) then
  redis.call('HSET', key, 'holder', '', 'until', '0')
end
write_callback(key, id, O + 5, ARGV[3], ARGV[4])
return 1
)lua";

// list: ARGV which ("failed": most recently created first; "unfinished": oldest first), limit.
constexpr const char* kList = R"lua(
local limit = tonumber(ARGV[3])
local prefix = ARGV[4] or ''
local set = ARGV[2] == 'failed' and FAILED or UNFINISHED
local out = {}
local start = 0
-- Another tenant's entries are skipped, up to a bound: one script blocks Redis for every server.
local scanned = 0
while #out < 2 * limit and scanned < 20 * limit + 1000 do
  local ids
  if ARGV[2] == 'failed' then
    ids = redis.call('ZREVRANGE', set, start, start + limit - 1)
  else
    ids = redis.call('ZRANGE', set, start, start + limit - 1)
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
  local before = #out
  records(set, mine, out, limit)
  -- Expired members were removed from the set: what follows moved up.
  start = start + (#out - before) / 2 + skipped
end
return out
)lua";

// page: ARGV limit, id prefix, cursor ms ('' from the newest), cursor id, the set to walk
// ('failed', 'unfinished' or 'jobs', each scored by creation), and the filter: status, callback
// state, priority ('' for any). Newest first by (created, id), as the sorted set orders equal
// scores (bytes). Reads only: stale members are skipped, not removed, so offsets stay put. Answers
// the next cursor (ms, id; '' at the end), then (id, fields, ...) without input or result. What
// does not match is scanned up to a bound; past it the answer is short and its cursor goes on from
// the last entry scanned.
constexpr const char* kPage = R"lua(
local limit = tonumber(ARGV[2])
local prefix = ARGV[3]
local cursor_ms, cursor_id = ARGV[4], ARGV[5]
local SET = ARGV[6] == 'failed' and FAILED or (ARGV[6] == 'unfinished' and UNFINISHED or ALL)
local want_status, want_cb, want_priority = ARGV[7], ARGV[8], ARGV[9]
local FIELDS = {'url', 'created', 'status', 'err_code', 'err_msg', 'cb_state', 'cb_attempts',
  'cb_error', 'cb_next', 'cb_da', 'cb_started', 'cb_prev', 'priority', 'maxq', 'events', 'trace',
  'started', 'ended', 'tenant'}
-- Byte order, as the sorted set compares members (Lua's '<' follows the locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local found = {}
local offset, scanned, budget = 0, 0, 20 * limit + 1000
local last_ms, last_id = '', ''
local max = cursor_ms == '' and '+inf' or cursor_ms
while #found <= limit and scanned < budget do
  local batch = redis.call('ZREVRANGEBYSCORE', SET, max, '-inf', 'WITHSCORES', 'LIMIT', offset,
                           limit + 1)
  if #batch == 0 then last_ms = ''; break end
  offset = offset + #batch / 2
  for i = 1, #batch, 2 do
    local id, ms = batch[i], string.format('%.0f', tonumber(batch[i + 1]))
    scanned = scanned + 1
    local newer = cursor_ms ~= '' and ms == cursor_ms and not before(id, cursor_id)
    if not newer and string.sub(id, 1, #prefix) == prefix then
      local values = redis.call('HMGET', job_key(id), unpack(FIELDS))
      if values[2] and (want_status == '' or values[3] == want_status) and
         (want_cb == '' or (values[6] or 'none') == want_cb) and
         (want_priority == '' or (values[13] or '5') == want_priority) then
        local fields = {}
        for f = 1, #FIELDS do
          if values[f] then
            fields[#fields + 1] = FIELDS[f]
            fields[#fields + 1] = values[f]
          end
        end
        found[#found + 1] = {id, fields, ms}
        if #found > limit then break end
      end
    end
    if not newer then last_ms, last_id = ms, id end
    if scanned >= budget then break end
  end
end
local out = {'', ''}
if #found > limit then
  found[#found] = nil
  out[1], out[2] = found[#found][3], found[#found][1]
elseif last_ms ~= '' and scanned >= budget then
  out[1], out[2] = last_ms, last_id
end
for _, e in ipairs(found) do
  out[#out + 1] = e[1]
  out[#out + 1] = e[2]
end
return out
)lua";

// stats: no ARGV. {queued, running, callbacks waiting, oldest queued ms ('' none), callbacks
// failed, then per priority with jobs: priority, count}. QUEUED holds the jobs not started
// (priority * BAND + creation), JOBS_DUE every job not final: what is in the second and not the
// first runs.
constexpr const char* kStats = R"lua(
local queued = redis.call('ZCARD', QUEUED)
local out = {queued, math.max(0, redis.call('ZCARD', JOBS_DUE) - queued), redis.call('ZCARD', CB_DUE), '',
             redis.call('ZCARD', FAILED)}
local oldest = nil
for p = 0, 9 do
  local low, high = job_score(p, 0), job_score(p + 1, 0)
  local n = redis.call('ZCOUNT', QUEUED, low, '(' .. high)
  if n > 0 then
    out[#out + 1] = p
    out[#out + 1] = n
    local first = redis.call('ZRANGEBYSCORE', QUEUED, low, '(' .. high, 'WITHSCORES', 'LIMIT', 0, 1)
    local ms = tonumber(first[2]) - p * BAND
    if not oldest or ms < oldest then oldest = ms end
  end
end
if oldest then out[4] = string.format('%.0f', oldest) end
return out
)lua";

// servers: ARGV server id ('' to only read), now, leases. Notes the server as seen now, forgets
// those not seen for an hour, and answers (id, "last seen ms:leases", ...).
constexpr const char* kServers = R"lua(
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
)lua";

// paused: ARGV origin ('' to only read), '1' pause / '0' resume. Answers every origin paused.
constexpr const char* kPaused = R"lua(
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
)lua";

// index: no ARGV. Makes ALL from the unfinished jobs and the dead letters when it does not exist.
constexpr const char* kIndex = R"lua(
if redis.call('EXISTS', ALL) == 0 then
  redis.call('ZUNIONSTORE', ALL, 2, UNFINISHED, FAILED, 'AGGREGATE', 'MIN')
end
return 1
)lua";

// A store written before the tenant was a field of its own: from ARGV[2] on, the next 1,000 jobs
// of ALL get a 'tenant' field from their key ("tenant/id": tenant names and ids hold no '/'),
// where their hash exists and has none. ARGV[3]: where ALL ended when the migration began (empty
// on the first call), so that puts of other servers meanwhile do not keep it going. Answers {the
// next start, that end}, or {-1} once done, after which P:schema says so and later starts skip
// it. In slices, so that no one call holds Redis long. Best effort: a record it does not reach
// (an older server's, during a rolling upgrade) reads its tenant from its key (read_record).
constexpr const char* kTenants = R"lua(
local SCHEMA = P .. ':schema'
if (tonumber(redis.call('GET', SCHEMA)) or 0) >= 2 then return {-1} end
local from = tonumber(ARGV[2])
local stop = tonumber(ARGV[3]) or redis.call('ZCARD', ALL)
local last = math.min(from + 999, stop - 1)
if last >= from then
  for _, id in ipairs(redis.call('ZRANGE', ALL, from, last)) do
    local slash = string.find(id, '/', 1, true)
    local key = job_key(id)
    if slash and slash > 1 and redis.call('EXISTS', key) == 1 then
      redis.call('HSETNX', key, 'tenant', string.sub(id, 1, slash - 1))
    end
  end
end
if last + 1 >= stop then
  redis.call('SET', SCHEMA, '2')
  return {-1}
end
return {last + 1, stop}
)lua";

// Many calls in one (RedisJobStoreOptions::batch_writes): ARGV prefix, then for each call its
// script (a Script number), its argument count and its arguments. Each script in OPS is one above,
// made a function of where its call's arguments are (script_text): its ARGV[O + 2] is the call's
// first argument, kDispatch's ARGV[at + 2]. (Not a table of each call's arguments: making one
// cost a few percent of a job's instructions.) Answers one reply per call, in order (an error
// reply for a call that failed); the calls run one after another, as they would have one call
// each.
constexpr const char* kDispatch = R"lua(
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
)lua";

enum Script : std::size_t {
  kScriptPut,
  kScriptClaim,
  kScriptRenew,
  kScriptMarkRunning,
  kScriptFinish,
  kScriptRecordAttempt,
  kScriptRedeliver,
  kScriptComplete,
  kScriptUpdateCallback,
  kScriptList,
  kScriptQueuePosition,
  kScriptCancel,
  kScriptPage,
  kScriptStats,
  kScriptServers,
  kScriptPaused,
  kScriptIndex,
  kScriptTenants,
  // kDispatch over kScriptPut only (which is refused at maxmemory), and over the other writes
  // that many callers make at once.
  kScriptBatchPut,
  kScriptBatch,
  kScriptCount,
};

constexpr std::size_t kStandaloneCount = kScriptBatchPut;

constexpr std::array<const char*, kStandaloneCount> kScripts = {
    kPut,       kClaim,    kRenew,          kMarkRunning, kFinish,        kRecordAttempt,
    kRedeliver, kComplete, kUpdateCallback, kList,        kQueuePosition, kCancel,
    kPage,      kStats,    kServers,        kPaused,      kIndex,         kTenants};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

std::string_view text(const redisReply* r) {
  if (!r || !r->str) return {};
  return std::string_view(r->str, r->len);
}

// A connection-level failure (I/O, timeout, protocol): the connection is given up.
struct ConnectionLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An error reply from Redis; the connection is fine.
struct ErrorReply : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Redis at its maxmemory (with noeviction) refused a put: the store is full, not broken.
struct OutOfMemory : StoreUnavailable {
  using StoreUnavailable::StoreUnavailable;
};

const char* to_text(JobStatus s) {
  switch (s) {
    case JobStatus::queued:
      return "queued";
    case JobStatus::running:
      return "running";
    case JobStatus::succeeded:
      return "succeeded";
    case JobStatus::failed:
      return "failed";
    case JobStatus::expired:
      return "expired";
    case JobStatus::cancelled:
      return "cancelled";
  }
  return "failed";
}

JobStatus status_from(std::string_view s) {
  if (s == "queued") return JobStatus::queued;
  if (s == "running") return JobStatus::running;
  if (s == "succeeded") return JobStatus::succeeded;
  if (s == "expired") return JobStatus::expired;
  if (s == "cancelled") return JobStatus::cancelled;
  return JobStatus::failed;
}

const char* to_text(CallbackState s) {
  switch (s) {
    case CallbackState::none:
      return "none";
    case CallbackState::pending:
      return "pending";
    case CallbackState::delivered:
      return "delivered";
    case CallbackState::failed:
      return "failed";
  }
  return "none";
}

CallbackState callback_state_from(std::string_view s) {
  if (s == "pending") return CallbackState::pending;
  if (s == "delivered") return CallbackState::delivered;
  if (s == "failed") return CallbackState::failed;
  return CallbackState::none;
}

std::int64_t number(std::string_view s) {
  std::int64_t out = 0;
  bool negative = !s.empty() && s.front() == '-';
  if (negative) s.remove_prefix(1);
  for (char c : s) {
    if (c < '0' || c > '9') break;
    out = out * 10 + (c - '0');
  }
  return negative ? -out : out;
}

// What Redis holds is what this store wrote, but a shared Redis is not trusted to be well formed:
// depth and cost are bounded as for a request; anything else reads as null.
nlohmann::json parse_json(std::string_view s) {
  nlohmann::json out;
  if (s.empty() || detail::parse_untrusted_json(s, out, SIZE_MAX) != detail::JsonParseError::none) {
    return nullptr;
  }
  return out;
}

// A job's hash (field, value, ...) as a record.
JobRecord read_record(std::string_view id, const redisReply* fields) {
  JobRecord r;
  r.job.id = std::string(id);
  if (!fields || fields->type != REDIS_REPLY_ARRAY) return r;
  std::optional<std::string> err_code, err_msg;
  bool has_tenant = false;
  for (std::size_t i = 0; i + 1 < fields->elements; i += 2) {
    const std::string_view name = text(fields->element[i]);
    const std::string_view value = text(fields->element[i + 1]);
    if (name == "url") {
      r.job.callback_url = std::string(value);
    } else if (name == "input") {
      r.job.input = parse_json(value);
    } else if (name == "created") {
      r.job.created_at = from_ms(number(value));
    } else if (name == "status") {
      r.status = status_from(value);
    } else if (name == "result") {
      r.outcome.result = parse_json(value);
    } else if (name == "err_code") {
      err_code = std::string(value);
    } else if (name == "err_msg") {
      err_msg = std::string(value);
    } else if (name == "cb_state") {
      r.callback.state = callback_state_from(value);
    } else if (name == "cb_attempts") {
      r.callback.attempts = static_cast<int>(number(value));
    } else if (name == "cb_error") {
      r.callback.last_error = std::string(value);
    } else if (name == "cb_next") {
      r.callback.next_attempt_at = from_ms(number(value));
    } else if (name == "cb_da") {
      r.callback.delivery_attempts = static_cast<int>(number(value));
    } else if (name == "cb_started") {
      r.callback.delivery_started_at = from_ms(number(value));
    } else if (name == "cb_prev") {
      r.callback.previous_delay = std::chrono::milliseconds(number(value));
    } else if (name == "priority") {
      r.job.priority = static_cast<int>(number(value));
    } else if (name == "maxq") {
      r.job.max_queue = std::chrono::milliseconds(number(value));
    } else if (name == "events") {
      r.job.webhook_events = static_cast<std::uint8_t>(number(value));
    } else if (name == "trace") {
      r.job.traceparent = std::string(value);
    } else if (name == "tenant") {
      r.job.tenant = std::string(value);
      has_tenant = true;
    } else if (name == "started") {
      r.started_at = from_ms(number(value));
    } else if (name == "ended") {
      r.outcome.finished_at = from_ms(number(value));
    } else if (name == "attempts") {
      // One JSON object a line (kRecordAttempt): read as the array the durable stores share.
      std::string array = "[";
      for (const char c : value)
        array += c == '\n' ? ',' : c;
      r.attempt_log = detail::attempt_log_from_json(array + "]");
    }
  }
  if (r.status != JobStatus::succeeded) r.outcome.result = nullptr;
  if (err_code) r.outcome.error = ErrorInfo{*err_code, err_msg.value_or("")};
  if (!has_tenant) {
    // Written before the tenant was a field (an older build, or not reached yet by kTenants):
    // its key is all there is to say whose job it is.
    const auto slash = r.job.id.find('/');
    if (slash != std::string::npos && slash > 0) r.job.tenant = r.job.id.substr(0, slash);
  }
  if (!r.job.tenant.empty()) r.job.id = std::string(id_in_key(r.job.id, r.job.tenant));
  return r;
}

// A script's 1 (held, renewed, recorded).
bool is_one(const redisReply* r) {
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

// (id, fields, id, fields, ...) as records.
std::vector<JobRecord> read_records(const redisReply* r) {
  std::vector<JobRecord> out;
  if (!r || r->type != REDIS_REPLY_ARRAY) return out;
  out.reserve(r->elements / 2);
  for (std::size_t i = 0; i + 1 < r->elements; i += 2)
    out.push_back(read_record(text(r->element[i]), r->element[i + 1]));
  return out;
}

void append_outcome(std::vector<std::string>& args, const JobOutcome& outcome) {
  args.push_back(to_text(outcome.status));
  args.push_back(outcome.status == JobStatus::succeeded ? detail::dump_json(outcome.result) : "");
  args.push_back(outcome.error ? "1" : "0");
  args.push_back(outcome.error ? outcome.error->code : "");
  args.push_back(outcome.error ? outcome.error->message : "");
}

void append_callback(std::vector<std::string>& args, const CallbackInfo& cb) {
  args.push_back(to_text(cb.state));
  args.push_back(std::to_string(cb.attempts));
  args.push_back(cb.last_error);
  args.push_back(ms_text(cb.next_attempt_at));
  args.push_back(std::to_string(cb.delivery_attempts));
  args.push_back(ms_text(cb.delivery_started_at));
  args.push_back(std::to_string(cb.previous_delay.count()));
}

}  // namespace

RedisJobStoreOptions parse_redis_uri(std::string_view uri, RedisJobStoreOptions options) {
  const std::string whole(uri);
  constexpr std::string_view scheme = "redis://";
  if (uri.substr(0, scheme.size()) != scheme) {
    throw Error("redis store: '" + whole + "' is not redis://host[:port][/db]");
  }
  uri.remove_prefix(scheme.size());
  const auto slash = uri.find('/');
  std::string_view authority = uri.substr(0, slash);
  if (slash != std::string_view::npos) {
    const std::string_view db = uri.substr(slash + 1);
    if (db.empty() || db.size() > 5 ||
        !std::all_of(db.begin(), db.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      throw Error("redis store: the database in '" + whole + "' must be a number");
    }
    options.db = static_cast<int>(number(db));
  }
  const auto at = authority.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view user = authority.substr(0, at);
    if (user.find(':') != std::string_view::npos) {
      throw Error(
          "redis store: no password in the URI (it would show in the process list): give it in "
          "REBOUND_REDIS_PASSWORD");
    }
    options.username = std::string(user);
    authority.remove_prefix(at + 1);
  }
  std::string_view host = authority, port;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos)
      throw Error("redis store: bad IPv6 host in '" + whole + "'");
    host = authority.substr(1, close - 1);
    const std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw Error("redis store: bad host in '" + whole + "'");
      port = rest.substr(1);
    }
  } else if (const auto colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) throw Error("redis store: no host in '" + whole + "'");
  if (authority.front() != '[' && host.find(':') != std::string_view::npos) {
    throw Error("redis store: an IPv6 host goes in brackets: redis://[::1]:6379");
  }
  options.host = std::string(host);
  if (!port.empty() || authority.back() == ':') {
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        number(port) < 1 || number(port) > 65535) {
      throw Error("redis store: bad port in '" + whole + "'");
    }
    options.port = static_cast<int>(number(port));
  }
  return options;
}

// Error replies that say the server cannot serve this connection now (restarting, a replica, an
// authentication lost): the connection is dropped, and a new one may reach a new primary.
bool connection_state_error(const char* what) {
  for (const char* prefix : {"LOADING", "READONLY", "MASTERDOWN", "NOAUTH", "NOPERM"}) {
    if (std::strncmp(what, prefix, std::strlen(prefix)) == 0) return true;
  }
  return false;
}

// At maxmemory with noeviction; Redis before 7 wraps it in a script error.
bool out_of_memory_error(const char* what) {
  return std::strncmp(what, "OOM", 3) == 0 || std::strstr(what, "OOM command not allowed");
}

struct RedisJobStore::Impl {
  RedisJobStoreOptions options;
  std::array<std::string, kScriptCount> shas;  // written by the constructor only
  // Redis 7 runs scripts marked allow-oom at maxmemory: only a put is refused when it is full,
  // so the work already accepted can finish and free memory. (Set by the constructor.)
  bool allow_oom = false;
  std::atomic<bool> probing{false};

  // The pool: idle connections, and how many are open (idle or in use).
  std::mutex pool_mutex;
  std::condition_variable pool_returned;
  std::vector<Context> idle;
  std::size_t open = 0;

  // Why the store fails, while it does; new connections wait for `reconnect_at`.
  mutable std::mutex failure_mutex;
  std::string failure;
  std::chrono::steady_clock::time_point reconnect_at{};
  std::chrono::milliseconds reconnect_delay{0};
  std::atomic<bool> failing{false};

  // Calls waiting for Redis now, and when Redis last answered one (steady clock, ms): a Redis
  // that stopped answering (frozen, or cut off by a firewall) is seen within `unanswered_limit`,
  // long before a command times out.
  std::atomic<int> waiting_calls{0};
  std::atomic<std::int64_t> last_answer_ms{steady_ms()};

  static std::int64_t steady_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // How long calls have been waiting without any answer from Redis; 0 while none waits.
  std::chrono::milliseconds unanswered_for() const {
    if (waiting_calls.load(std::memory_order_relaxed) == 0) return std::chrono::milliseconds(0);
    return std::chrono::milliseconds(steady_ms() - last_answer_ms.load(std::memory_order_relaxed));
  }

  // Held around one command on a pooled connection.
  struct Waiting {
    explicit Waiting(Impl& impl) : impl(impl) {
      // The first waiter starts the clock: an idle store has nothing outstanding.
      if (impl.waiting_calls.fetch_add(1) == 0) impl.last_answer_ms = steady_ms();
    }
    ~Waiting() {
      impl.last_answer_ms = steady_ms();
      impl.waiting_calls.fetch_sub(1);
    }
    Impl& impl;
  };

  explicit Impl(RedisJobStoreOptions o) : options(std::move(o)) {}

  // One command on a connection. Throws ConnectionLost or ErrorReply.
  static Reply command(redisContext* c, const std::vector<std::string>& args) {
    append(c, args);
    Reply reply = read_reply(c);
    if (reply->type == REDIS_REPLY_ERROR) throw ErrorReply(std::string(text(reply.get())));
    return reply;
  }

  // Pipelining: a command written into the connection's buffer, and a reply read (writing what
  // is buffered first). Throw ConnectionLost; an error reply is returned.
  static void append(redisContext* c, const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    argv.reserve(args.size());
    lengths.reserve(args.size());
    for (const auto& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data()) !=
        REDIS_OK) {
      throw ConnectionLost(std::string(c->errstr));
    }
  }

  static Reply read_reply(redisContext* c) {
    void* reply = nullptr;
    if (redisGetReply(c, &reply) != REDIS_OK || !reply) {
      throw ConnectionLost(c->err == REDIS_ERR_IO && c->errstr[0] == '\0'
                               ? std::string("I/O error: ") + std::strerror(errno)
                               : std::string(c->errstr));
    }
    return Reply(static_cast<redisReply*>(reply));
  }

  // True when `script` reads no argument by its position alone (ARGV[<digit>]): in a batch, its
  // arguments start at ARGV[O + 2]. (Comments included, which say positions as O + n too.)
  static bool reads_in_place(std::string_view script) {
    for (auto at = script.find("ARGV["); at != std::string_view::npos;
         at = script.find("ARGV[", at + 5)) {
      if (at + 5 < script.size() && std::isdigit(static_cast<unsigned char>(script[at + 5]))) {
        return false;
      }
    }
    return true;
  }

  std::string script_text(std::size_t which) const {
    const bool puts = which == kScriptPut || which == kScriptBatchPut;
    std::string text = allow_oom && !puts ? "#!lua flags=allow-oom\n" : "";
    text += kPrelude;
    if (which < kStandaloneCount) return text + "local O = 0\n" + kScripts[which];
    text += "local OPS = {}\n";
    for (const Script op : batched_scripts(puts)) {
      if (!reads_in_place(kScripts[op])) {
        throw std::logic_error("a batched Redis script reads ARGV[n] without O");
      }
      text += "OPS['" + std::to_string(op) + "'] = function(ARGV, O)\n";
      text += kScripts[op];
      text += "\nend\n";
    }
    return text + kDispatch;
  }

  // The scripts that kScriptBatchPut (`puts`) or kScriptBatch run. Each reads its arguments as
  // ARGV[O + n] (kPrelude): reads_in_place checks it, in script_text.
  static std::vector<Script> batched_scripts(bool puts) {
    if (puts) return {kScriptPut};
    return {kScriptMarkRunning, kScriptFinish, kScriptRecordAttempt, kScriptRenew};
  }

  // A new connection: connected, authenticated, the database selected. (Scripts are Redis's, not a
  // connection's: the constructor loads them, and `script` again when Redis forgot them.)
  Context connect() { return connect(options.connect_timeout, options.command_timeout); }

  Context connect(std::chrono::milliseconds connect_timeout,
                  std::chrono::milliseconds command_timeout) {
    Context c(
        redisConnectWithTimeout(options.host.c_str(), options.port, to_timeval(connect_timeout)));
    if (!c) throw ConnectionLost("cannot allocate a connection");
    if (c->err) throw ConnectionLost(std::string("cannot connect: ") + c->errstr);
    redisSetTimeout(c.get(), to_timeval(command_timeout));
    // A connection dropped by a firewall or NAT while idle is noticed instead of waited on.
    redisEnableKeepAlive(c.get());
    try {
      if (!options.password.empty()) {
        if (options.username.empty()) {
          command(c.get(), {"AUTH", options.password});
        } else {
          command(c.get(), {"AUTH", options.username, options.password});
        }
      }
      if (options.db != 0) command(c.get(), {"SELECT", std::to_string(options.db)});
    } catch (const ErrorReply& e) {
      throw ConnectionLost(e.what());
    }
    return c;
  }

  // True when Redis closed a connection that awaits no answer (a restart closes them all): it is
  // readable, hung up or in error. Checked before an idle connection is used, so that a Redis
  // restarted between two calls costs no failed call. (A connection cut without a word, by a
  // network, still fails the call that finds it.)
  static bool closed_by_redis(const redisContext* c) {
    pollfd p{c->fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  Context acquire() {
    std::unique_lock<std::mutex> lock(pool_mutex);
    pool_returned.wait(lock, [&] { return !idle.empty() || open < options.connections; });
    while (!idle.empty()) {
      Context c = std::move(idle.back());
      idle.pop_back();
      if (!closed_by_redis(c.get())) return c;
      --open;  // (closed as `c` goes; a new one takes its place below)
    }
    ++open;
    lock.unlock();
    {
      std::lock_guard<std::mutex> failure_lock(failure_mutex);
      if (!failure.empty() && std::chrono::steady_clock::now() < reconnect_at) {
        const std::string why = failure;
        give_up_slot();
        throw StoreUnavailable(why);
      }
    }
    try {
      return connect();
    } catch (const ConnectionLost& e) {
      give_up_slot();
      failed(std::string(e.what()), true);
      throw StoreUnavailable(failure_text());
    } catch (...) {
      give_up_slot();
      throw;
    }
  }

  void give_up_slot() {
    std::lock_guard<std::mutex> lock(pool_mutex);
    --open;
    pool_returned.notify_one();
  }

  void give_back(Context c) {
    std::lock_guard<std::mutex> lock(pool_mutex);
    idle.push_back(std::move(c));
    pool_returned.notify_one();
  }

  // A connection was lost: the others idle in the pool went with it (a Redis restart closes them
  // all), so they are closed now rather than failing one call each.
  void drop_idle() {
    std::vector<Context> dropped;
    {
      std::lock_guard<std::mutex> lock(pool_mutex);
      dropped.swap(idle);
      open -= dropped.size();
      pool_returned.notify_all();
    }
  }

  // Notes why the store fails. Only a failed connect (`connecting`) delays the next ones, with a
  // backoff: a Redis that is down costs no connection storm, and one that is back is reached at
  // once by the next call.
  void failed(const std::string& why, bool connecting = false) {
    std::lock_guard<std::mutex> lock(failure_mutex);
    failure = "redis job store (" + options.host + ":" + std::to_string(options.port) + "): " + why;
    if (connecting) {
      reconnect_delay = reconnect_delay.count() == 0
                            ? options.reconnect_min
                            : std::min(options.reconnect_max, reconnect_delay * 2);
      reconnect_at = std::chrono::steady_clock::now() + reconnect_delay;
    }
    failing = true;
  }

  void worked() {
    if (!failing.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(failure_mutex);
    failure.clear();
    reconnect_delay = std::chrono::milliseconds(0);
    reconnect_at = {};
    failing = false;
  }

  std::string failure_text() const {
    std::lock_guard<std::mutex> lock(failure_mutex);
    return failure;
  }

  // Runs one command on a pooled connection. A lost connection is closed and reported as
  // StoreUnavailable; an error reply is thrown as ErrorReply (the connection is kept).
  Reply run(const std::vector<std::string>& args) {
    if (options.batch_writes) fence();
    Context c = acquire();
    try {
      Reply reply = [&] {
        Waiting waiting(*this);
        return command(c.get(), args);
      }();
      give_back(std::move(c));
      worked();
      return reply;
    } catch (const ConnectionLost& e) {
      c.reset();
      give_up_slot();
      drop_idle();
      failed(e.what());
      throw StoreUnavailable(failure_text());
    } catch (const ErrorReply& e) {
      if (connection_state_error(e.what())) {
        c.reset();
        give_up_slot();
        drop_idle();
        failed(e.what());
        throw StoreUnavailable(failure_text());
      }
      give_back(std::move(c));
      throw;
    } catch (...) {
      c.reset();
      give_up_slot();
      throw;
    }
  }

  // Runs a script with the prefix and `args` as ARGV. A script Redis forgot (a restart, SCRIPT
  // FLUSH) is loaded again and run once more: it did not run the first time.
  Reply script(Script which, std::vector<std::string> args) {
    args.insert(args.begin(), {"EVALSHA", shas[which], "0", options.key_prefix});
    try {
      try {
        return run(args);
      } catch (const ErrorReply& e) {
        if (std::strncmp(e.what(), "NOSCRIPT", 8) != 0) throw;
        run({"SCRIPT", "LOAD", script_text(which)});
        return run(args);
      }
    } catch (const ErrorReply& e) {
      if (out_of_memory_error(e.what())) {
        if (which == kScriptPut) throw OutOfMemory(e.what());
        failed(e.what());  // Redis before 7, full: accepted work cannot move on
      } else if (std::strncmp(e.what(), "BUSY", 4) == 0) {
        failed(e.what());  // another client's script holds Redis
      }
      // Anything else is this call's error, not the store's state.
      throw StoreUnavailable(std::string("redis job store: ") + e.what());
    }
  }

  std::vector<JobRecord> claim(const char* which, std::size_t max, const Lease& lease,
                               TimePoint now) {
    if (max == 0) return {};
    max = std::min<std::size_t>(max, 100000);  // one script blocks Redis for every server
    Reply r = script(kScriptClaim, {which, ms_text(now), std::to_string(max), lease.holder,
                                    ms_text(lease.until)});
    return read_records(r.get());
  }

  std::vector<JobRecord> list(const char* which, std::size_t limit,
                              const std::string& id_prefix = {}) {
    if (limit == 0) return {};
    limit = std::min<std::size_t>(limit, 100000);  // one script blocks Redis for every server
    Reply r = script(kScriptList, {which, std::to_string(limit), id_prefix});
    return read_records(r.get());
  }

  QueueStats stats() {
    Reply r = script(kScriptStats, {});
    QueueStats stats;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 5) return stats;
    auto count = [&](std::size_t i) {
      return r->element[i]->type == REDIS_REPLY_INTEGER
                 ? static_cast<std::size_t>(std::max<long long>(0, r->element[i]->integer))
                 : std::size_t{0};
    };
    stats.queued = count(0);
    stats.running = count(1);
    stats.callbacks_waiting = count(2);
    const std::string_view oldest = text(r->element[3]);
    if (!oldest.empty()) stats.oldest_queued = from_ms(number(oldest));
    stats.callbacks_failed = count(4);
    for (std::size_t i = 5; i + 1 < r->elements; i += 2)
      stats.queued_by_priority.emplace_back(static_cast<int>(count(i)), count(i + 1));
    return stats;
  }

  JobPage page_of(const JobFilter& filter, const std::optional<ListCursor>& after,
                  std::size_t limit) {
    JobPage page;
    if (limit == 0) return page;
    limit = std::min<std::size_t>(limit, 100000);  // one script blocks Redis for every server
    // The smallest set that holds every match: dead letters, work not finished, or every job.
    const bool unfinished_only = (filter.status && !is_final(*filter.status)) ||
                                 filter.callback_state == CallbackState::pending;
    const char* set = filter.callback_state == CallbackState::failed ? "failed"
                      : unfinished_only                              ? "unfinished"
                                                                     : "jobs";
    Reply r = script(kScriptPage, {std::to_string(limit), filter.id_prefix,
                                   after ? ms_text(after->created_at) : "", after ? after->id : "",
                                   set, filter.status ? to_text(*filter.status) : "",
                                   filter.callback_state ? to_text(*filter.callback_state) : "",
                                   filter.priority ? std::to_string(*filter.priority) : ""});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2) return page;
    const std::string_view next_ms = text(r->element[0]);
    if (!next_ms.empty())
      page.next = ListCursor{from_ms(number(next_ms)), std::string(text(r->element[1]))};
    for (std::size_t i = 2; i + 1 < r->elements; i += 2)
      page.jobs.push_back(read_record(text(r->element[i]), r->element[i + 1]));
    return page;
  }

  // A small write on a new connection (connect() with shorter timeouts), each step within
  // `probe_step` (400 ms): connecting, AUTH, SELECT and the write take 1.6 s at the most. Throws
  // ConnectionLost or ErrorReply.
  void probe() {
    constexpr std::chrono::milliseconds probe_step{400};
    Context c = connect(std::min(options.connect_timeout, probe_step),
                        std::min(options.command_timeout, probe_step));
    command(c.get(), {"SET", options.key_prefix + ":probe",
                      std::to_string(to_ms(std::chrono::system_clock::now()))});
  }

  std::string retention_ms() const {
    return std::to_string(
        std::chrono::duration_cast<std::chrono::milliseconds>(options.retention).count());
  }

  // ---- Batched writes (options.batch_writes): the calls of every thread are queued for one
  // connection thread, which sends what has gathered as one kDispatch call per kind (puts, the
  // rest), pipelined: one round trip and one script for many jobs. While a batch is out the next
  // one gathers, so the cost per job falls as the load rises, and an idle store sends at once.

  // One queued call. `done` runs once, on the connection thread: with its reply (alive only
  // during the call) or the error. Null for a call nobody waits for (mark_running).
  using OpDone = std::function<void(std::exception_ptr error, const redisReply* reply)>;
  struct Op {
    Script which;
    std::vector<std::string> args;
    OpDone done;
    bool unwaited = false;  // nobody waits for it (mark_running): `done` is null
    bool folded = false;    // not sent: a later call of the batch does its work (fold_marks)
  };

  static constexpr std::size_t kBatchCalls = 256;       // calls in one script at most
  static constexpr std::size_t kBatchBytes = 1u << 20;  // their arguments' bytes, past the first

  std::mutex batch_mutex;
  std::condition_variable batch_wake;     // to the connection thread
  std::condition_variable batch_flushed;  // to the calls that wait for what went before them
  std::deque<Op> batch_queue;
  bool batch_stop = false;
  // Calls nobody waits for, queued and sent (failed or not): a direct call first waits for those
  // queued before it, so a thread reads its own writes.
  std::atomic<std::uint64_t> unwaited_queued{0};
  std::atomic<std::uint64_t> unwaited_sent{0};
  Context batch_connection;  // the connection thread's own
  std::thread batch_thread;

  void start_batches() {
    batch_thread = std::thread([this] { send_batches(); });
  }

  // Sends what is queued, then ends. (The destructor's.)
  void stop_batches() {
    {
      std::lock_guard<std::mutex> lock(batch_mutex);
      batch_stop = true;
    }
    batch_wake.notify_one();
    if (batch_thread.joinable()) batch_thread.join();
  }

  void enqueue(Script which, std::vector<std::string> args, OpDone done) {
    std::vector<Op> ops;
    ops.push_back(Op{which, std::move(args), std::move(done)});
    enqueue(std::move(ops));
  }

  // Queued together: they go out in as few calls as the batch's bounds allow.
  void enqueue(std::vector<Op> ops) {
    std::uint64_t last_unwaited = 0;
    {
      std::lock_guard<std::mutex> lock(batch_mutex);
      if (batch_stop) throw StoreUnavailable("redis job store: closed");
      for (auto& op : ops) {
        op.unwaited = !op.done;
        const bool unwaited = op.unwaited;
        batch_queue.push_back(std::move(op));
        if (unwaited) last_unwaited = ++unwaited_queued;
      }
    }
    if (last_unwaited > 0) my_unwaited() = {serial, last_unwaited};
    batch_wake.notify_one();
  }

  // The last call nobody waits for that this thread queued, and on which store (its serial: a
  // new store may take a destroyed one's address).
  static std::pair<std::uint64_t, std::uint64_t>& my_unwaited() {
    static thread_local std::pair<std::uint64_t, std::uint64_t> last{0, 0};
    return last;
  }

  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> stores{0};
    return ++stores;
  }
  const std::uint64_t serial = next_serial();

  // Queues a call and answers what `read` makes of its reply, once it is sent.
  template <typename T, typename Read>
  std::future<T> start(Script which, std::vector<std::string> args, Read read) {
    auto promise = std::make_shared<std::promise<T>>();
    std::future<T> out = promise->get_future();
    enqueue(which, std::move(args),
            [promise, read = std::move(read)](std::exception_ptr error, const redisReply* r) {
              if (error) return promise->set_exception(error);
              try {
                promise->set_value(read(r));
              } catch (...) {
                promise->set_exception(std::current_exception());
              }
            });
    return out;
  }

  // A write that answers 1 (held) or 0, for JobStore::WriteDone.
  void start_write(Script which, std::vector<std::string> args, JobStore::WriteDone done) {
    auto shared = std::make_shared<JobStore::WriteDone>(std::move(done));
    try {
      enqueue(which, std::move(args), [shared](std::exception_ptr error, const redisReply* r) {
        JobStore::WriteDone call = std::move(*shared);
        if (error) return call(error, false);
        call(nullptr, is_one(r));
      });
    } catch (...) {
      if (*shared) (*shared)(std::current_exception(), false);
    }
  }

  // Waits until the calls nobody waits for that this thread queued are sent (or failed): a
  // thread reads its own writes. Other threads' are not waited for.
  void fence() {
    const auto mine = my_unwaited();
    if (mine.first != serial || unwaited_sent.load() >= mine.second) return;
    std::unique_lock<std::mutex> lock(batch_mutex);
    batch_flushed.wait(lock, [&] { return unwaited_sent.load() >= mine.second; });
  }

  void send_batches() {
    for (;;) {
      std::vector<Op> batch;
      {
        std::unique_lock<std::mutex> lock(batch_mutex);
        batch_wake.wait(lock, [&] { return batch_stop || !batch_queue.empty(); });
        if (batch_queue.empty()) break;
        std::size_t bytes = 0;
        while (!batch_queue.empty() && batch.size() < kBatchCalls) {
          std::size_t size = 0;
          for (const auto& a : batch_queue.front().args)
            size += a.size();
          if (!batch.empty() && bytes + size > kBatchBytes) break;
          bytes += size;
          batch.push_back(std::move(batch_queue.front()));
          batch_queue.pop_front();
        }
      }
      bool lost = false;
      try {
        lost = !send(batch);
      } catch (...) {
        // Out of memory, say: the calls not answered yet fail, and the connection goes (its
        // answers may be unread), the thread goes on.
        batch_connection.reset();
        fail(batch, std::make_exception_ptr(StoreUnavailable("redis job store: batch failed")));
      }
      if (lost) {
        // Redis failed (down, hung past the timeout, a new primary): what is queued behind would
        // wait for the same, one timeout a batch. It fails now; its callers try again (the
        // JobQueue's writes) or answer store_unavailable.
        std::vector<Op> queued;
        {
          std::lock_guard<std::mutex> lock(batch_mutex);
          queued.assign(std::make_move_iterator(batch_queue.begin()),
                        std::make_move_iterator(batch_queue.end()));
          batch_queue.clear();
        }
        fail(queued, std::make_exception_ptr(StoreUnavailable(failure_text())));
        std::move(queued.begin(), queued.end(), std::back_inserter(batch));
      }
      const auto unwaited = static_cast<std::uint64_t>(
          std::count_if(batch.begin(), batch.end(), [](const Op& op) { return op.unwaited; }));
      batch.clear();  // nothing of a caller's stays on this thread
      if (unwaited > 0) {
        {
          std::lock_guard<std::mutex> lock(batch_mutex);
          unwaited_sent += unwaited;
        }
        batch_flushed.notify_all();
      }
    }
    batch_connection.reset();
  }

  // A job whose mark_running and finish_job go in one batch (a short model, a busy store) is
  // marked by its finish: the finish records when it started, and the mark is not sent. Polls
  // would have seen it running for less than a round trip; its started_at is kept.
  static void fold_marks(std::vector<Op>& batch) {
    std::unordered_map<std::string_view, Op*> marks;
    for (auto& op : batch) {
      if (op.which == kScriptMarkRunning && op.unwaited && op.args.size() == 2) {
        marks[op.args[0]] = &op;
      } else if (op.which == kScriptFinish && op.args.size() == 13) {
        const auto mark = marks.find(op.args[0]);
        if (mark == marks.end()) continue;
        op.args[12] = mark->second->args[1];
        mark->second->folded = true;
        marks.erase(mark);
      }
    }
  }

  // Answers `error` to the calls not answered yet.
  static void fail(std::vector<Op>& ops, const std::exception_ptr& error) {
    for (auto& op : ops)
      answer(op, error, nullptr);
  }

  static void answer(Op& op, std::exception_ptr error, const redisReply* reply) {
    if (!op.done) return;
    auto done = std::move(op.done);
    op.done = nullptr;
    try {
      done(error, reply);
    } catch (...) {
      // A caller's continuation: not this thread's to handle.
    }
  }

  // One batch: a kDispatch call for its puts and one for the rest, pipelined; each group is
  // answered as its reply is read. False when the connection was lost (every call not answered
  // has failed).
  bool send(std::vector<Op>& batch) {
    fold_marks(batch);
    std::array<std::vector<Op*>, 2> groups;  // puts, the rest
    for (auto& op : batch) {
      if (!op.folded) groups[op.which == kScriptPut ? 0 : 1].push_back(&op);
    }
    std::array<std::vector<std::string>, 2> commands;
    for (std::size_t g = 0; g < 2; ++g) {
      if (groups[g].empty()) continue;
      auto& args = commands[g];
      args = {"EVALSHA", shas[g == 0 ? kScriptBatchPut : kScriptBatch], "0", options.key_prefix};
      for (Op* op : groups[g]) {
        args.push_back(std::to_string(op->which));
        args.push_back(std::to_string(op->args.size()));
        for (auto& a : op->args)
          args.push_back(std::move(a));
      }
    }
    auto lose = [&](const std::string& why) {
      batch_connection.reset();
      failed(why);
      fail(batch, std::make_exception_ptr(StoreUnavailable(failure_text())));
      return false;
    };
    try {
      if (batch_connection && closed_by_redis(batch_connection.get())) batch_connection.reset();
      if (!batch_connection) batch_connection = connect_after_backoff();
    } catch (const std::exception&) {
      // (connect_after_backoff noted why.)
      fail(batch, std::make_exception_ptr(StoreUnavailable(failure_text())));
      return false;
    }
    bool all_worked = true;
    std::array<bool, 2> forgotten{false, false};  // NOSCRIPT: sent again once both are read
    {
      Waiting waiting(*this);
      try {
        for (std::size_t g = 0; g < 2; ++g)
          if (!groups[g].empty()) append(batch_connection.get(), commands[g]);
        for (std::size_t g = 0; g < 2; ++g) {
          // A group's answer may drop the connection (LOADING, READONLY): the rest then fail.
          if (groups[g].empty() || !batch_connection) continue;
          Reply reply = read_reply(batch_connection.get());
          if (reply->type == REDIS_REPLY_ERROR && std::strncmp(reply->str, "NOSCRIPT", 8) == 0) {
            forgotten[g] = true;
            continue;
          }
          if (!answer_group(g, groups[g], reply.get())) all_worked = false;
        }
      } catch (const ConnectionLost& e) {
        return lose(e.what());
      }
      if (!batch_connection) {
        fail(batch, std::make_exception_ptr(StoreUnavailable(failure_text())));
        return false;
      }
      // Redis forgot the script (a restart, SCRIPT FLUSH): it did not run. Loaded, sent again.
      for (std::size_t g = 0; g < 2; ++g) {
        if (!forgotten[g]) continue;
        try {
          command(batch_connection.get(),
                  {"SCRIPT", "LOAD", script_text(g == 0 ? kScriptBatchPut : kScriptBatch)});
          append(batch_connection.get(), commands[g]);
          if (!answer_group(g, groups[g], read_reply(batch_connection.get()).get()))
            all_worked = false;
        } catch (const ConnectionLost& e) {
          return lose(e.what());
        } catch (const ErrorReply& e) {
          all_worked = false;
          for (Op* op : groups[g]) {
            answer(*op,
                   std::make_exception_ptr(
                       StoreUnavailable(std::string("redis job store: ") + e.what())),
                   nullptr);
          }
        }
        if (!batch_connection) {
          fail(batch, std::make_exception_ptr(StoreUnavailable(failure_text())));
          return false;
        }
      }
    }
    if (all_worked) worked();
    return true;
  }

  // What an error reply means for the calls it answers (one that says the connection cannot
  // serve drops it).
  std::exception_ptr error_of(const std::string& what, bool puts) {
    if (connection_state_error(what.c_str())) {
      batch_connection.reset();
      failed(what);
      return std::make_exception_ptr(StoreUnavailable(failure_text()));
    }
    if (out_of_memory_error(what.c_str()) && puts)
      return std::make_exception_ptr(OutOfMemory(what));
    if (out_of_memory_error(what.c_str()) || std::strncmp(what.c_str(), "BUSY", 4) == 0)
      failed(what);
    return std::make_exception_ptr(StoreUnavailable("redis job store: " + what));
  }

  // Answers a group's calls from its reply: each its own element, which may be an error of its
  // own (kDispatch catches a call's error; the calls before and after it stand). False when a
  // call or the whole reply is an error.
  bool answer_group(std::size_t g, const std::vector<Op*>& group, const redisReply* reply) {
    std::exception_ptr error;
    if (reply->type == REDIS_REPLY_ERROR) {
      error = error_of(std::string(text(reply)), g == 0);
    } else if (reply->type != REDIS_REPLY_ARRAY || reply->elements != group.size()) {
      error = std::make_exception_ptr(
          StoreUnavailable("redis job store: unexpected answer to a batch"));
    }
    bool all_worked = !error;
    for (std::size_t i = 0; i < group.size(); ++i) {
      const redisReply* element = error ? nullptr : reply->element[i];
      if (element && element->type == REDIS_REPLY_ERROR) {
        all_worked = false;
        answer(*group[i], error_of(std::string(text(element)), g == 0), nullptr);
      } else {
        answer(*group[i], error, element);
      }
    }
    return all_worked;
  }

  // A connection for the batches, unless a failed connect is still backing off.
  Context connect_after_backoff() {
    {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure.empty() && std::chrono::steady_clock::now() < reconnect_at)
        throw StoreUnavailable(failure);
    }
    try {
      return connect();
    } catch (const ConnectionLost& e) {
      failed(e.what(), true);
      throw StoreUnavailable(failure_text());
    }
  }
};

RedisJobStore::RedisJobStore(RedisJobStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  auto& o = impl_->options;
  if (o.connections == 0) throw Error("redis store: connections must be at least 1");
  if (o.key_prefix.empty() || o.key_prefix.find(':') != std::string::npos) {
    throw Error("redis store: the key prefix must be non-empty, without ':'");
  }
  if (o.retention.count() < 0) throw Error("redis store: retention must not be negative");
  if (o.connect_timeout.count() <= 0 || o.command_timeout.count() <= 0 ||
      o.unanswered_limit.count() <= 0 || o.reconnect_min.count() <= 0 ||
      o.reconnect_max < o.reconnect_min) {
    throw Error("redis store: timeouts and reconnect delays must be positive");
  }
  Context c;
  try {
    c = impl_->connect();
  } catch (const ConnectionLost& e) {
    throw Error("cannot use the redis job store at " + o.host + ":" + std::to_string(o.port) +
                ": " + e.what());
  }
  // Version (HSET with several fields needs 4; scripts that write after reading need 5, which
  // replicates their effects) and memory policy. Tested with 7.0.
  try {
    Reply info = Impl::command(c.get(), {"INFO", "server"});
    const std::string_view s = text(info.get());
    const auto at = s.find("redis_version:");
    if (at != std::string_view::npos) {
      const std::string_view v = s.substr(at + 14);
      const std::int64_t major = number(v);
      impl_->allow_oom = major >= 7;
      if (major < 5) {
        throw Error("redis store: Redis " + std::string(v.substr(0, v.find('\r'))) +
                    " is too old (5 or later)");
      }
    }
  } catch (const ErrorReply&) {
    // INFO refused (a restricted user): go on.
  } catch (const ConnectionLost& e) {
    throw Error(std::string("redis store: ") + e.what());
  }
  try {
    Reply policy = Impl::command(c.get(), {"CONFIG", "GET", "maxmemory-policy"});
    if (policy->type == REDIS_REPLY_ARRAY && policy->elements == 2 &&
        text(policy->element[1]).substr(0, 8) == "allkeys-") {
      throw Error("redis store: maxmemory-policy " + std::string(text(policy->element[1])) +
                  " would evict accepted jobs; use noeviction (or volatile-*, which evicts only "
                  "finished jobs)");
    }
  } catch (const ErrorReply&) {
    // CONFIG disabled (a managed Redis): the operator's word (docs/operations.md).
  } catch (const ConnectionLost& e) {
    throw Error(std::string("redis store: ") + e.what());
  }
  try {
    for (std::size_t i = 0; i < kScriptCount; ++i) {
      Reply sha = Impl::command(c.get(), {"SCRIPT", "LOAD", impl_->script_text(i)});
      impl_->shas[i] = std::string(text(sha.get()));
    }
  } catch (const std::exception& e) {
    throw Error(std::string("redis store: cannot load its scripts: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(impl_->pool_mutex);
    impl_->idle.push_back(std::move(c));
    impl_->open = 1;
  }
  // A store written before the listing's set existed gets it, once, from what it can know: the
  // unfinished jobs and the dead letters (finished ones were never indexed; they expire anyway).
  try {
    impl_->script(kScriptIndex, {});
  } catch (const std::exception& e) {
    throw Error(std::string("redis store: cannot index its jobs: ") + e.what());
  }
  // And one written before the tenant was a field gets the field, once (kTenants). Best effort:
  // what it cannot write (a full Redis) is read from the key all the same.
  try {
    std::string from = "0", stop;
    for (int slices = 0; slices < 1000000; ++slices) {
      Reply next = impl_->script(kScriptTenants, {from, stop});
      if (next->type != REDIS_REPLY_ARRAY || next->elements < 2 ||
          next->element[0]->type != REDIS_REPLY_INTEGER || next->element[0]->integer < 0)
        break;
      from = std::to_string(next->element[0]->integer);
      stop = std::to_string(next->element[1]->integer);
    }
  } catch (const std::exception&) {
    // Refused (out of memory before Redis 7) or failed: the next start tries again.
  }
  if (o.batch_writes) impl_->start_batches();
}

RedisJobStore::~RedisJobStore() {
  impl_->stop_batches();
}

namespace {

// What put's reply says: 0 created, 1 the same request, 2 another; 3 the same but for the
// input's text, with the stored input (bounded by the script to about twice the one sent).
struct PutAnswer {
  long long code = 0;
  std::string stored_input;
};

PutAnswer put_answer(const redisReply* r) {
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0 ||
      r->element[0]->type != REDIS_REPLY_INTEGER) {
    throw StoreUnavailable("redis job store: unexpected answer to put");
  }
  PutAnswer a;
  a.code = r->element[0]->integer;
  if (a.code == 3) {
    if (r->elements < 2 || r->element[1]->type != REDIS_REPLY_STRING)
      throw StoreUnavailable("redis job store: unexpected answer to put");
    a.stored_input.assign(r->element[1]->str, r->element[1]->len);
  }
  return a;
}

// Whether the input stored under a job's id (put's answer 3) parses to the same JSON as `input`.
// Its length is bounded by the script; its depth as a request's is (a shared Redis is not
// trusted).
bool same_input(const std::string& stored_text, const nlohmann::json& input) {
  nlohmann::json stored;
  return detail::parse_untrusted_json(stored_text, stored, SIZE_MAX) ==
             detail::JsonParseError::none &&
         stored == input;
}

// put's arguments (kPut).
std::vector<std::string> put_args(const Job& job, const std::optional<Lease>& claim,
                                  const std::string& retention_ms) {
  const std::string created = ms_text(job.created_at);
  const TimePoint due = claim ? claim->until : job.created_at;
  return {key_of(job),
          job.callback_url,
          detail::dump_json(job.input),
          created,
          claim ? claim->holder : "",
          claim ? ms_text(claim->until) : "0",
          ms_text(due),
          std::to_string(job.priority),
          std::to_string(job.max_queue.count()),
          std::to_string(job.webhook_events),
          job.traceparent,
          retention_ms,
          job_score(job.priority, due),
          job_score(job.priority, job.created_at),
          job.tenant};
}

PutOutcome put_outcome(const PutAnswer& answer, const Job& job) {
  switch (answer.code) {
    case 0:
      return PutOutcome::created;
    case 1:
      return PutOutcome::duplicate;
    case 3:
      // The input written differently (1 and 1.0): the same request when the two parse to the
      // same JSON, as the other stores decide (parsed here, on the caller's thread).
      return same_input(answer.stored_input, job.input) ? PutOutcome::duplicate
                                                        : PutOutcome::conflict;
    default:
      return PutOutcome::conflict;
  }
}

}  // namespace

PutOutcome RedisJobStore::put(const Job& job, const std::optional<Lease>& claim) {
  std::vector<std::string> args = put_args(job, claim, impl_->retention_ms());
  PutAnswer answer;
  try {
    if (impl_->options.batch_writes) {
      answer = impl_
                   ->start<PutAnswer>(kScriptPut, std::move(args),
                                      [](const redisReply* r) { return put_answer(r); })
                   .get();
    } else {
      Reply r = impl_->script(kScriptPut, std::move(args));
      answer = put_answer(r.get());
    }
  } catch (const OutOfMemory&) {
    return PutOutcome::full;
  }
  return put_outcome(answer, job);
}

// All the puts queued for the connection thread at once: they go in as few batches as their
// number and size allow, instead of one round trip each.
std::vector<PutOutcome> RedisJobStore::put_many(const std::vector<PutRequest>& requests) {
  if (!impl_->options.batch_writes) return JobStore::put_many(requests);
  std::vector<std::future<PutAnswer>> answers;
  answers.reserve(requests.size());
  std::exception_ptr failed;
  const std::string retention = impl_->retention_ms();
  for (const PutRequest& r : requests) {
    try {
      answers.push_back(
          impl_->start<PutAnswer>(kScriptPut, put_args(*r.job, r.claim, retention),
                                  [](const redisReply* reply) { return put_answer(reply); }));
    } catch (...) {
      failed = std::current_exception();
      break;
    }
  }
  // Every answer is waited for, so that none is left to a caller that has gone.
  std::vector<PutOutcome> out;
  out.reserve(requests.size());
  for (std::size_t i = 0; i < answers.size(); ++i) {
    try {
      out.push_back(put_outcome(answers[i].get(), *requests[i].job));
    } catch (const OutOfMemory&) {
      out.push_back(PutOutcome::full);
    } catch (...) {
      if (!failed) failed = std::current_exception();
      out.push_back(PutOutcome::conflict);  // (thrown below)
    }
  }
  if (failed) std::rethrow_exception(failed);
  return out;
}

std::optional<JobRecord> RedisJobStore::get(const std::string& id) const {
  Reply r;
  try {
    r = impl_->run({"HGETALL", impl_->options.key_prefix + ":job:" + id});
  } catch (const ErrorReply& e) {
    impl_->failed(e.what());
    throw StoreUnavailable(impl_->failure_text());
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) return std::nullopt;
  return read_record(id, r.get());
}

std::vector<JobRecord> RedisJobStore::claim_jobs(std::size_t max, const Lease& lease,
                                                 TimePoint now) {
  return impl_->claim("jobs", max, lease, now);
}

std::vector<JobRecord> RedisJobStore::claim_callbacks(std::size_t max, const Lease& lease,
                                                      TimePoint now) {
  return impl_->claim("callbacks", max, lease, now);
}

bool RedisJobStore::renew(const std::string& id, const Lease& lease, TimePoint now) {
  Reply r = impl_->script(kScriptRenew, {id, lease.holder, ms_text(lease.until), ms_text(now)});
  return is_one(r.get());
}

std::vector<bool> RedisJobStore::renew_all(const std::vector<std::pair<std::string, Lease>>& leases,
                                           TimePoint now) {
  if (!impl_->options.batch_writes) return JobStore::renew_all(leases, now);
  // One promise for them all, kept by every call's continuation: the answers, and the first
  // error.
  struct Answers {
    std::vector<bool> renewed;
    std::exception_ptr error;
    std::size_t left;
    std::promise<void> all;
  };
  auto answers = std::make_shared<Answers>();
  answers->renewed.assign(leases.size(), false);
  answers->left = leases.size();
  auto all = answers->all.get_future();
  std::vector<Impl::Op> ops;
  ops.reserve(leases.size());
  for (std::size_t i = 0; i < leases.size(); ++i) {
    const auto& lease = leases[i];
    ops.push_back(
        Impl::Op{kScriptRenew,
                 {lease.first, lease.second.holder, ms_text(lease.second.until), ms_text(now)},
                 [answers, i](std::exception_ptr error, const redisReply* r) {
                   // Every continuation runs on the connection thread, one after another.
                   if (error && !answers->error) answers->error = error;
                   if (!error) answers->renewed[i] = is_one(r);
                   if (--answers->left == 0) answers->all.set_value();
                 }});
  }
  if (ops.empty()) return {};
  impl_->enqueue(std::move(ops));
  all.get();
  if (answers->error) std::rethrow_exception(answers->error);
  return answers->renewed;
}

void RedisJobStore::mark_running(const std::string& id, TimePoint now) {
  // Nobody waits for it (only what polling shows lags when it fails): queued behind the puts and
  // before the acknowledgements of the same job, which the connection sends in order.
  if (impl_->options.batch_writes)
    return impl_->enqueue(kScriptMarkRunning, {id, ms_text(now)}, nullptr);
  impl_->script(kScriptMarkRunning, {id, ms_text(now)});
}

std::optional<std::size_t> RedisJobStore::queue_position(const std::string& id) const {
  Reply r = impl_->script(kScriptQueuePosition, {id});
  if (r->type != REDIS_REPLY_INTEGER || r->integer < 0) return std::nullopt;
  return static_cast<std::size_t>(r->integer);
}

namespace {

std::vector<std::string> finish_args(const std::string& id, const std::string& holder,
                                     const JobOutcome& outcome, const std::optional<Lease>& deliver,
                                     JobStore::TimePoint now, std::string retention) {
  std::vector<std::string> args{id, holder, ms_text(now)};
  append_outcome(args, outcome);
  args.push_back(deliver ? deliver->holder : "");
  args.push_back(deliver ? ms_text(deliver->until) : "0");
  args.push_back(std::move(retention));
  args.push_back(ms_text(outcome.finished_at));
  args.emplace_back();  // started: see kFinish
  return args;
}

std::vector<std::string> attempt_args(const std::string& id, const std::string& holder,
                                      const CallbackInfo& after, JobStore::TimePoint now,
                                      const std::optional<CallbackAttempt>& attempt,
                                      std::string retention) {
  std::vector<std::string> args{id, holder, ms_text(now), std::move(retention)};
  append_callback(args, after);
  args.push_back(attempt ? detail::dump_json(detail::attempt_to_json(*attempt)) : "");
  args.push_back(std::to_string(max_attempt_log));
  return args;
}

}  // namespace

bool RedisJobStore::finish_job(const std::string& id, const std::string& holder,
                               const JobOutcome& outcome, const std::optional<Lease>& deliver,
                               TimePoint now) {
  auto args = finish_args(id, holder, outcome, deliver, now, impl_->retention_ms());
  if (impl_->options.batch_writes)
    return impl_->start<bool>(kScriptFinish, std::move(args), is_one).get();
  Reply r = impl_->script(kScriptFinish, std::move(args));
  return is_one(r.get());
}

void RedisJobStore::async_finish_job(const std::string& id, const std::string& holder,
                                     const JobOutcome& outcome, const std::optional<Lease>& deliver,
                                     TimePoint now, WriteDone done) {
  if (!impl_->options.batch_writes)
    return JobStore::async_finish_job(id, holder, outcome, deliver, now, std::move(done));
  impl_->start_write(kScriptFinish,
                     finish_args(id, holder, outcome, deliver, now, impl_->retention_ms()),
                     std::move(done));
}

bool RedisJobStore::record_attempt(const std::string& id, const std::string& holder,
                                   const CallbackInfo& after, TimePoint now,
                                   const std::optional<CallbackAttempt>& attempt) {
  auto args = attempt_args(id, holder, after, now, attempt, impl_->retention_ms());
  if (impl_->options.batch_writes)
    return impl_->start<bool>(kScriptRecordAttempt, std::move(args), is_one).get();
  Reply r = impl_->script(kScriptRecordAttempt, std::move(args));
  return is_one(r.get());
}

void RedisJobStore::async_record_attempt(const std::string& id, const std::string& holder,
                                         const CallbackInfo& after, TimePoint now,
                                         const std::optional<CallbackAttempt>& attempt,
                                         WriteDone done) {
  if (!impl_->options.batch_writes)
    return JobStore::async_record_attempt(id, holder, after, now, attempt, std::move(done));
  impl_->start_write(kScriptRecordAttempt,
                     attempt_args(id, holder, after, now, attempt, impl_->retention_ms()),
                     std::move(done));
}

CancelOutcome RedisJobStore::cancel(const std::string& id, const JobOutcome& outcome,
                                    TimePoint now) {
  std::vector<std::string> args{id, ms_text(now), impl_->retention_ms()};
  append_outcome(args, outcome);
  args.push_back(ms_text(outcome.finished_at));
  Reply r = impl_->script(kScriptCancel, std::move(args));
  switch (r->integer) {
    case 1:
      return CancelOutcome::cancelled;
    case 2:
      return CancelOutcome::already_finished;
    default:
      return CancelOutcome::not_found;
  }
}

RedeliverOutcome RedisJobStore::redeliver(const std::string& id, const Lease& claim,
                                          TimePoint now) {
  Reply r = impl_->script(kScriptRedeliver, {id, claim.holder, ms_text(claim.until), ms_text(now)});
  switch (r->integer) {
    case 1:
      return RedeliverOutcome::redelivered;
    case 2:
      return RedeliverOutcome::not_failed;
    default:
      return RedeliverOutcome::not_found;
  }
}

void RedisJobStore::complete(const std::string& id, const JobOutcome& outcome) {
  std::vector<std::string> args{id, ms_text(std::chrono::system_clock::now()),
                                impl_->retention_ms()};
  append_outcome(args, outcome);
  args.push_back(ms_text(outcome.finished_at));
  impl_->script(kScriptComplete, std::move(args));
}

void RedisJobStore::update_callback(const std::string& id, const CallbackInfo& callback) {
  std::vector<std::string> args{id, ms_text(std::chrono::system_clock::now()),
                                impl_->retention_ms()};
  append_callback(args, callback);
  impl_->script(kScriptUpdateCallback, std::move(args));
}

std::optional<QueueStats> RedisJobStore::queue_stats() const {
  return impl_->stats();
}

JobPage RedisJobStore::failed_callbacks_page(const std::string& id_prefix,
                                             const std::optional<ListCursor>& after,
                                             std::size_t limit) const {
  JobFilter filter;
  filter.callback_state = CallbackState::failed;
  filter.id_prefix = id_prefix;
  return impl_->page_of(filter, after, limit);
}

JobPage RedisJobStore::list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                                 std::size_t limit) const {
  return impl_->page_of(filter, after, limit);
}

void RedisJobStore::report_server(const std::string& id, std::size_t leases, TimePoint now) {
  impl_->script(kScriptServers, {id.empty() ? "?" : id, ms_text(now), std::to_string(leases)});
}

bool RedisJobStore::set_origin_paused(const std::string& origin, bool paused) {
  if (origin.empty()) return true;
  Reply r = impl_->script(kScriptPaused, {origin, paused ? "1" : "0"});
  return !(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);  // 0: at the cap
}

std::optional<std::vector<std::string>> RedisJobStore::paused_origins() const {
  Reply r = impl_->script(kScriptPaused, {"", ""});
  // Not an answer to trust: nothing is resumed on it.
  if (!r || r->type != REDIS_REPLY_ARRAY)
    throw StoreUnavailable("redis job store: unexpected answer to the paused origins");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < r->elements; ++i)
    out.emplace_back(text(r->element[i]));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<ServerSeen> RedisJobStore::servers(TimePoint now) const {
  Reply r = impl_->script(kScriptServers, {"", ms_text(now), "0"});
  std::vector<ServerSeen> out;
  if (!r || r->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i + 1 < r->elements; i += 2) {
    const std::string_view value = text(r->element[i + 1]);
    const auto colon = value.find(':');
    ServerSeen seen;
    seen.id = std::string(text(r->element[i]));
    seen.last_seen = from_ms(number(value.substr(0, colon)));
    if (colon != std::string_view::npos)
      seen.leases = static_cast<std::size_t>(number(value.substr(colon + 1)));
    out.push_back(std::move(seen));
  }
  std::sort(out.begin(), out.end(),
            [](const ServerSeen& a, const ServerSeen& b) { return a.last_seen > b.last_seen; });
  return out;
}

std::vector<JobRecord> RedisJobStore::list_failed_callbacks(std::size_t limit) const {
  return impl_->list("failed", limit);
}

std::vector<JobRecord> RedisJobStore::list_failed_callbacks_with_prefix(
    const std::string& id_prefix, std::size_t limit) const {
  return impl_->list("failed", limit, id_prefix);
}

std::vector<JobRecord> RedisJobStore::list_unfinished(std::size_t limit) const {
  return impl_->list("unfinished", limit);
}

std::optional<std::string> RedisJobStore::failure() const {
  if (!impl_->failing.load(std::memory_order_relaxed)) {
    const auto silent = impl_->unanswered_for();
    if (silent < impl_->options.unanswered_limit) return std::nullopt;
    return "redis job store (" + impl_->options.host + ":" + std::to_string(impl_->options.port) +
           "): no answer for " + std::to_string(silent.count()) +
           " ms (Redis is frozen, overloaded or cut off)";
  }
  {
    std::lock_guard<std::mutex> lock(impl_->failure_mutex);
    if (impl_->failure.empty()) return std::nullopt;
    if (std::chrono::steady_clock::now() < impl_->reconnect_at) return impl_->failure;
  }
  // Time to look again, by one caller at a time (the others answer from the last look): a small
  // write, since a Redis can answer reads while it refuses writes (a replica, maxmemory).
  if (impl_->probing.exchange(true)) {
    const std::string why = impl_->failure_text();
    return why.empty() ? std::nullopt : std::optional<std::string>(why);
  }
  // On a connection of its own with short timeouts, so that a /ping never waits longer than
  // SageMaker allows (2 s) on a Redis that accepts connections and never answers.
  std::optional<std::string> out;
  try {
    impl_->probe();
    impl_->worked();
  } catch (const std::exception& e) {
    const std::string why = impl_->failure_text();
    out = why.empty() ? std::string("redis job store: ") + e.what() : why;
  }
  impl_->probing = false;
  return out;
}

}  // namespace rebound

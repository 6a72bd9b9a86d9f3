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
#include "common/embedded_files.hpp"
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

// The Lua scripts live in src/store/redis/*.lua, embedded at build time (redis_scripts(), by file
// name) and joined by script_text: prelude.lua first, then the script, or for a batch the
// scripts it runs as functions of OPS followed by dispatch.lua.

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
  // dispatch.lua over kScriptPut only (which is refused at maxmemory), and over the other writes
  // that many callers make at once.
  kScriptBatchPut,
  kScriptBatch,
  kScriptCount,
};

constexpr std::size_t kStandaloneCount = kScriptBatchPut;

// Each Script's file in src/store/redis, without ".lua".
constexpr std::array<const char*, kStandaloneCount> kScriptNames = {
    "put",       "claim",    "renew",           "mark_running", "finish",         "record_attempt",
    "redeliver", "complete", "update_callback", "list",         "queue_position", "cancel",
    "page",      "stats",    "servers",         "paused",       "index",          "tenants"};

// The text of src/store/redis/<name>.lua, as embedded at build time.
std::string_view lua(std::string_view name) {
  for (const detail::EmbeddedFile& f : detail::redis_scripts()) {
    if (f.name.size() == name.size() + 4 && f.name.substr(0, name.size()) == name &&
        f.name.substr(name.size()) == ".lua") {
      return {f.data, f.size};
    }
  }
  throw std::logic_error("no Redis script " + std::string(name) + ".lua was embedded");
}

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

// The enum texts are job.hpp's (to_string, from_string). An unknown status reads as failed, an
// unknown callback state as none (a field another program wrote).
const char* to_text(JobStatus s) {
  return to_string(s).data();  // (to_string's views are of string literals)
}

const char* to_text(CallbackState s) {
  return to_string(s).data();
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
      r.status = from_string<JobStatus>(value).value_or(JobStatus::failed);
    } else if (name == "result") {
      r.outcome.result = parse_json(value);
    } else if (name == "err_code") {
      err_code = std::string(value);
    } else if (name == "err_msg") {
      err_msg = std::string(value);
    } else if (name == "cb_state") {
      r.callback.state = from_string<CallbackState>(value).value_or(CallbackState::none);
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
    // Written before the tenant was a field (an older build, or not reached yet by tenants.lua):
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

// True when `prefix` holds a Redis Cluster hash tag: a '{' followed later by a '}' with something
// between them (the first such pair is what Redis hashes).
bool has_hash_tag(std::string_view prefix) {
  const auto open = prefix.find('{');
  if (open == std::string_view::npos) return false;
  const auto close = prefix.find('}', open + 1);
  return close != std::string_view::npos && close > open + 1;
}

// Why `prefix` cannot be a key prefix, or nullopt: 1 to 64 letters, digits, '_', '.', '-' and
// braces (every key is "<prefix>:...": no ':'; nothing a URI would encode), a '{' only as a whole
// hash tag.
std::optional<std::string> prefix_error(std::string_view prefix) {
  const bool plain = std::all_of(prefix.begin(), prefix.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-' || c == '{' || c == '}';
  });
  if (prefix.empty() || prefix.size() > 64 || !plain) {
    return "the key prefix must be 1 to 64 letters, digits, '_', '.', '-' or braces: '" +
           std::string(prefix) + "'";
  }
  if (prefix.find('{') != std::string_view::npos && !has_hash_tag(prefix)) {
    return "the key prefix '" + std::string(prefix) +
           "' opens a '{' that is not a hash tag ({name})";
  }
  return std::nullopt;
}

}  // namespace

RedisJobStoreOptions parse_redis_uri(std::string_view uri, RedisJobStoreOptions options) {
  const std::string whole(uri);
  constexpr std::string_view scheme = "redis://";
  if (uri.substr(0, scheme.size()) != scheme) {
    throw Error("redis store: '" + whole + "' is not redis://host[:port][/db][?prefix=name]");
  }
  uri.remove_prefix(scheme.size());
  if (const auto question = uri.find('?'); question != std::string_view::npos) {
    const std::string_view query = uri.substr(question + 1);
    uri = uri.substr(0, question);
    constexpr std::string_view key = "prefix=";
    if (query.substr(0, key.size()) != key || query.find('&') != std::string_view::npos) {
      throw Error("redis store: the only option of '" + whole + "' may be ?prefix=name");
    }
    const std::string prefix(query.substr(key.size()));
    if (auto wrong = prefix_error(prefix)) throw Error("redis store: " + *wrong);
    options.key_prefix = prefix;
  }
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
  // The key every script call declares (`<prefix>:jobs`: see start_evalsha), made once.
  std::string declared_key = options.key_prefix + ":jobs";
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
    text += lua("prelude");
    if (which < kStandaloneCount) {
      text += "local O = 0\n";
      return text += lua(kScriptNames[which]);
    }
    text += "local OPS = {}\n";
    for (const Script op : batched_scripts(puts)) {
      if (!reads_in_place(lua(kScriptNames[op]))) {
        throw std::logic_error("a batched Redis script reads ARGV[n] without O");
      }
      text += "OPS['" + std::to_string(op) + "'] = function(ARGV, O)\n";
      text += lua(kScriptNames[op]);
      text += "\nend\n";
    }
    return text += lua("dispatch");
  }

  // The scripts that kScriptBatchPut (`puts`) or kScriptBatch run. Each reads its arguments as
  // ARGV[O + n] (prelude.lua): reads_in_place checks it, in script_text.
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

  // The start of every script call: EVALSHA, the script, one key declared (the prefix's listing,
  // `<prefix>:jobs`: every key a script touches shares its hash tag, so Redis Cluster routes the
  // call to the node of the prefix's slot) and the prefix as ARGV[1].
  void start_evalsha(std::vector<std::string>& args, std::size_t which) const {
    args.insert(args.begin(), {"EVALSHA", shas[which], "1", declared_key, options.key_prefix});
  }

  // Runs a script with the prefix and `args` as ARGV. A script Redis forgot (a restart, SCRIPT
  // FLUSH) is loaded again and run once more: it did not run the first time.
  Reply script(Script which, std::vector<std::string> args) {
    start_evalsha(args, which);
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
  // connection thread, which sends what has gathered as one dispatch.lua call per kind (puts, the
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

  // One batch: a dispatch.lua call for its puts and one for the rest, pipelined; each group is
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
      args.clear();
      start_evalsha(args, g == 0 ? kScriptBatchPut : kScriptBatch);
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
  // own (dispatch.lua catches a call's error; the calls before and after it stand). False when a
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
  if (auto wrong = prefix_error(o.key_prefix)) throw Error("redis store: " + *wrong);
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
  // On Redis Cluster every key of a prefix must hash to one slot: the prefix holds a hash tag.
  // Asked with INFO, else (a user INFO is denied to) with CLUSTER INFO, which a Redis without
  // cluster support refuses as such; a Redis that answers neither is taken for a single one.
  if (!has_hash_tag(o.key_prefix)) {
    bool cluster = false;
    try {
      Reply info = Impl::command(c.get(), {"INFO", "cluster"});
      cluster = text(info.get()).find("cluster_enabled:1") != std::string_view::npos;
    } catch (const ErrorReply&) {
      try {
        Reply info = Impl::command(c.get(), {"CLUSTER", "INFO"});
        cluster = text(info.get()).find("cluster_state:") != std::string_view::npos;
      } catch (const ErrorReply&) {
      } catch (const ConnectionLost& e) {
        throw Error(std::string("redis store: ") + e.what());
      }
    } catch (const ConnectionLost& e) {
      throw Error(std::string("redis store: ") + e.what());
    }
    if (cluster) {
      throw Error(
          "redis store: on Redis Cluster the key prefix must hold a hash tag ({name}), so "
          "that a queue's keys share one slot: '" +
          o.key_prefix + "' has none");
    }
  }
  // The default prefix was "rebound" before it was a hash tag: a queue stored under it would be
  // left behind unseen by a server that starts on the new default, so such a start is refused.
  if (o.key_prefix == RedisJobStoreOptions{}.key_prefix) {
    for (const char* old_key : {"rebound:jobs", "rebound:unfinished"}) {
      bool found = false;
      try {
        Reply r = Impl::command(c.get(), {"EXISTS", old_key});
        found = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
      } catch (const ErrorReply&) {
        // (On a cluster whose other node owns that key's slot: not this queue's Redis anyway.)
      } catch (const ConnectionLost& e) {
        throw Error(std::string("redis store: ") + e.what());
      }
      if (found) {
        throw Error(
            "redis store: this Redis holds a queue under the key prefix 'rebound' (the "
            "default before it became '{rebound}'): give ?prefix=rebound to go on with "
            "it, or another prefix for a new queue beside it");
      }
    }
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
  // And one written before the tenant was a field gets the field, once (tenants.lua). Best effort:
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

// put's arguments (put.lua).
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

// RedisJobStore, the adapter: each JobStore call as one Lua script (scripts.hpp), its arguments
// and answers in the codec's terms (codec.hpp), sent by the client (client.hpp: the pool, the
// failure state, the cluster's routing), or queued for the batch writer below.
#include "rebound/store/redis_job_store.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
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

#include "rebound/error.hpp"
#include "store/redis/client.hpp"
#include "store/redis/codec.hpp"
#include "store/redis/reply.hpp"
#include "store/redis/scripts.hpp"

namespace rebound {

using namespace detail::redis;  // (this file is the adapter of src/store/redis)

namespace {

// finish.lua's arguments (finish_args): how many, and where the time the job started goes (ARGV
// O + 14; fold_marks writes it).
constexpr std::size_t finish_arg_count = 15;
constexpr std::size_t finish_started_arg = 12;

// Redis at its maxmemory (with noeviction) refused a put: the store is full, not broken.
struct OutOfMemory : StoreUnavailable {
  using StoreUnavailable::StoreUnavailable;
};

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
    throw Error("redis store: '" + whole +
                "' is not redis://host[:port][/db][?prefix=name][&replicas=N]");
  }
  uri.remove_prefix(scheme.size());
  if (const auto question = uri.find('?'); question != std::string_view::npos) {
    const std::string_view query = uri.substr(question + 1);
    uri = uri.substr(0, question);
    if (query.empty() || query.back() == '&') {
      throw Error("redis store: an empty option in '" + whole + "'");
    }
    bool prefix_seen = false, replicas_seen = false;
    for (std::string_view rest = query; !rest.empty();) {
      const auto amp = rest.find('&');
      const std::string_view option = rest.substr(0, amp);
      rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
      if (option.substr(0, 7) == "prefix=" && !prefix_seen) {
        prefix_seen = true;
        const std::string prefix(option.substr(7));
        if (auto wrong = prefix_error(prefix)) throw Error("redis store: " + *wrong);
        options.key_prefix = prefix;
      } else if (option.substr(0, 9) == "replicas=" && !replicas_seen) {
        replicas_seen = true;
        const std::string_view n = option.substr(9);
        if (n.empty() || n.size() > 2 ||
            !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
            number(n) > 16) {
          throw Error("redis store: replicas in '" + whole + "' must be a number from 0 to 16");
        }
        options.replicas = static_cast<std::size_t>(number(n));
      } else {
        throw Error("redis store: the options of '" + whole +
                    "' may be prefix=name and replicas=N, each once, joined by '&'");
      }
    }
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

// At maxmemory with noeviction; Redis before 7 wraps it in a script error.
bool out_of_memory_error(const char* what) {
  return std::strncmp(what, "OOM", 3) == 0 || std::strstr(what, "OOM command not allowed");
}

struct RedisJobStore::Impl {
  // (`client` from `options`, which is declared, so made, first.)
  explicit Impl(RedisJobStoreOptions o)
      : options(std::move(o)), client(options, options.key_prefix + ":jobs") {}

  const RedisJobStoreOptions options;
  // Connections, failure state, and on a cluster the route to the node of the prefix's slot.
  Client client;
  // The key every script call declares (`<prefix>:jobs`: see start_evalsha), made once.
  std::string declared_key = options.key_prefix + ":jobs";
  std::array<std::string, kScriptCount> shas;  // written by the constructor only
  // Redis 7 runs scripts marked allow-oom at maxmemory: only a put is refused when it is full,
  // so the work already accepted can finish and free memory. (Set by the constructor.)
  bool allow_oom = false;
  // Where waiting_versions starts among the tenants, raised by each call.
  std::atomic<std::uint64_t> waiting_turn{0};

  // One command on a pooled connection, after this thread's unwaited batched writes (a thread
  // reads its own writes). `wait`: a script's, acknowledged once `replicas` replicas have it.
  Reply run(const std::vector<std::string>& args, bool wait = false) {
    if (options.batch_writes) fence();
    return client.run(args, wait);
  }

  // The start of every script call: EVALSHA, the script, one key declared (the prefix's listing,
  // `<prefix>:jobs`: every key a script touches shares its hash tag, so Redis Cluster routes the
  // call to the node of the prefix's slot) and the prefix as ARGV[1].
  void start_evalsha(std::vector<std::string>& args, std::size_t which) const {
    args.insert(args.begin(), {"EVALSHA", shas[which], "1", declared_key, options.key_prefix});
  }

  // Runs a script with the prefix and `args` as ARGV. A script Redis forgot (a restart, SCRIPT
  // FLUSH) is loaded again and run once more: it did not run the first time. With `replicas`, a
  // script that writes is acknowledged once they have it (reads: reads_only).
  Reply script(Script which, std::vector<std::string> args) {
    const bool wait = !reads_only(which);
    return script(which, std::move(args), wait);
  }

  Reply script(Script which, std::vector<std::string> args, bool wait) {
    start_evalsha(args, which);
    try {
      try {
        return run(args, wait);
      } catch (const ErrorReply& e) {
        if (std::strncmp(e.what(), "NOSCRIPT", 8) != 0) throw;
        run({"SCRIPT", "LOAD", script_text(which, allow_oom)});
        return run(args, wait);
      }
    } catch (const ErrorReply& e) {
      if (out_of_memory_error(e.what())) {
        if (which == kScriptPut) throw OutOfMemory(e.what());
        client.failed(e.what());  // Redis before 7, full: accepted work cannot move on
      } else if (std::strncmp(e.what(), "BUSY", 4) == 0) {
        client.failed(e.what());  // another client's script holds Redis
      }
      // Anything else is this call's error, not the store's state.
      throw StoreUnavailable(std::string("redis job store: ") + e.what());
    }
  }

  std::vector<JobRecord> claim(const char* which, std::size_t max, const Lease& lease,
                               TimePoint now, const std::vector<ModelRef>& skip = {}) {
    if (max == 0) return {};
    max = std::min<std::size_t>(max, 100000);  // one script blocks Redis for every server
    // The versions left alone, as "name version" lines (names and versions hold neither).
    std::string skipped;
    for (const ModelRef& ref : skip)
      skipped += ref.name + ' ' + ref.version + '\n';
    Reply r = script(kScriptClaim, {which, ms_text(now), std::to_string(max), lease.holder,
                                    ms_text(lease.until), std::move(skipped)});
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
    bool unwaited = false;        // nobody waits for it (mark_running): `done` is null
    bool folded = false;          // not sent: a later call of the batch does its work (fold_marks)
    std::uint64_t queued_as = 0;  // its place in the order of all calls queued (enqueue)
  };

  static constexpr std::size_t kBatchCalls = 256;       // calls in one script at most
  static constexpr std::size_t kBatchBytes = 1u << 20;  // their arguments' bytes, past the first

  std::mutex batch_mutex;
  std::condition_variable batch_wake;     // to the connection thread
  std::condition_variable batch_flushed;  // to the calls that wait for what went before them
  std::deque<Op> batch_queue;
  std::uint64_t calls_queued = 0;  // (under batch_mutex) the last Op::queued_as given
  // (The connection thread's own) the last call queued before the callers of a batch that lost
  // Redis were answered: the calls queued up to then fail with it; those queued after are sent
  // (Redis may be back: a caller answered can have seen it work and queued again).
  std::uint64_t failed_through = 0;
  bool batch_stop = false;
  // Calls nobody waits for, queued and sent (failed or not): a direct call first waits for those
  // queued before it, so a thread reads its own writes.
  std::atomic<std::uint64_t> unwaited_queued{0};
  std::atomic<std::uint64_t> unwaited_sent{0};
  Context batch_connection;  // the connection thread's own
  // Why the batch thread's last failure happened, as the client noted it: what the calls it fails
  // are told (the client's own note may be cleared meanwhile by a look that found Redis back).
  std::string batch_failure;
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
        op.queued_as = ++calls_queued;
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

  // A write whose `done` (JobStore::WriteDone, JobStore::FinishDone) is answered once with what
  // `read` makes of its reply (a default answer with an error).
  template <typename Done, typename Read>
  void start_write(Script which, std::vector<std::string> args, Done done, Read read) {
    using Answer = decltype(read(static_cast<const redisReply*>(nullptr)));
    auto shared = std::make_shared<Done>(std::move(done));
    try {
      enqueue(which, std::move(args),
              [shared, read = std::move(read)](std::exception_ptr error, const redisReply* r) {
                Done call = std::move(*shared);
                if (error) return call(error, Answer{});
                Answer answer{};
                try {
                  answer = read(r);
                } catch (...) {
                  return call(std::current_exception(), Answer{});
                }
                call(nullptr, std::move(answer));
              });
    } catch (...) {
      if (*shared) (*shared)(std::current_exception(), Answer{});
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
        // Redis failed (down, hung past the timeout, a new primary): what was queued behind by
        // then would wait for the same, one timeout a batch. It fails now; its callers try again
        // (the JobQueue's writes) or answer store_unavailable. A call queued after the first of
        // the batch's callers was answered is not failed unsent: this thread may come here after
        // Redis is back and a caller has seen it work (a probe, a read) and queued again.
        std::vector<Op> queued;
        {
          std::lock_guard<std::mutex> lock(batch_mutex);
          while (!batch_queue.empty() && batch_queue.front().queued_as <= failed_through) {
            queued.push_back(std::move(batch_queue.front()));
            batch_queue.pop_front();
          }
        }
        fail(queued, std::make_exception_ptr(StoreUnavailable(batch_failure)));
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
      } else if (op.which == kScriptFinish && op.args.size() == finish_arg_count) {
        const auto mark = marks.find(op.args[0]);
        if (mark == marks.end()) continue;
        op.args[finish_started_arg] = mark->second->args[1];
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
      done(error ? own_copy(error) : nullptr, reply);
    } catch (...) {
      // A caller's continuation: not this thread's to handle.
    }
  }

  // The same failure answers many calls, each rethrown on its caller's thread: each gets an
  // exception object of its own. (libstdc++ counts the references to a shared one in code that
  // ThreadSanitizer does not see, so one object rethrown on several threads reads as a race,
  // and halts a TSan build.)
  static std::exception_ptr own_copy(const std::exception_ptr& error) {
    try {
      std::rethrow_exception(error);
    } catch (const OutOfMemory& e) {
      return std::make_exception_ptr(OutOfMemory(e.what()));
    } catch (const std::exception& e) {
      return std::make_exception_ptr(StoreUnavailable(e.what()));
    } catch (...) {
      return std::make_exception_ptr(StoreUnavailable("redis job store: the call failed"));
    }
  }

  // One batch: a dispatch.lua call for its puts and one for the rest, pipelined (and, with
  // `replicas`, a WAIT behind them). Without WAIT each group is answered as its reply is read; with
  // it, once the WAIT's is. A group Redis did not run (its script forgotten: loaded again; its
  // slot moved: the route follows) is sent again, up to four times. False when the connection was
  // lost (every call not answered has failed).
  bool send(std::vector<Op>& batch) {
    fold_marks(batch);
    std::array<std::vector<Op*>, 2> groups;  // puts, the rest
    for (auto& op : batch) {
      if (!op.folded) groups[op.which == kScriptPut ? 0 : 1].push_back(&op);
    }
    std::array<std::vector<std::string>, 2> commands;
    std::array<bool, 2> pending{false, false};
    for (std::size_t g = 0; g < 2; ++g) {
      if (groups[g].empty()) continue;
      pending[g] = true;
      auto& args = commands[g];
      start_evalsha(args, g == 0 ? kScriptBatchPut : kScriptBatch);
      for (Op* op : groups[g]) {
        args.push_back(std::to_string(op->which));
        args.push_back(std::to_string(op->args.size()));
        for (auto& a : op->args)
          args.push_back(std::move(a));
      }
    }
    // The last call queued before any caller of this batch was answered: a caller answered
    // may queue again at once, and that call is not the lost connection's to fail.
    std::optional<std::uint64_t> queued_before_answers;
    auto answering = [&] {
      if (queued_before_answers) return;
      std::lock_guard<std::mutex> lock(batch_mutex);
      queued_before_answers = calls_queued;
    };
    // The batch fails whole, and with it what was queued before its first answer (send_batches).
    auto give_up = [&] {
      answering();
      {
        std::lock_guard<std::mutex> lock(batch_mutex);
        failed_through = *queued_before_answers;
      }
      fail(batch, std::make_exception_ptr(StoreUnavailable(batch_failure)));
      return false;
    };
    auto lose = [&](const std::string& why) {
      batch_connection.reset();
      batch_failure = client.failed(why);
      return give_up();
    };
    auto fail_group = [&](std::size_t g, const std::string& why) {
      answering();
      for (Op* op : groups[g])
        answer(*op, std::make_exception_ptr(StoreUnavailable(why)), nullptr);
      pending[g] = false;
    };
    // A reply that says the group did not run, and is to be sent again.
    auto not_run = [&](const redisReply* reply) {
      if (reply->type != REDIS_REPLY_ERROR) return false;
      if (std::strncmp(reply->str, "NOSCRIPT", 8) == 0) return true;
      const auto redirect = client.cluster() ? parse_redirect(text(reply)) : std::nullopt;
      return redirect && !redirect->ask;
    };
    const bool wait = client.waits_for_replicas();
    bool all_worked = true;
    auto settle = [&](std::size_t g, const redisReply* reply,
                      const std::optional<std::string>& short_of) {
      answering();
      if (short_of && reply->type != REDIS_REPLY_ERROR) {
        all_worked = false;
        fail_group(g, *short_of);
        return;
      }
      if (!answer_group(g, groups[g], reply)) all_worked = false;
      pending[g] = false;
    };
    for (int round = 0; round < 4 && (pending[0] || pending[1]); ++round) {
      try {
        if (batch_connection && closed_by_redis(batch_connection.get())) batch_connection.reset();
        if (!batch_connection) batch_connection = client.connect_after_backoff();
      } catch (const std::exception& e) {
        // (connect_after_backoff noted why, and says it.)
        batch_failure = e.what();
        return give_up();
      }
      std::array<Reply, 2> replies;
      std::optional<std::string> short_of;
      try {
        Client::Waiting waiting(client);
        for (std::size_t g = 0; g < 2; ++g)
          if (pending[g]) append(batch_connection.get(), commands[g]);
        if (wait) append(batch_connection.get(), client.wait_command());
        for (std::size_t g = 0; g < 2; ++g) {
          if (!pending[g]) continue;
          replies[g] = read_reply(batch_connection.get());
          if (!wait && !not_run(replies[g].get())) {
            settle(g, replies[g].get(), std::nullopt);
            // Its answer dropped the connection (LOADING, READONLY): the rest fail.
            if (!batch_connection) return give_up();
          }
        }
        if (wait) {
          Reply waited = read_reply(batch_connection.get());
          short_of = client.short_of_replicas(waited.get());
          if (short_of) client.replicas_missing(*short_of);
        }
      } catch (const ConnectionLost& e) {
        return lose(e.what());
      }
      bool moved = false;
      for (std::size_t g = 0; g < 2; ++g) {
        if (!pending[g] || !replies[g]) continue;
        const redisReply* reply = replies[g].get();
        if (!not_run(reply)) {
          settle(g, reply, short_of);
          continue;
        }
        if (std::strncmp(reply->str, "NOSCRIPT", 8) != 0) {
          client.follow(text(reply), batch_connection.get());  // MOVED: a failover, say
          moved = true;
          continue;
        }
        // Redis forgot the script (a restart, SCRIPT FLUSH, a new master): it did not run.
        if (!batch_connection || moved) continue;  // (loaded on the next node, if it needs it)
        try {
          command(
              batch_connection.get(),
              {"SCRIPT", "LOAD", script_text(g == 0 ? kScriptBatchPut : kScriptBatch, allow_oom)});
        } catch (const ConnectionLost& e) {
          return lose(e.what());
        } catch (const ErrorReply& e) {
          all_worked = false;
          fail_group(g, std::string("redis job store: ") + e.what());
        }
      }
      if (moved) {
        batch_connection.reset();
      } else if (!batch_connection) {
        // An answer dropped the connection (LOADING, READONLY): the rest fail.
        return give_up();
      }
    }
    for (std::size_t g = 0; g < 2; ++g) {
      if (!pending[g]) continue;
      all_worked = false;
      fail_group(g, "redis job store: a batch was not run after four tries (its slot kept moving)");
    }
    if (all_worked && !wait) client.worked();
    if (all_worked && wait) client.replicas_worked();
    return true;
  }

  // What an error reply means for the calls it answers (one that says the connection cannot
  // serve drops it).
  std::exception_ptr error_of(const std::string& what, bool puts) {
    if (connection_state_error(what.c_str())) {
      batch_connection.reset();
      batch_failure = client.failed(what);
      return std::make_exception_ptr(StoreUnavailable(batch_failure));
    }
    if (out_of_memory_error(what.c_str()) && puts)
      return std::make_exception_ptr(OutOfMemory(what));
    if (out_of_memory_error(what.c_str()) || std::strncmp(what.c_str(), "BUSY", 4) == 0)
      client.failed(what);
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
};

RedisJobStore::RedisJobStore(RedisJobStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  const auto& o = impl_->options;
  if (o.connections == 0) throw Error("redis store: connections must be at least 1");
  if (auto wrong = prefix_error(o.key_prefix)) throw Error("redis store: " + *wrong);
  if (o.retention.count() < 0) throw Error("redis store: retention must not be negative");
  if (o.connect_timeout.count() <= 0 || o.command_timeout.count() <= 0 ||
      o.unanswered_limit.count() <= 0 || o.reconnect_min.count() <= 0 ||
      o.reconnect_max < o.reconnect_min) {
    throw Error("redis store: timeouts and reconnect delays must be positive");
  }
  if (o.replicas > 0 &&
      (o.replica_timeout.count() <= 0 || o.replica_timeout >= o.command_timeout)) {
    throw Error(
        "redis store: the replica timeout must be positive and shorter than the command timeout");
  }
  Context c;
  try {
    c = impl_->client.connect_seed();
  } catch (const ConnectionLost& e) {
    throw Error("cannot use the redis job store at " + o.host + ":" + std::to_string(o.port) +
                ": " + e.what());
  }
  // Version (HSET with several fields needs 4; scripts that write after reading need 5, which
  // replicates their effects) and memory policy. Tested with 7.0.
  try {
    Reply info = command(c.get(), {"INFO", "server"});
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
  // The client learns whether this is a cluster and, if so, which node serves the prefix's slot:
  // the rest is asked of that node.
  try {
    c = impl_->client.route_from(std::move(c));
  } catch (const ConnectionLost& e) {
    throw Error(std::string("redis store: ") + e.what());
  }
  if (impl_->client.cluster() && !has_hash_tag(o.key_prefix)) {
    throw Error(
        "redis store: on Redis Cluster the key prefix must hold a hash tag ({name}), so "
        "that a queue's keys share one slot: '" +
        o.key_prefix + "' has none");
  }
  // The default prefix was "rebound" before it was a hash tag: a queue stored under it would be
  // left behind unseen by a server that starts on the new default, so such a start is refused.
  if (o.key_prefix == RedisJobStoreOptions{}.key_prefix) {
    for (const char* old_key : {"rebound:jobs", "rebound:unfinished"}) {
      bool found = false;
      try {
        Reply r = command(c.get(), {"EXISTS", old_key});
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
    Reply policy = command(c.get(), {"CONFIG", "GET", "maxmemory-policy"});
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
      Reply sha = command(c.get(), {"SCRIPT", "LOAD", script_text(i, impl_->allow_oom)});
      impl_->shas[i] = std::string(text(sha.get()));
    }
  } catch (const std::exception& e) {
    throw Error(std::string("redis store: cannot load its scripts: ") + e.what());
  }
  impl_->client.adopt(std::move(c));
  // A store written before the listing's set existed gets it, once, from what it can know: the
  // unfinished jobs and the dead letters (finished ones were never indexed; they expire anyway).
  try {
    impl_->script(kScriptIndex, {}, false);  // (rarely writes; not worth a start refused)
  } catch (const std::exception& e) {
    throw Error(std::string("redis store: cannot index its jobs: ") + e.what());
  }
  // And one written by an older build is brought up to date, once (tenants.lua): the tenant as a
  // field of its own, each tenant's dead letters in a set of its own. Best effort: a record it
  // cannot write (a full Redis) is read from its key all the same; the next start tries again.
  try {
    std::string from = "0", stop;
    for (int slices = 0; slices < 1000000; ++slices) {
      Reply next = impl_->script(kScriptTenants, {from, stop}, false);
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

// A script's answer that must be a number (cancel's, redeliver's): anything else is a Redis, or
// a script, this store does not know, told as such rather than read as "not found".
long long integer_answer(const redisReply* r, const char* call) {
  if (!r || r->type != REDIS_REPLY_INTEGER)
    throw StoreUnavailable(std::string("redis job store: unexpected answer to ") + call);
  return r->integer;
}

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
          job.tenant,
          job.model.name,
          job.model.version};
}

PutOutcome put_outcome(const PutAnswer& answer, const nlohmann::json& input) {
  switch (answer.code) {
    case 0:
      return PutOutcome::created;
    case 1:
      return PutOutcome::duplicate;
    case 3:
      // The input written differently (1 and 1.0): the same request when the two parse to the
      // same JSON, as the other stores decide (parsed here: on the caller's thread unbatched, on
      // the batch thread when batched).
      return same_input(answer.stored_input, input) ? PutOutcome::duplicate : PutOutcome::conflict;
    default:
      return PutOutcome::conflict;
  }
}

}  // namespace

PutOutcome RedisJobStore::put(const Job& job, const std::optional<Lease>& claim) {
  if (impl_->options.batch_writes) {
    // async_put, waited for: one way to read a batched put's answer.
    auto answered = std::make_shared<std::promise<PutOutcome>>();
    std::future<PutOutcome> outcome = answered->get_future();
    async_put(job, claim, [answered](std::exception_ptr error, PutOutcome o) {
      if (error) return answered->set_exception(error);
      answered->set_value(o);
    });
    return outcome.get();
  }
  PutAnswer answer;
  try {
    Reply r = impl_->script(kScriptPut, put_args(job, claim, impl_->retention_ms()));
    answer = put_answer(r.get());
  } catch (const OutOfMemory&) {
    return PutOutcome::full;
  }
  return put_outcome(answer, job.input);
}

void RedisJobStore::async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) {
  if (!impl_->options.batch_writes) return JobStore::async_put(job, claim, std::move(done));
  std::vector<std::string> args;
  try {
    args = put_args(job, claim, impl_->retention_ms());
  } catch (...) {
    return done(std::current_exception(), PutOutcome::created);
  }
  // The input's text, for the rare answer that needs it (a duplicate written differently): the
  // job need not outlive this call.
  std::string input_text = args[2];
  // Redis at maxmemory answers `full`, as put does.
  PutDone answer = [done = std::move(done)](std::exception_ptr error, PutOutcome outcome) {
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const OutOfMemory&) {
        return done(nullptr, PutOutcome::full);
      } catch (...) {
      }
    }
    done(error, outcome);
  };
  impl_->start_write(
      kScriptPut, std::move(args), std::move(answer),
      [ours = std::move(input_text)](const redisReply* r) {
        const PutAnswer answer = put_answer(r);
        if (answer.code != 3) return put_outcome(answer, nullptr);
        nlohmann::json input;
        if (detail::parse_untrusted_json(ours, input, SIZE_MAX) != detail::JsonParseError::none)
          return PutOutcome::conflict;
        return put_outcome(answer, input);
      });
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
      out.push_back(put_outcome(answers[i].get(), requests[i].job->input));
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
    throw StoreUnavailable(impl_->client.failed(e.what()));
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) return std::nullopt;
  return read_record(id, r.get());
}

std::vector<JobRecord> RedisJobStore::claim_jobs(std::size_t max, const Lease& lease,
                                                 TimePoint now) {
  return impl_->claim("jobs", max, lease, now);
}

std::vector<JobRecord> RedisJobStore::claim_jobs_except(std::size_t max, const Lease& lease,
                                                        TimePoint now,
                                                        const std::vector<ModelRef>& skip) {
  return impl_->claim("jobs", max, lease, now, skip);
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

std::vector<std::optional<JobRecord>> RedisJobStore::get_many(
    const std::vector<std::string>& ids) const {
  // A pipeline a slice: what one round trip holds (and the replies this process keeps at once)
  // stays bounded however many ids a caller asks for.
  constexpr std::size_t slice = 256;
  std::vector<std::optional<JobRecord>> out;
  out.reserve(ids.size());
  if (ids.empty()) return out;
  if (impl_->options.batch_writes) impl_->fence();  // (this thread reads its own writes)
  for (std::size_t first = 0; first < ids.size(); first += slice) {
    const std::size_t end = std::min(ids.size(), first + slice);
    std::vector<std::vector<std::string>> reads;
    reads.reserve(end - first);
    for (std::size_t i = first; i < end; ++i)
      reads.push_back({"HGETALL", impl_->options.key_prefix + ":job:" + ids[i]});
    std::vector<Reply> replies = impl_->client.run_all(reads);
    const bool refused = std::any_of(replies.begin(), replies.end(),
                                     [](const Reply& r) { return r->type == REDIS_REPLY_ERROR; });
    for (std::size_t i = first; i < end; ++i) {
      // An error (a MOVED after a failover, a Redis loading its data): the slice is read one by
      // one, as get does, which follows the route or fails the store.
      if (refused) {
        out.push_back(get(ids[i]));
        continue;
      }
      const redisReply* r = replies[i - first].get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        out.emplace_back();
      } else {
        out.emplace_back(read_record(ids[i], r));
      }
    }
  }
  return out;
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
  args.emplace_back();  // started: finish.lua's ARGV[O + 14] (fold_marks fills it in)
  args.push_back(outcome.ran_on_version);
  args.emplace_back();  // '1': answer the hash (finish_answer)
  assert(args.size() == finish_arg_count && args[finish_started_arg].empty());
  return args;
}

// What finish.lua answers: 0 (not held), 1, or the job's hash as written (asked for with its
// last argument '1').
JobStore::FinishAnswer finish_answer(const std::string& id, const redisReply* r) {
  JobStore::FinishAnswer out;
  if (r && r->type == REDIS_REPLY_ARRAY) {
    out.held = true;
    if (r->elements > 0) out.record = read_record(id, r);
  } else {
    out.held = is_one(r);
  }
  return out;
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
                                     TimePoint now, bool want_record, FinishDone done) {
  std::vector<std::string> args;
  try {
    args = finish_args(id, holder, outcome, deliver, now, impl_->retention_ms());
  } catch (...) {
    return done(std::current_exception(), FinishAnswer{});
  }
  if (want_record) args.back() = "1";
  if (!impl_->options.batch_writes) {
    FinishAnswer answer;
    try {
      Reply r = impl_->script(kScriptFinish, std::move(args));
      answer = finish_answer(id, r.get());
    } catch (...) {
      return done(std::current_exception(), FinishAnswer{});
    }
    return done(nullptr, std::move(answer));
  }
  impl_->start_write(kScriptFinish, std::move(args), std::move(done),
                     [id](const redisReply* r) { return finish_answer(id, r); });
}

JobStore::AnswerThread RedisJobStore::answer_thread(AsyncCall, bool) const noexcept {
  // The batch thread answers the writes it gathers, puts too; unbatched, each call is a round
  // trip on the caller's thread.
  return impl_->options.batch_writes ? AnswerThread::store : AnswerThread::caller;
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
  std::vector<std::string> args;
  try {
    args = attempt_args(id, holder, after, now, attempt, impl_->retention_ms());
  } catch (...) {
    return done(std::current_exception(), false);  // (answered, as async_finish_job's are)
  }
  impl_->start_write(kScriptRecordAttempt, std::move(args), std::move(done), is_one);
}

CancelOutcome RedisJobStore::cancel(const std::string& id, const JobOutcome& outcome,
                                    TimePoint now) {
  std::vector<std::string> args{id, ms_text(now), impl_->retention_ms()};
  append_outcome(args, outcome);
  args.push_back(ms_text(outcome.finished_at));
  Reply r = impl_->script(kScriptCancel, std::move(args));
  switch (integer_answer(r.get(), "cancel")) {
    case 1:
      return CancelOutcome::cancelled;
    case 2:
      return CancelOutcome::already_finished;
    case 0:
      return CancelOutcome::not_found;
    default:
      throw StoreUnavailable("redis job store: unexpected answer to cancel");
  }
}

RedeliverOutcome RedisJobStore::redeliver(const std::string& id, const Lease& claim,
                                          TimePoint now) {
  Reply r = impl_->script(kScriptRedeliver, {id, claim.holder, ms_text(claim.until), ms_text(now)});
  switch (integer_answer(r.get(), "redeliver")) {
    case 1:
      return RedeliverOutcome::redelivered;
    case 2:
      return RedeliverOutcome::not_failed;
    case 0:
      return RedeliverOutcome::not_found;
    default:
      throw StoreUnavailable("redis job store: unexpected answer to redeliver");
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
  impl_->script(kScriptServers, {id.empty() ? "?" : id, ms_text(now), std::to_string(leases),
                                 impl_->retention_ms()});
}

bool RedisJobStore::set_origin_paused(const std::string& origin, bool paused) {
  if (origin.empty()) return true;
  Reply r = impl_->script(kScriptPaused, {origin, paused ? "1" : "0"});
  return !(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);  // 0: at the cap
}

std::optional<std::vector<std::string>> RedisJobStore::paused_origins() const {
  Reply r = impl_->script(kScriptPaused, {"", ""}, false);  // (a read)
  // Not an answer to trust: nothing is resumed on it.
  if (!r || r->type != REDIS_REPLY_ARRAY)
    throw StoreUnavailable("redis job store: unexpected answer to the paused origins");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < r->elements; ++i)
    out.emplace_back(text(r->element[i]));
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::uint64_t> RedisJobStore::put_model_config(const std::string& name,
                                                             const std::string& config,
                                                             std::uint64_t if_generation) {
  if (name.empty()) throw std::invalid_argument("redis job store: a model config needs a name");
  Reply r = impl_->script(kScriptModels, {name, config, std::to_string(if_generation)});
  if (r && r->type == REDIS_REPLY_INTEGER && r->integer < 0) {
    throw StoreUnavailable("redis job store: 10,000 model configs are stored already");
  }
  if (r && r->type == REDIS_REPLY_INTEGER) return std::nullopt;  // changed meanwhile
  if (!r || r->type != REDIS_REPLY_ARRAY)
    throw StoreUnavailable("redis job store: unexpected answer to a model config's write");
  return if_generation + 1;
}

std::optional<std::vector<ModelConfig>> RedisJobStore::model_configs() const {
  Reply r = impl_->script(kScriptModels, {"", "", "0"}, false);  // (a read)
  if (!r || r->type != REDIS_REPLY_ARRAY)
    throw StoreUnavailable("redis job store: unexpected answer to the model configs");
  std::vector<ModelConfig> out;
  for (std::size_t i = 0; i + 2 < r->elements; i += 3) {
    ModelConfig c;
    c.name = std::string(text(r->element[i]));
    c.generation = static_cast<std::uint64_t>(number(text(r->element[i + 1])));
    c.config = std::string(text(r->element[i + 2]));
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<ModelRef> RedisJobStore::waiting_versions(const std::vector<ModelRef>& versions,
                                                      TimePoint since) const {
  std::vector<ModelRef> out;
  if (versions.empty()) return out;
  std::string asked;  // "name version" lines (names and versions hold neither)
  for (const ModelRef& ref : versions)
    asked += ref.name + ' ' + ref.version + '\n';
  // (Each call starts at another tenant: a walk cut short by its bound moves on.)
  const std::uint64_t turn = impl_->waiting_turn.fetch_add(1, std::memory_order_relaxed);
  Reply r = impl_->script(kScriptWaiting, {ms_text(since), std::move(asked), std::to_string(turn)},
                          false);  // (a read)
  if (!r || r->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i < r->elements; ++i) {
    const std::string_view line = text(r->element[i]);
    const auto space = line.find(' ');
    if (space == std::string_view::npos) continue;
    out.push_back({std::string(line.substr(0, space)), std::string(line.substr(space + 1))});
  }
  return out;
}

std::vector<ServerSeen> RedisJobStore::servers(TimePoint now) const {
  Reply r = impl_->script(kScriptServers, {"", ms_text(now), "0", "0"});
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
  return impl_->client.failure(impl_->options.key_prefix + ":probe");
}

}  // namespace rebound

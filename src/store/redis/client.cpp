// The Redis store's client (client.hpp): pooled hiredis connections, failure state, and routing on
// a Redis Cluster.
#include "store/redis/client.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "rebound/error.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound::detail::redis {

namespace {

// Redirections followed for one call at most: a slot that keeps moving is a cluster being
// resharded in a loop, answered as unavailable rather than chased.
constexpr int kMaxRedirects = 5;

// The slot map is asked for with short timeouts: a node that is down is passed over quickly.
constexpr std::chrono::milliseconds kMapStep{500};

}  // namespace

Reply command(redisContext* c, const std::vector<std::string>& args) {
  append(c, args);
  Reply reply = read_reply(c);
  if (reply->type == REDIS_REPLY_ERROR) throw ErrorReply(std::string(text(reply.get())));
  return reply;
}

void append(redisContext* c, const std::vector<std::string>& args) {
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

Reply read_reply(redisContext* c) {
  void* reply = nullptr;
  if (redisGetReply(c, &reply) != REDIS_OK || !reply) {
    throw ConnectionLost(c->err == REDIS_ERR_IO && c->errstr[0] == '\0'
                             ? std::string("I/O error: ") + std::strerror(errno)
                             : std::string(c->errstr));
  }
  return Reply(static_cast<redisReply*>(reply));
}

// Checked before an idle connection is used, so that a Redis restarted between two calls costs no
// failed call: it is readable, hung up or in error. (A connection cut without a word, by a
// network, still fails the call that finds it.)
bool closed_by_redis(const redisContext* c) {
  pollfd p{c->fd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

bool connection_state_error(const char* what) {
  for (const char* prefix :
       {"LOADING", "READONLY", "MASTERDOWN", "NOAUTH", "NOPERM", "CLUSTERDOWN"}) {
    if (std::strncmp(what, prefix, std::strlen(prefix)) == 0) return true;
  }
  return false;
}

Client::Client(RedisJobStoreOptions options, std::string routing_key)
    : options_(std::move(options)),
      slot_(key_slot(routing_key)),
      target_{options_.host, options_.port},
      nodes_{target_} {}

std::int64_t Client::steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::chrono::milliseconds Client::unanswered_for() const {
  if (waiting_calls_.load(std::memory_order_relaxed) == 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(steady_ms() - last_answer_ms_.load(std::memory_order_relaxed));
}

Client::Waiting::Waiting(Client& client) : client_(client) {
  // The first waiter starts the clock: an idle store has nothing outstanding.
  if (client_.waiting_calls_.fetch_add(1) == 0) client_.last_answer_ms_ = steady_ms();
}

Client::Waiting::~Waiting() {
  client_.last_answer_ms_ = steady_ms();
  client_.waiting_calls_.fetch_sub(1);
}

std::string Client::where() const {
  std::lock_guard<std::mutex> lock(route_mutex_);
  return target_.text();
}

// A new connection to `node`: connected, authenticated, the database selected. (Scripts are
// Redis's, not a connection's: the store loads them, and again when a node forgot them.)
Context Client::open(const NodeAddress& node, std::chrono::milliseconds connect_timeout,
                     std::chrono::milliseconds command_timeout) {
  Context c(redisConnectWithTimeout(node.host.c_str(), node.port, to_timeval(connect_timeout)));
  if (!c) throw ConnectionLost("cannot allocate a connection");
  if (c->err) throw ConnectionLost(std::string("cannot connect: ") + c->errstr);
  redisSetTimeout(c.get(), to_timeval(command_timeout));
  // A connection dropped by a firewall or NAT while idle is noticed instead of waited on.
  redisEnableKeepAlive(c.get());
  try {
    if (!options_.password.empty()) {
      if (options_.username.empty()) {
        command(c.get(), {"AUTH", options_.password});
      } else {
        command(c.get(), {"AUTH", options_.username, options_.password});
      }
    }
    if (options_.db != 0) command(c.get(), {"SELECT", std::to_string(options_.db)});
  } catch (const ErrorReply& e) {
    throw ConnectionLost(e.what());
  }
  return c;
}

Context Client::connect_seed() {
  return open(NodeAddress{options_.host, options_.port}, options_.connect_timeout,
              options_.command_timeout);
}

Context Client::route_from(Context seed) {
  // Asked with INFO, else (a user INFO is denied to) with CLUSTER INFO, which a Redis without
  // cluster support refuses as such; a Redis that answers neither is taken for a single one.
  try {
    Reply info = command(seed.get(), {"INFO", "cluster"});
    cluster_ = text(info.get()).find("cluster_enabled:1") != std::string_view::npos;
  } catch (const ErrorReply&) {
    try {
      Reply info = command(seed.get(), {"CLUSTER", "INFO"});
      cluster_ = text(info.get()).find("cluster_state:") != std::string_view::npos;
    } catch (const ErrorReply&) {
    }
  }
  if (!cluster_) return seed;
  const NodeAddress asked{options_.host, options_.port};
  SlotMap map;
  std::string seed_id;
  try {
    Reply slots = command(seed.get(), {"CLUSTER", "SLOTS"});
    map = read_slot_map(slots.get(), slot_, asked.host);
  } catch (const ErrorReply& e) {
    throw Error(std::string("redis store: CLUSTER SLOTS refused: ") + e.what());
  }
  try {
    Reply id = command(seed.get(), {"CLUSTER", "MYID"});
    seed_id = std::string(text(id.get()));
  } catch (const ErrorReply&) {
    // Refused (a restricted user): the seed is then told by its address alone.
  }
  if (!map.master) {
    throw Error("redis store: the cluster at " + asked.text() + " serves slot " +
                std::to_string(slot_) + " (the key prefix's) from no master");
  }
  // The seed serves the slot itself: known by its id, not its address (a node may announce
  // another, behind NAT or a container's port mapping), and kept as given.
  const bool seed_serves = seed_id.empty() ? *map.master == asked : seed_id == map.master_id;
  {
    std::lock_guard<std::mutex> lock(route_mutex_);
    target_ = seed_serves ? asked : *map.master;
    nodes_ = {asked};
    for (auto& n : map.nodes)
      if (std::find(nodes_.begin(), nodes_.end(), n) == nodes_.end()) nodes_.push_back(n);
  }
  if (seed_serves) return seed;
  return open(*map.master, options_.connect_timeout, options_.command_timeout);
}

void Client::route_doubtful() {
  std::lock_guard<std::mutex> lock(route_mutex_);
  doubtful_ = true;
}

// Asks the nodes known, the current target last, which master serves the slot now. True when one
// answered (the route is then what it said).
bool Client::refresh_route() {
  std::unique_lock<std::mutex> one_at_a_time(refresh_mutex_, std::try_to_lock);
  if (!one_at_a_time.owns_lock()) return false;  // another thread is asking: go by the route now
  std::vector<NodeAddress> ask;
  NodeAddress current;
  {
    std::lock_guard<std::mutex> lock(route_mutex_);
    ask = nodes_;
    current = target_;
  }
  std::stable_partition(ask.begin(), ask.end(), [&](const NodeAddress& n) { return n != current; });
  for (const NodeAddress& node : ask) {
    SlotMap map;
    try {
      Context c = open(node, std::min(options_.connect_timeout, kMapStep),
                       std::min(options_.command_timeout, kMapStep));
      Reply slots = command(c.get(), {"CLUSTER", "SLOTS"});
      map = read_slot_map(slots.get(), slot_, node.host);
    } catch (const std::exception&) {
      continue;  // down, or not a cluster node any more: the next one is asked
    }
    if (!map.master) continue;
    bool moved = false;
    {
      std::lock_guard<std::mutex> lock(route_mutex_);
      moved = target_ != *map.master;
      target_ = *map.master;
      // The nodes of this map, and the one first given (addresses that left the cluster are not
      // asked again).
      const NodeAddress seed{options_.host, options_.port};
      nodes_ = {seed};
      for (auto& n : map.nodes)
        if (std::find(nodes_.begin(), nodes_.end(), n) == nodes_.end()) nodes_.push_back(n);
      doubtful_ = false;
    }
    if (moved) drop_idle();
    return true;
  }
  return false;
}

void Client::move_to(const NodeAddress& node) {
  {
    std::lock_guard<std::mutex> lock(route_mutex_);
    if (target_ == node) return;
    target_ = node;
    if (std::find(nodes_.begin(), nodes_.end(), node) == nodes_.end()) nodes_.push_back(node);
  }
  drop_idle();  // connections to the node the slot left
}

// A redirection in `error`, answered on `from`: an empty host is that connection's.
std::optional<Redirect> Client::redirect_of(std::string_view error,
                                            const redisContext* from) const {
  auto redirect = parse_redirect(error);
  if (redirect && redirect->node.host.empty()) {
    if (!from || !from->tcp.host) return std::nullopt;
    redirect->node.host = from->tcp.host;
  }
  return redirect;
}

bool Client::follow(std::string_view error, const redisContext* from) {
  if (!cluster_) return false;
  const auto redirect = redirect_of(error, from);
  if (!redirect || redirect->ask) {
    if (error.substr(0, 6) == "MOVED " || error.substr(0, 4) == "ASK ") route_doubtful();
    return false;
  }
  move_to(redirect->node);
  return true;
}

bool Client::is_routed(const redisContext* c) const {
  std::lock_guard<std::mutex> lock(route_mutex_);
  return c->tcp.port == target_.port && c->tcp.host && target_.host == c->tcp.host;
}

Context Client::connect() {
  return connect(options_.connect_timeout, options_.command_timeout);
}

Context Client::connect(std::chrono::milliseconds connect_timeout,
                        std::chrono::milliseconds command_timeout) {
  return connect(connect_timeout, command_timeout, true);
}

Context Client::connect(std::chrono::milliseconds connect_timeout,
                        std::chrono::milliseconds command_timeout, bool may_refresh) {
  if (cluster_ && may_refresh) {
    bool doubtful = false;
    {
      std::lock_guard<std::mutex> lock(route_mutex_);
      doubtful = doubtful_;
    }
    if (doubtful) refresh_route();
  }
  NodeAddress to;
  {
    std::lock_guard<std::mutex> lock(route_mutex_);
    to = target_;
  }
  try {
    return open(to, connect_timeout, command_timeout);
  } catch (const ConnectionLost&) {
    if (cluster_) route_doubtful();  // a failover may have moved the slot
    throw;
  }
}

Context Client::connect_after_backoff() {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_.empty() && std::chrono::steady_clock::now() < reconnect_at_)
      throw StoreUnavailable(failure_);
  }
  try {
    return connect();
  } catch (const std::exception& e) {
    // (Anything a connection fails with is the store's state: /ping hears of it at once.)
    throw StoreUnavailable(failed(e.what(), true));
  }
}

void Client::adopt(Context c) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  idle_.push_back(std::move(c));
  ++open_;
}

Context Client::acquire() {
  std::unique_lock<std::mutex> lock(pool_mutex_);
  pool_returned_.wait(lock, [&] { return !idle_.empty() || open_ < options_.connections; });
  while (!idle_.empty()) {
    Context c = std::move(idle_.back());
    idle_.pop_back();
    if (!closed_by_redis(c.get())) return c;
    --open_;  // (closed as `c` goes; a new one takes its place below)
  }
  ++open_;
  lock.unlock();
  {
    std::lock_guard<std::mutex> failure_lock(failure_mutex_);
    if (!failure_.empty() && std::chrono::steady_clock::now() < reconnect_at_) {
      const std::string why = failure_;
      give_up_slot();
      throw StoreUnavailable(why);
    }
  }
  try {
    return connect();
  } catch (const std::exception& e) {
    give_up_slot();
    throw StoreUnavailable(failed(std::string(e.what()), true));
  } catch (...) {
    give_up_slot();
    throw;
  }
}

void Client::give_up_slot() {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  --open_;
  pool_returned_.notify_one();
}

void Client::give_back(Context c) {
  // A connection to a node the slot has left is closed, not pooled.
  if (cluster_ && !is_routed(c.get())) {
    c.reset();
    give_up_slot();
    return;
  }
  std::lock_guard<std::mutex> lock(pool_mutex_);
  idle_.push_back(std::move(c));
  pool_returned_.notify_one();
}

// A pooled connection that cannot serve any more (lost, or its node cannot answer): it is closed
// and its slot freed, the idle ones go with it (drop_idle), and on a cluster the route is asked
// again.
void Client::lose(Context& c) {
  c.reset();
  give_up_slot();
  drop_idle();
  if (cluster_) route_doubtful();
}

// A connection was lost, or the slot moved: the others idle in the pool went with it (a Redis
// restart closes them all), so they are closed now rather than failing one call each.
void Client::drop_idle() {
  std::vector<Context> dropped;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    dropped.swap(idle_);
    open_ -= dropped.size();
    pool_returned_.notify_all();
  }
}

std::vector<std::string> Client::wait_command(std::chrono::milliseconds timeout) const {
  return {"WAIT", std::to_string(options_.replicas), std::to_string(timeout.count())};
}

std::optional<std::string> Client::short_of_replicas(const redisReply* reply) const {
  if (reply && reply->type == REDIS_REPLY_ERROR) {
    return "redis job store (" + where() +
           "): WAIT (?replicas=) refused: " + std::string(text(reply));
  }
  const long long reached = reply && reply->type == REDIS_REPLY_INTEGER ? reply->integer : 0;
  if (reached >= static_cast<long long>(options_.replicas)) return std::nullopt;
  return "redis job store (" + where() + "): written, but " + std::to_string(reached) + " of the " +
         std::to_string(options_.replicas) + " replicas asked for (?replicas=) had it within " +
         std::to_string(options_.replica_timeout.count()) + " ms: not acknowledged";
}

// Writes and reads on `c`, a connection taken from the pool, timed as a call in flight (Waiting).
// A lost connection is closed with its slot (lose) and fails the store; any other error closes it
// and frees its slot (its answers may be unread).
template <typename Io>
void Client::exchange(Context& c, Io&& io) {
  try {
    Waiting waiting(*this);
    io();
  } catch (const ConnectionLost& e) {
    lose(c);
    throw StoreUnavailable(failed(e.what()));
  } catch (...) {
    c.reset();
    give_up_slot();
    throw;
  }
}

Reply Client::run(const std::vector<std::string>& args, bool wait) {
  wait = wait && waits_for_replicas();
  for (int hop = 0;; ++hop) {
    Context c = acquire();
    Reply reply, waited;
    exchange(c, [&] {
      append(c.get(), args);
      if (wait) append(c.get(), wait_command());
      reply = read_reply(c.get());
      if (wait) waited = read_reply(c.get());
    });
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string what(text(reply.get()));
      if (cluster_ && (what.rfind("MOVED ", 0) == 0 || what.rfind("ASK ", 0) == 0)) {
        const auto redirect = redirect_of(what, c.get());
        if (redirect && !redirect->ask && hop < kMaxRedirects) {
          move_to(redirect->node);
          give_back(std::move(c));  // (closed: the route moved away from it)
          continue;
        }
        // An ASK (the slot is moving: a script's keys would be split between two nodes), a
        // redirection that cannot be read, or one too many: this call fails, the route is asked
        // for again.
        c.reset();
        give_up_slot();
        route_doubtful();
        throw StoreUnavailable("redis job store (" + where() + "): " + what +
                               (redirect && redirect->ask
                                    ? " (the queue's slot is being migrated; stop its servers "
                                      "while resharding it)"
                                    : ""));
      }
      if (connection_state_error(what.c_str())) {
        lose(c);
        throw StoreUnavailable(failed(what));
      }
      give_back(std::move(c));
      throw ErrorReply(what);
    }
    give_back(std::move(c));
    if (wait) {
      if (auto shortfall = short_of_replicas(waited.get())) {
        // Until enough replicas are back no write can be acknowledged: the store fails (/ping
        // says so), and the next write or look tries again at once.
        throw StoreUnavailable(replicas_missing(*shortfall));
      }
      replicas_worked();
    } else {
      worked();
    }
    return reply;
  }
}

std::vector<Reply> Client::run_all(const std::vector<std::vector<std::string>>& commands) {
  std::vector<Reply> replies;
  if (commands.empty()) return replies;
  replies.reserve(commands.size());
  Context c = acquire();
  exchange(c, [&] {
    for (const auto& args : commands)
      append(c.get(), args);
    for (std::size_t i = 0; i < commands.size(); ++i)
      replies.push_back(read_reply(c.get()));
  });
  bool state_error = false, all_worked = true;
  for (const Reply& reply : replies) {
    if (reply->type != REDIS_REPLY_ERROR) continue;
    all_worked = false;
    if (connection_state_error(reply->str)) state_error = true;
  }
  if (state_error) {
    // The connection cannot serve (LOADING, READONLY): it goes, and the caller's run, which tries
    // again, fails the store as a single call would.
    lose(c);
  } else {
    give_back(std::move(c));
  }
  if (all_worked) worked();
  return replies;
}

std::string Client::failed(const std::string& why, bool connecting) {
  // On a cluster, whatever failed may be a failover: the next connection asks for the slot map.
  if (cluster_) route_doubtful();
  const std::string at = where();
  std::lock_guard<std::mutex> lock(failure_mutex_);
  failure_ = "redis job store (" + at + "): " + why;
  if (connecting) {
    reconnect_delay_ = reconnect_delay_.count() == 0
                           ? options_.reconnect_min
                           : std::min(options_.reconnect_max, reconnect_delay_ * 2);
    reconnect_at_ = std::chrono::steady_clock::now() + reconnect_delay_;
  }
  failing_ = true;
  return failure_;
}

std::string Client::replicas_missing(const std::string& why) {
  replicas_short_ = true;
  return failed(why);
}

void Client::replicas_worked() {
  replicas_short_ = false;
  worked();
}

void Client::worked() {
  if (!failing_.load(std::memory_order_relaxed)) return;
  // A read that worked says nothing of the replicas a write needs.
  if (replicas_short_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(failure_mutex_);
  failure_.clear();
  reconnect_delay_ = std::chrono::milliseconds(0);
  reconnect_at_ = {};
  failing_ = false;
}

std::string Client::failure_text() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

std::optional<std::string> Client::failure(const std::string& probe_key) {
  if (!failing_.load(std::memory_order_relaxed)) {
    const auto silent = unanswered_for();
    if (silent < options_.unanswered_limit) return std::nullopt;
    return "redis job store (" + where() + "): no answer for " + std::to_string(silent.count()) +
           " ms (Redis is frozen, overloaded or cut off)";
  }
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_.empty()) return std::nullopt;
    if (std::chrono::steady_clock::now() < reconnect_at_) return failure_;
  }
  // Time to look again, by one caller at a time (the others answer from the last look): a small
  // write, since a Redis can answer reads while it refuses writes (a replica, maxmemory).
  if (probing_.exchange(true)) {
    const std::string why = failure_text();
    return why.empty() ? std::nullopt : std::optional<std::string>(why);
  }
  // On a connection of its own, each step within 400 ms (connecting, AUTH, SELECT and the write
  // take 1.6 s at the most), so that a /ping never waits longer than SageMaker allows (2 s) on a
  // Redis that accepts connections and never answers.
  constexpr std::chrono::milliseconds probe_step{400};
  std::optional<std::string> out;
  try {
    // (No slot map asked for here, which could take longer: the calls that fail do that.)
    Context c = connect(std::min(options_.connect_timeout, probe_step),
                        std::min(options_.command_timeout, probe_step), false);
    const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::system_clock::now().time_since_epoch());
    append(c.get(), {"SET", probe_key, std::to_string(now.count())});
    // (Its WAIT well within the step.)
    if (waits_for_replicas()) append(c.get(), wait_command(probe_step / 2));
    Reply set = read_reply(c.get());
    Reply waited = waits_for_replicas() ? read_reply(c.get()) : nullptr;
    if (set->type == REDIS_REPLY_ERROR) throw ErrorReply(std::string(text(set.get())));
    if (waited) {
      // (Redis answered: short of replicas is not a connection's failure, no backoff.)
      if (auto shortfall = short_of_replicas(waited.get())) throw ErrorReply(*shortfall);
      replicas_worked();
    } else {
      worked();
    }
  } catch (const ErrorReply& e) {
    if (cluster_) route_doubtful();  // (a MOVED: the next call asks for the slot map)
    const std::string why = failure_text();
    out = why.empty() ? std::string("redis job store: ") + e.what() : why;
  } catch (const std::exception& e) {
    // A connection that failed is the store's like any other: the backoff grows, and the callers
    // until it ends (a /ping a second on the one HTTP thread) answer from this look instead of
    // waiting up to 1.6 s each on a Redis that does not answer.
    out = failed(std::string("probe: ") + e.what(), true);
  }
  probing_ = false;
  return out;
}

}  // namespace rebound::detail::redis

// The Redis store's client: a pool of hiredis connections to the node that serves the store, the
// store's failure state and its reconnect backoff, and on a Redis Cluster the routing of every call
// to the node that owns the store's slot (following MOVED and ASK, and finding the new master
// after a failover). With `replicas`, a script call is acknowledged only once that many replicas
// hold its writes (WAIT). Internal to rebound::redis (src/store/redis); not installed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rebound/store/redis_job_store.hpp"
#include "store/redis/cluster.hpp"
#include "store/redis/reply.hpp"

namespace rebound::detail::redis {

// One command on a connection. Throws ConnectionLost, or ErrorReply for an error reply.
Reply command(redisContext* c, const std::vector<std::string>& args);

// Pipelining: a command written into the connection's buffer, and a reply read (writing what is
// buffered first). Both throw ConnectionLost; an error reply is returned, not thrown.
void append(redisContext* c, const std::vector<std::string>& args);
Reply read_reply(redisContext* c);

// True when Redis closed a connection that awaits no answer (a restart closes them all).
bool closed_by_redis(const redisContext* c);

// Error replies that say the node cannot serve this connection now (restarting, a replica, an
// authentication lost, a cluster without a majority): the connection is dropped, and a new one
// may reach a new primary.
bool connection_state_error(const char* what);

class Client {
 public:
  // `options` names the node first asked (on a cluster: any node), how to log in, the pool and
  // the timeouts; `routing_key` is a key of the store's slot (all its keys share one).
  Client(RedisJobStoreOptions options, std::string routing_key);

  const RedisJobStoreOptions& options() const { return options_; }

  // The first connection, to the node the options name. Throws ConnectionLost.
  Context connect_seed();

  // Asks `seed` whether it is a cluster node; if so, learns the slot map and where the store's
  // slot is served, and answers a connection to that node (`seed` itself when it serves it).
  // Throws ConnectionLost, or rebound::Error when the map names no master for the slot.
  Context route_from(Context seed);

  bool cluster() const { return cluster_; }

  // Puts a connection into the pool (the constructor's first one).
  void adopt(Context c);

  // One command on a pooled connection, on the node that serves the store: a MOVED is followed
  // (the route moves, the pool with it). An ASK (the slot is being migrated) is not: a script's
  // keys would be split between two nodes, so the call fails (StoreUnavailable) and the route is
  // asked again. With `wait` and `replicas`, a WAIT goes behind it: a write that reached fewer
  // replicas throws StoreUnavailable. A lost connection throws StoreUnavailable; an error reply
  // ErrorReply.
  Reply run(const std::vector<std::string>& args, bool wait = false);

  // Several commands pipelined on one pooled connection (one round trip), their replies in
  // order. Error replies are handed back as replies, not thrown (a MOVED is not followed: the
  // caller tries again with run); a lost connection throws StoreUnavailable.
  std::vector<Reply> run_all(const std::vector<std::vector<std::string>>& commands);

  // A new connection to the node that serves the store (refreshing the slot map first when a
  // failure made it doubtful), with the options' timeouts or the ones given. Throws
  // ConnectionLost.
  Context connect();
  Context connect(std::chrono::milliseconds connect_timeout,
                  std::chrono::milliseconds command_timeout);

  // connect(), unless a failed connect is still backing off; throws StoreUnavailable.
  Context connect_after_backoff();

  // For a caller with a connection of its own (the batch writer), whose answer on `from` was
  // `error`: true when it is a MOVED (the route now points where it says: connect again and
  // resend). Any other redirection makes the route doubtful.
  bool follow(std::string_view error, const redisContext* from);

  // The command that waits for `replicas` replicas (WAIT n ms), and what a reply to it means:
  // nullopt when enough replicas have the writes, else why the call is not acknowledged.
  bool waits_for_replicas() const { return options_.replicas > 0; }
  std::vector<std::string> wait_command() const { return wait_command(options_.replica_timeout); }
  std::vector<std::string> wait_command(std::chrono::milliseconds timeout) const;
  std::optional<std::string> short_of_replicas(const redisReply* reply) const;

  // The store's failure state: `failed` notes why it fails (a failed connect, `connecting`, also
  // backs the next connects off); `worked` clears it. `replicas_missing` notes a write that fewer
  // replicas than asked had in time: only a write that they had (`replicas_worked`) clears that,
  // not a read that worked. Both answer the failure they noted, for the caller to throw (the
  // state itself may be cleared meanwhile by a look that found the store working again).
  std::string failed(const std::string& why, bool connecting = false);
  void worked();
  std::string replicas_missing(const std::string& why);
  void replicas_worked();
  std::string failure_text() const;
  // What failure() reports: nullopt while the store works; else why, looking again (one caller at
  // a time, with a small write of `probe_key`) once the backoff allows.
  std::optional<std::string> failure(const std::string& probe_key);

  // Held around each round trip: a node that stops answering is seen within `unanswered_limit`.
  class Waiting {
   public:
    explicit Waiting(Client& client);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    Client& client_;
  };

  // Where calls go now ("host:port").
  std::string where() const;

 private:
  static std::int64_t steady_ms();
  std::chrono::milliseconds unanswered_for() const;
  Context open(const NodeAddress& node, std::chrono::milliseconds connect_timeout,
               std::chrono::milliseconds command_timeout);
  Context connect(std::chrono::milliseconds connect_timeout,
                  std::chrono::milliseconds command_timeout, bool may_refresh);
  bool refresh_route();
  std::optional<Redirect> redirect_of(std::string_view error, const redisContext* from) const;
  void move_to(const NodeAddress& node);
  void route_doubtful();
  bool is_routed(const redisContext* c) const;
  Context acquire();
  void give_up_slot();
  void give_back(Context c);
  void drop_idle();
  void lose(Context& c);
  template <typename Io>
  void exchange(Context& c, Io&& io);

  RedisJobStoreOptions options_;
  const std::uint16_t slot_;
  bool cluster_ = false;  // set by route_from, before any other thread calls

  // Where calls go, the nodes known (asked for the slot map when the route is doubtful), and
  // whether it is: a lost connection or a CLUSTERDOWN may mean a failover moved the slot.
  mutable std::mutex route_mutex_;
  NodeAddress target_;
  std::vector<NodeAddress> nodes_;
  bool doubtful_ = false;
  std::mutex refresh_mutex_;  // one thread asks for the slot map at a time; the others go on

  // The pool: idle connections, and how many are open (idle or in use).
  std::mutex pool_mutex_;
  std::condition_variable pool_returned_;
  std::vector<Context> idle_;
  std::size_t open_ = 0;

  // Why the store fails, while it does; new connections wait for `reconnect_at_`.
  mutable std::mutex failure_mutex_;
  std::string failure_;
  std::chrono::steady_clock::time_point reconnect_at_{};
  std::chrono::milliseconds reconnect_delay_{0};
  std::atomic<bool> failing_{false};
  std::atomic<bool> replicas_short_{false};
  std::atomic<bool> probing_{false};

  // Calls waiting for Redis now, and when Redis last answered one (steady clock, ms).
  std::atomic<int> waiting_calls_{0};
  std::atomic<std::int64_t> last_answer_ms_{steady_ms()};
};

}  // namespace rebound::detail::redis

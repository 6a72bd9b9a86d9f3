// Console: the operator console of rebound::Server: its embedded page, and the JSON routes it
// reads (docs/console.md). Who may call what is the Server's to decide; this answers.
#pragma once

#include "http_message.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rebound/job_queue.hpp"

namespace rebound::detail {

/// The queue's numbers as GET /v1/stats and the console's overview show them: queued, running,
/// oldest_queued_seconds, queued_by_priority, callbacks_waiting, callbacks_failed.
nlohmann::json queue_stats_json(const QueueStats& stats);

/// Thread-safe; starts one thread (the rate sampler), joined by the destructor.
class Console {
 public:
  /// `tenants`: the named tenants of the server (empty with one tenant).
  Console(JobQueue& queue, std::vector<std::string> tenants);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  /// GET /console/<file> (`file` empty: the page itself). False: no such file.
  bool asset(const std::string& file, HttpResponse& res) const;

  /// GET /v1/console/session: who the caller is.
  void session(const std::string& name, bool is_operator, HttpResponse& res) const;
  /// GET /v1/console/overview: the queue's numbers, this server's counters and its rates.
  void overview(HttpResponse& res) const;
  /// GET /v1/console/jobs: a filtered page of jobs.
  void jobs(const HttpRequest& req, HttpResponse& res) const;
  /// GET /v1/console/jobs/{id}?tenant=T: one job, whole, with its attempt log.
  void job(const JobRef& job, HttpResponse& res) const;
  /// POST /v1/console/dead-letters/redeliver: counts (dry_run) or redelivers the dead letters
  /// that match a filter. `who` names the key in the log line.
  void redeliver_all(const std::string& body, const std::string& who, HttpResponse& res);
  /// GET /v1/console/servers.
  void servers(HttpResponse& res) const;
  /// GET /v1/console/paused-origins.
  void paused(HttpResponse& res) const;

  /// The tenant a console request names (?tenant=), checked; nullopt when it is not one.
  std::optional<std::string> tenant_param(const HttpRequest& req) const;

  /// Most dead letters one redeliver_all counts or redelivers (each is a store write: a thousand
  /// take seconds on a busy disk, well inside a proxy's timeout).
  static constexpr std::size_t max_bulk = 1000;

 private:
  struct Sample {
    std::int64_t t;  // unix seconds
    std::uint64_t accepted, completed;
  };
  void sample();

  JobQueue& queue_;
  const std::vector<std::string> tenants_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::deque<Sample> samples_;  // every 5 s, the last 10 minutes; guarded by mutex_
  std::thread sampler_;
};

}  // namespace rebound::detail

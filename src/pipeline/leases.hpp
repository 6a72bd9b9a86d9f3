// Leases: the names of this server's claims, and the leases on the jobs it holds, renewed while
// they wait for a worker or run.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rebound/store/job_store.hpp"
#include "store_access.hpp"

namespace rebound::detail {

using Clock = std::function<std::chrono::system_clock::time_point()>;

/// Thread-safe. The held jobs are bounded by the queue's capacity.
class Leases {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  Leases(std::string server_id, std::chrono::milliseconds duration, Clock clock)
      : server_id_(std::move(server_id)), duration_(duration), clock_(std::move(clock)) {}

  /// A lease holder name that no other claim shares, on this server or another.
  std::string next_holder() { return server_id_ + "/" + std::to_string(++claims_); }

  Lease from_now(std::string holder) const {
    return Lease{std::move(holder), clock_() + duration_};
  }

  std::chrono::milliseconds duration() const { return duration_; }

  /// This server's id: what its lease holders start with.
  const std::string& server_id() const { return server_id_; }

  /// Keeps `holder`'s lease on `id` renewed from now on: a job's (waiting or running), or with
  /// `is_job` false a callback attempt's.
  void hold(const std::string& id, const std::string& holder, bool is_job = true) {
    std::lock_guard<std::mutex> lock(mutex_);
    held_[id] = Held{holder, is_job};
  }

  /// Forgets `holder`'s claim on `id`; a later claim of the same id (after a lease ran out) stays.
  void unhold(const std::string& id, const std::string& holder) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = held_.find(id);
    if (it != held_.end() && it->second.holder == holder) held_.erase(it);
  }

  /// Ends `holder`'s lease on `id` now, so that another claim (here or on another server) may
  /// take the work at once. `during` names the step in a failure's log line.
  void hand_back(StoreAccess& store, const char* during, const std::string& id,
                 const std::string& holder) {
    unhold(id, holder);
    const TimePoint at = clock_();
    store.write_or_note(during, id, [&](JobLeaseStore& s) { s.renew(id, {holder, at}, at); });
  }

  /// The holder of this server's claim on the job `id`, if it holds one.
  std::optional<std::string> job_holder_of(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = held_.find(id);
    if (it == held_.end() || !it->second.is_job) return std::nullopt;
    return it->second.holder;
  }

  /// Extends the leases held (every third of a lease, on the pump thread). Returns the (id,
  /// holder) job claims whose renewal the store refused: cancelled, or taken by another claim.
  std::vector<std::pair<std::string, std::string>> renew_held(StoreAccess& store) {
    std::vector<std::pair<std::string, Held>> held;
    std::vector<std::pair<std::string, std::string>> lost;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held.assign(held_.begin(), held_.end());
    }
    const TimePoint at = clock_();
    // Seen alive, with what it holds: the console's servers view.
    store.write_or_note("report_server", server_id_,
                        [&](FleetStore& s) { s.report_server(server_id_, held.size(), at); });
    // One call for them all: a store with round trips renews them together.
    std::vector<std::pair<std::string, Lease>> leases;
    leases.reserve(held.size());
    for (const auto& claim : held)
      leases.emplace_back(claim.first, Lease{claim.second.holder, at + duration_});
    std::vector<bool> renewed;
    if (!leases.empty()) {
      store.write_or_note("renew", {},
                          [&](JobLeaseStore& s) { renewed = s.renew_all(leases, at); });
    }
    // A failed call renewed some or none: their leases stand until the next try.
    for (std::size_t i = 0; i < held.size() && i < renewed.size(); ++i) {
      if (!renewed[i] && held[i].second.is_job)
        lost.emplace_back(held[i].first, held[i].second.holder);
    }
    return lost;
  }

 private:
  const std::string server_id_;
  const std::chrono::milliseconds duration_;
  const Clock clock_;
  std::atomic<std::uint64_t> claims_{0};
  std::mutex mutex_;
  struct Held {
    std::string holder;
    bool is_job = true;
  };
  std::unordered_map<std::string, Held> held_;  // id -> its claim
};

}  // namespace rebound::detail

// Final waiters: requests that wait for a job to become final (`Prefer: wait=N`), woken when this
// server finishes or cancels it; jobs finished by another server are seen by polling the store.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace rebound::detail {

/// Thread-safe. At most `max` requests wait at once; the others are told to answer at once.
class FinalWaiters {
 public:
  explicit FinalWaiters(std::size_t max) : max_(max) {}

  struct Ticket {
    std::string id;
    std::uint64_t seen = 0;  // the job's generation when last checked
  };

  /// Registers a wait for `id`; false when `max` requests wait already, or after `close`.
  bool join(Ticket& ticket) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_ || waiting_ >= max_) return false;
    ++waiting_;
    Entry& e = entries_[ticket.id];
    ++e.waiters;
    ticket.seen = e.generation;
    return true;
  }

  void leave(const Ticket& ticket) {
    std::lock_guard<std::mutex> lock(mutex_);
    --waiting_;
    auto it = entries_.find(ticket.id);
    if (it != entries_.end() && --it->second.waiters == 0) entries_.erase(it);
  }

  /// Sleeps until `id` is notified after the ticket last looked, `close`, or `until`.
  void wait(Ticket& ticket, std::chrono::steady_clock::time_point until) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, until, [&] {
      auto it = entries_.find(ticket.id);
      return closed_ || (it != entries_.end() && it->second.generation != ticket.seen);
    });
    auto it = entries_.find(ticket.id);
    if (it != entries_.end()) ticket.seen = it->second.generation;
  }

  /// The job `id` became final here: its waiters look again.
  void notify(const std::string& id) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (waiting_ == 0) return;
      auto it = entries_.find(id);
      if (it == entries_.end()) return;
      ++it->second.generation;
    }
    changed_.notify_all();
  }

  /// Wakes every waiter and refuses new ones (shutdown).
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    changed_.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
  }

 private:
  struct Entry {
    std::size_t waiters = 0;
    std::uint64_t generation = 0;
  };
  const std::size_t max_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<std::string, Entry> entries_;
  std::size_t waiting_ = 0;
  bool closed_ = false;
};

}  // namespace rebound::detail

// Admission: the gate a submission passes (accepting until shutdown, the model ready) and the
// capacity slots that bound the work in memory: jobs waiting for a worker or running, and
// callback attempts under way.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "rebound/job_queue_status.hpp"
#include "rebound/model.hpp"

namespace rebound::detail {

/// Thread-safe. `on_slot_freed` is called (outside the lock) when a slot frees up while all were
/// taken, so that work waiting in the store is claimed at once rather than at the next poll.
class Admission {
 public:
  Admission(std::size_t capacity, const Model& model, std::function<void()> on_slot_freed)
      : capacity_(capacity), model_(model), on_slot_freed_(std::move(on_slot_freed)) {}

  /// Held (shared) while a submission is admitted and stored, so that `close` waits for those
  /// under way: after it, nothing new reaches the queue.
  [[nodiscard]] std::shared_lock<std::shared_mutex> enter() {
    return std::shared_lock<std::shared_mutex>(accepting_mutex_);
  }

  /// Under `enter()`: `accepted` means a slot was taken, to be released when the work is done.
  SubmitStatus admit() {
    if (!accepting_) return SubmitStatus::shutting_down;
    if (!model_.ready()) return SubmitStatus::not_ready;
    return take_slot() ? SubmitStatus::accepted : SubmitStatus::queue_full;
  }

  /// Takes a slot for work that needs no gate (a claim from the store, a redelivery).
  bool take_slot() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_ >= capacity_) return false;
    ++in_flight_;
    return true;
  }

  /// Frees one slot (Claim does, when it goes).
  void release() {
    bool freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      freed = in_flight_ == capacity_;
      --in_flight_;
      if (in_flight_ == 0) idle_.notify_all();
    }
    if (freed) on_slot_freed_();
  }

  std::size_t capacity() const { return capacity_; }

  std::size_t free_slots() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return capacity_ > in_flight_ ? capacity_ - in_flight_ : 0;
  }

  std::size_t in_flight() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_flight_;
  }

  bool accepting() const {
    std::shared_lock<std::shared_mutex> lock(accepting_mutex_);
    return accepting_;
  }

  /// Accepting and the model ready.
  bool open() const {
    std::shared_lock<std::shared_mutex> lock(accepting_mutex_);
    return accepting_ && model_.ready();
  }

  /// Refuses new work from now on; waits for the submissions under way.
  void close() {
    std::unique_lock<std::shared_mutex> lock(accepting_mutex_);
    accepting_ = false;
  }

  /// Waits up to `timeout` for every slot to be free, or until `end_wait`. True when they all are.
  bool wait_idle(std::chrono::steady_clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait_for(lock, timeout, [this] { return in_flight_ == 0 || wait_ended_; });
    return in_flight_ == 0;
  }

  /// Ends every `wait_idle`, now and later, as if its deadline had passed.
  void end_wait() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      wait_ended_ = true;
    }
    idle_.notify_all();
  }

 private:
  const std::size_t capacity_;
  const Model& model_;
  const std::function<void()> on_slot_freed_;
  mutable std::shared_mutex accepting_mutex_;
  bool accepting_ = true;
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  std::size_t in_flight_ = 0;
  bool wait_ended_ = false;
};

}  // namespace rebound::detail

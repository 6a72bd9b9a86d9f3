// Admission: the gate a submission passes (accepting until shutdown, the model ready) and the
// capacity slots and bytes that bound the work in memory: jobs waiting for a worker or running
// (their inputs), and callback attempts under way (their bodies).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "events.hpp"
#include "model_readiness.hpp"
#include "rebound/job_queue_status.hpp"

namespace rebound::detail {

/// Thread-safe. PipelineEvents::slot_freed is called (outside the lock) when a slot frees up while
/// all were taken, when the bytes fall back under their limit, and when the room a claim handed
/// back for wanted is free, so that work waiting in the store is claimed at once rather than at
/// the next poll.
class Admission {
 public:
  /// `tenant_slots`: the slots one tenant's submissions may hold at once (rebound/tenant.hpp);
  /// `capacity` or more: no limit, and no count per tenant is kept.
  /// `max_bytes`: the bytes that work in memory may hold at once (what it is charged with).
  /// `events` hears each slot given back (PipelineEvents::slot_freed).
  Admission(std::size_t capacity, const ModelReadiness& model, PipelineEvents& events,
            std::size_t tenant_slots = std::numeric_limits<std::size_t>::max(),
            std::size_t max_bytes = std::numeric_limits<std::size_t>::max())
      : capacity_(capacity),
        max_bytes_(max_bytes),
        tenant_slots_(tenant_slots),
        by_tenant_(tenant_slots < capacity),
        model_(model),
        events_(events) {}

  /// Held while a submission is admitted and stored (also across a store's asynchronous put, so
  /// it moves), so that `close` waits for those under way: after it, nothing new reaches the
  /// queue.
  class Entry {
   public:
    Entry() = default;
    explicit Entry(Admission& admission) : admission_(&admission) {}
    Entry(Entry&& other) noexcept : admission_(std::exchange(other.admission_, nullptr)) {}
    Entry& operator=(Entry&& other) noexcept {
      if (this != &other) {
        release();
        admission_ = std::exchange(other.admission_, nullptr);
      }
      return *this;
    }
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry() { release(); }
    void release() {
      if (admission_) std::exchange(admission_, nullptr)->leave();
    }

   private:
    Admission* admission_ = nullptr;
  };

  [[nodiscard]] Entry enter() {
    std::lock_guard<std::mutex> lock(entry_mutex_);
    ++entries_;
    return Entry(*this);
  }

  /// Under `enter()`: success means a slot was taken for `tenant`, charged with `bytes`, to be
  /// released (with the same tenant and bytes) when the work is done. errc::tenant_quota when the
  /// tenant holds its share already; queue_full when the slots or the bytes are taken (work
  /// larger than the whole budget is admitted only when nothing else is in memory);
  /// shutting_down, not_ready.
  boost::system::error_code admit(std::string_view tenant = {}, std::size_t bytes = 0) {
    if (!accepting_) return errc::shutting_down;
    if (!model_.ready()) return errc::not_ready;  // (ready and warmed up)
    return take_slot_within_share(tenant, bytes);
  }

  /// Takes a slot for work that needs no gate (a claim from the store), charged with `bytes` and
  /// counted for `tenant` but not held to its share: the work is accepted already. False when
  /// the slots or the bytes are taken (the work then goes back to the store, and the room it
  /// wanted, once freed, wakes the pump: PipelineEvents::slot_freed).
  bool take_slot(std::string_view tenant = {}, std::size_t bytes = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_ >= capacity_) return false;
    if (!fits_locked(bytes)) {
      want_room_locked(bytes);
      return false;
    }
    take_locked(tenant);
    bytes_ += bytes;
    note_charge(bytes);
    return true;
  }

  /// Takes a slot for work `tenant` asks for again (a redelivery): held to its share as a
  /// submission is, but not gated on the model.
  boost::system::error_code take_slot_within_share(std::string_view tenant, std::size_t bytes = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_ >= capacity_ || !fits_locked(bytes)) return errc::queue_full;
    if (by_tenant_ && !tenant.empty()) {  // the default tenant (invocations) has no share
      auto it = tenants_.find(tenant);
      if (it != tenants_.end() && it->second >= tenant_slots_) return errc::tenant_quota;
    }
    take_locked(tenant);
    bytes_ += bytes;
    note_charge(bytes);
    return {};
  }

  /// Changes what a slot's work is charged with, from `from` to `to` bytes (work read from the
  /// store, a job's callback after its input), whatever the budget: the work is in memory.
  void charge(std::size_t from, std::size_t to) {
    bool freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      freed = bytes_ >= max_bytes_;
      bytes_ = bytes_ - std::min(bytes_, from) + to;
      freed = (freed && bytes_ < max_bytes_) || (to < from && room_came_locked());
    }
    if (freed) events_.slot_freed();
  }

  /// How many items a claim from the store may ask for now: the free slots, at most `max`, and
  /// no more than the free bytes hold at the size of the largest recent work (a claim cannot see
  /// sizes before it reads).
  std::size_t claimable(std::size_t max) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_ >= capacity_ || bytes_ >= max_bytes_) return 0;
    const std::size_t by_bytes = 1 + (max_bytes_ - bytes_) / std::max<std::size_t>(1, largest_);
    return std::min({capacity_ - in_flight_, max, by_bytes});
  }

  /// Parks a slot taken with `admit`: its job waits in the store, not in memory (see
  /// JobQueueOptions::prefetch). The slot stays taken (the job is still accepted and unfinished)
  /// and its bytes are freed. Only without per-tenant counts (a parked slot belongs to no tenant).
  void park(std::size_t bytes, int priority) {
    bool freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      freed = bytes_ >= max_bytes_;
      bytes_ -= std::min(bytes_, bytes);
      freed = (freed && bytes_ < max_bytes_) || (bytes > 0 && room_came_locked());
      ++parked_;
      parked_floor_ = std::min(parked_floor_, priority);
    }
    if (freed) events_.slot_freed();
  }

  enum class Unpark { none, taken, no_room };

  /// Takes one parked slot for a job claimed from the store, charged with `bytes` from now on.
  /// `none` when none is parked (the claim then needs a free slot: take_slot); `no_room` when the
  /// bytes do not fit (the job goes back to the store, the slot stays parked, and the room it
  /// wanted, once freed, wakes the pump).
  Unpark unpark(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (parked_ == 0) return Unpark::none;
    if (!fits_locked(bytes)) {
      want_room_locked(bytes);
      return Unpark::no_room;
    }
    if (--parked_ == 0) {
      parked_floor_ = std::numeric_limits<int>::max();
      idle_.notify_all();
    }
    bytes_ += bytes;
    note_charge(bytes);
    return Unpark::taken;
  }

  /// The most urgent priority (lowest number) parked since none was: a submission of that
  /// priority or a less urgent one waits behind the parked jobs (first come, first served).
  int parked_floor() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return parked_floor_;
  }

  /// Frees up to `n` parked slots whose jobs will not be claimed by this queue (taken by another
  /// claimant, cancelled, or left in the store at shutdown). Returns how many were freed.
  std::size_t drop_parked(std::size_t n) {
    bool freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      n = std::min(n, parked_);
      if (n == 0) return 0;
      freed = in_flight_ == capacity_;
      parked_ -= n;
      in_flight_ -= n;
      if (parked_ == 0) parked_floor_ = std::numeric_limits<int>::max();
      if (in_flight_ == 0 || parked_ == 0) idle_.notify_all();
    }
    if (freed) events_.slot_freed();
    return n;
  }

  /// Slots held by jobs that wait in the store (park).
  std::size_t parked() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return parked_;
  }

  /// How many parked jobs a claim may take now: at most `max`, and no more than the free bytes
  /// hold at the size of the largest recent work (as claimable).
  std::size_t unparkable(std::size_t max) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (parked_ == 0 || bytes_ >= max_bytes_) return 0;
    const std::size_t by_bytes = 1 + (max_bytes_ - bytes_) / std::max<std::size_t>(1, largest_);
    return std::min({parked_, max, by_bytes});
  }

  /// Frees one slot of `tenant`'s, charged with `bytes` (Claim does, when it goes).
  void release(std::string_view tenant = {}, std::size_t bytes = 0) {
    bool freed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      freed = in_flight_ == capacity_ || bytes_ >= max_bytes_;
      --in_flight_;
      bytes_ -= std::min(bytes_, bytes);
      freed = (freed && bytes_ < max_bytes_) || (bytes > 0 && room_came_locked());
      if (by_tenant_) {
        auto it = tenants_.find(tenant);
        if (it != tenants_.end() && --it->second == 0) tenants_.erase(it);
      }
      if (in_flight_ == 0) idle_.notify_all();
    }
    if (freed) events_.slot_freed();
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

  /// The bytes work in memory is charged with now, and the most it may be.
  std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }
  std::size_t max_bytes() const { return max_bytes_; }

  /// Jobs admitted to be held in memory whose store put is still under way (JobQueue::submit with
  /// a handler): the prefetch window (the submissions' and the pump's) counts them as queued.
  void arriving_began() { ++arriving_; }
  void arriving_ended() { --arriving_; }
  std::size_t arriving() const { return arriving_.load(); }

  bool accepting() const { return accepting_.load(); }

  /// Accepting and the model ready (and warmed up).
  bool open() const { return accepting_.load() && model_.ready(); }

  /// The model ready and warmed up: jobs may be claimed for it.
  bool model_ready() const { return model_.ready(); }

  /// Refuses new work from now on; waits for the submissions under way (an asynchronous put's
  /// answer included: not from the executor it is posted to).
  void close() {
    std::unique_lock<std::mutex> lock(entry_mutex_);
    accepting_ = false;
    left_.wait(lock, [this] { return entries_ == 0; });
  }

  /// Waits up to `timeout` for every slot to be free, or until `end_wait`. True when they all are.
  bool wait_idle(std::chrono::steady_clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait_for(lock, timeout, [this] { return in_flight_ == 0 || wait_ended_; });
    return in_flight_ == 0;
  }

  /// Waits up to `timeout` for no slot to be parked (the pump claims them), or until `end_wait`.
  bool wait_unparked(std::chrono::steady_clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait_for(lock, timeout, [this] { return parked_ == 0 || wait_ended_; });
    return parked_ == 0;
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
  // Whether `bytes` more fit the budget; anything fits when no bytes are held, so that one piece
  // of work larger than the whole budget is still taken alone.
  bool fits_locked(std::size_t bytes) const {
    return bytes_ == 0 || (bytes <= max_bytes_ && bytes_ <= max_bytes_ - bytes);
  }

  // A claim handed back for want of `bytes` of room: the least any claim handed back since the
  // room last came wanted (any of them, claimed again, moves the queue on).
  void want_room_locked(std::size_t bytes) {
    bytes = std::max<std::size_t>(1, bytes);  // (0 is none)
    room_wanted_ = room_wanted_ ? std::min(room_wanted_, bytes) : bytes;
  }

  // Whether the room a claim handed back wanted is there now (forgotten once told): without it,
  // a job too large for the bytes left (though they were not all taken) waited for the pump's
  // next poll, a second by default, once the work ahead of it was done.
  bool room_came_locked() {
    if (room_wanted_ == 0 || !fits_locked(room_wanted_)) return false;
    room_wanted_ = 0;
    return true;
  }

  // The largest recent job: jumps to a larger one at once, and decays by 1/64 with each job
  // taken, so that claims shrink as soon as large work shows up and grow back after it.
  void note_charge(std::size_t bytes) {
    if (bytes > 0) largest_ = std::max(bytes, largest_ - largest_ / 64);
  }

  void take_locked(std::string_view tenant) {
    ++in_flight_;
    if (!by_tenant_) return;
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) it = tenants_.emplace(std::string(tenant), 0).first;
    ++it->second;
  }

  const std::size_t capacity_;
  const std::size_t max_bytes_;
  const std::size_t tenant_slots_;
  const bool by_tenant_;
  std::map<std::string, std::size_t, std::less<>> tenants_;  // under mutex_, when by_tenant_
  const ModelReadiness& model_;
  PipelineEvents& events_;
  void leave() {
    std::lock_guard<std::mutex> lock(entry_mutex_);
    if (--entries_ == 0) left_.notify_all();
  }

  std::atomic<bool> accepting_{true};
  std::atomic<std::size_t> arriving_{0};
  std::mutex entry_mutex_;  // guards entries_
  std::condition_variable left_;
  std::size_t entries_ = 0;  // submissions under way (Entry)
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  std::size_t in_flight_ = 0;  // slots taken, parked ones included
  std::size_t parked_ = 0;     // of them, held by jobs waiting in the store
  int parked_floor_ = std::numeric_limits<int>::max();  // see parked_floor
  std::size_t bytes_ = 0;
  std::size_t room_wanted_ = 0;  // see want_room_locked; 0: none
  // Until work is seen, claims assume the largest input a body can hold (json_cost_limit).
  std::size_t largest_ = std::size_t{32} << 20;
  bool wait_ended_ = false;
};

}  // namespace rebound::detail

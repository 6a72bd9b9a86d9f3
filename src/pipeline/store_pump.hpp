// The store pump: claims due work from the store (callbacks, then jobs) as far as slots are free,
// at the times this server scheduled and every poll interval for the rest, and renews the leases
// of the work it holds.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "admission.hpp"
#include "claim.hpp"
#include "delivery.hpp"
#include "events.hpp"
#include "leases.hpp"
#include "observers.hpp"
#include "rebound/job_queue_status.hpp"
#include "store_access.hpp"
#include "work_item.hpp"
#include "work_queue.hpp"

namespace rebound::detail {

/// Starts a thread of its own (the "rebound pump" thread of every JobQueue) and runs there, not on
/// the io executor, so that a slow store never holds up the callback transport that the io
/// executor drives. `wake` is thread-safe.
class StorePump {
 public:
  using TimePoint = std::chrono::system_clock::time_point;
  using Queue = WorkQueue<WorkItem>;

  /// `events` hears of each claim whose renewal the store refused (lease_lost), is asked to
  /// sweep the queue (at most every quarter second, when the pump looks for work) and is told of
  /// each pass (pump_polled). `claims_callbacks`: whether due callbacks are claimed (not by a
  /// queue without a transport). `prefetch`: the most jobs held in memory waiting for a worker
  /// (JobQueueOptions::prefetch; 0: no bound); with one, accepted jobs beyond it wait in the
  /// store on parked slots (Admission::park), and the pump claims them as the queue drains.
  StorePump(StoreAccess& store, Admission& admission, Leases& leases, Delivery& delivery,
            Observers& observe, Clock clock, PipelineEvents& events,
            std::chrono::milliseconds poll_interval, bool claims_callbacks, std::size_t prefetch)
      : store_(store),
        admission_(admission),
        leases_(leases),
        delivery_(delivery),
        observe_(observe),
        clock_(std::move(clock)),
        events_(events),
        poll_interval_(poll_interval),
        claims_callbacks_(claims_callbacks),
        prefetch_(prefetch) {}
  ~StorePump() { stop(); }

  /// Claims what the store holds (from an earlier run, or from servers gone) once, on the
  /// calling thread, so that it is counted when `start` returns; then starts the thread.
  void start(Queue& queue);

  /// Set once, before start: the versions whose jobs claims leave alone
  /// (JobLeaseStore::claim_jobs_except), asked before each claim of jobs.
  void set_skipped(std::function<std::vector<ModelRef>()> skipped) {
    skipped_ = std::move(skipped);
  }

  /// Stops the thread; nothing more is claimed.
  void stop();

  /// Runs the pump at `at` (at once when it has come), unless it runs earlier already.
  void wake(TimePoint at);

  /// Runs the pump at `at` for a retry due then, whatever other times it keeps (the soonest
  /// 1,024 retries' times; beyond those, the poll interval finds what comes due).
  void wake_for_retry(TimePoint at);

  /// Has the thread tell `events` finals_due as soon as it is free (before a pass or a renewal
  /// due at the same time), without a pass of its own. Thread-safe.
  void wake_for_finals();

  /// A store's wake-up (FleetStore::watch_work: another server left work to claim): a pass as
  /// soon as the thread is free, unless the last pass handed a claim back for want of room (a
  /// job too large for this server, woken for again by every server that hands it back, would
  /// be a loop of claims and hand-backs): then room freed here, or the next poll, claims again.
  /// Reads no clock (a queue's clock may be the user's, and a store calls this under its lock).
  /// Thread-safe.
  void wake_for_store();

  std::size_t prefetch() const { return prefetch_; }

  /// A worker took a batch: with jobs parked in the store and the queue below half its prefetch,
  /// the pump claims more at once. Thread-safe.
  void note_taken();

  /// Returns once the pass under way (if any) has queued what it claimed. Thread-safe.
  void barrier();

  /// Runs a whole pass that begins after this call (claims, renewals due, the poll hook) and
  /// waits up to `timeout` for it to end. False when it did not end in time (or the pump is
  /// stopped). What a test's quiesce waits for. Thread-safe.
  bool pass_now(std::chrono::steady_clock::duration timeout);

  /// Jobs and callbacks taken over from the store so far (see BatchStats::resumed).
  std::uint64_t resumed() const { return resumed_; }

 private:
  void run();
  bool pump();
  // What a claim of jobs did with parked slots: how many it took back, and whether it handed any
  // job back to the store (which is then still claimable).
  struct Unparking {
    std::size_t unparked = 0;
    bool handed_back = false;
  };
  template <typename ClaimFn, typename BytesFn>
  std::vector<std::pair<JobRecord, Claim>> claim_with_slots(const char* what, bool& more,
                                                            std::string& holder, std::size_t want,
                                                            Unparking* unparking, bool free_slots,
                                                            ClaimFn&& claim, BytesFn&& bytes_of);
  std::size_t claim_callbacks(bool& more);
  std::size_t claim_jobs(bool& more, bool free_slots);

  static constexpr std::size_t max_claim = 256;

  StoreAccess& store_;
  Admission& admission_;
  Leases& leases_;
  Delivery& delivery_;
  Observers& observe_;
  const Clock clock_;
  PipelineEvents& events_;
  const std::chrono::milliseconds poll_interval_;
  TimePoint last_sweep_{};  // on clock_
  Queue* queue_ = nullptr;
  const bool claims_callbacks_;
  const std::size_t prefetch_;
  std::function<std::vector<ModelRef>()> skipped_;
  std::atomic<bool> backlog_{false};  // the last claim of jobs filled the room it had
  std::mutex pass_mutex_;             // held while a pass claims and queues
  std::atomic<std::uint64_t> resumed_{0};
  bool starting_ = true;  // during the first claims, before the thread starts

  // It wakes at the next due time it knows of (a retry this server scheduled, a freed slot),
  // else every poll interval; it renews leases every third of a lease. All on clock_.
  std::mutex mutex_;
  std::condition_variable wake_;
  TimePoint due_ = TimePoint::max();
  std::set<TimePoint> later_;  // retries' times (wake_for_retry), bounded
  TimePoint next_due() const;  // the sooner of due_ and later_'s first, under mutex_
  bool finals_due_ = false;    // wake_for_finals, under mutex_
  bool store_woken_ = false;   // wake_for_store, under mutex_
  std::atomic<bool> waiting_for_room_{false};          // the last pass handed a claim back for room
  std::uint64_t passes_begun_ = 0, passes_ended_ = 0;  // passes of the thread, under mutex_
  std::condition_variable pass_ended_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace rebound::detail

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
#include <string>
#include <thread>
#include <vector>

#include "admission.hpp"
#include "claim.hpp"
#include "delivery.hpp"
#include "leases.hpp"
#include "observers.hpp"
#include "rebound/detail/work_queue.hpp"
#include "rebound/job_queue_status.hpp"
#include "store_access.hpp"
#include "work_item.hpp"

namespace rebound::detail {

/// Starts a thread of its own (the "rebound pump" thread of every JobQueue) and runs there, not on
/// the io executor, so that a slow store never holds up the callback transport that the io
/// executor drives. `wake` is thread-safe.
class StorePump {
 public:
  using TimePoint = std::chrono::system_clock::time_point;
  using Queue = WorkQueue<WorkItem>;

  /// `on_lost(id, holder)` hears of each claim whose renewal the store refused; `sweep(queue)`
  /// runs at most every quarter second, when the pump looks for work (expired and revoked jobs).
  StorePump(StoreAccess& store, Admission& admission, Leases& leases, Delivery& delivery,
            Observers& observe, Clock clock, std::chrono::milliseconds poll_interval,
            std::function<void(const std::string&, const std::string&)> on_lost,
            std::function<void(Queue&)> sweep)
      : store_(store),
        admission_(admission),
        leases_(leases),
        delivery_(delivery),
        observe_(observe),
        clock_(std::move(clock)),
        poll_interval_(poll_interval),
        on_lost_(std::move(on_lost)),
        sweep_(std::move(sweep)) {}
  ~StorePump() { stop(); }

  /// Claims what the store holds (from an earlier run, or from servers gone) once, on the
  /// calling thread, so that it is counted when `start` returns; then starts the thread.
  void start(Queue& queue);

  /// Stops the thread; nothing more is claimed.
  void stop();

  /// Runs the pump at `at` (at once when it has come), unless it runs earlier already.
  void wake(TimePoint at);

  /// Whether due callbacks are claimed (not by a queue without a transport). Before `start`.
  void set_claims_callbacks(bool claims) { claims_callbacks_ = claims; }

  /// The most jobs held in memory waiting for a worker (JobQueueOptions::prefetch); 0: no bound.
  /// With one, accepted jobs beyond it wait in the store on parked slots (Admission::park), and
  /// the pump claims them as the queue drains. Before `start`.
  void set_prefetch(std::size_t prefetch) { prefetch_ = prefetch; }
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

  /// Called on the pump's thread each time it looks for work. Before `start`.
  void set_on_poll(std::function<void()> on_poll) { on_poll_ = std::move(on_poll); }

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
  const std::chrono::milliseconds poll_interval_;
  const std::function<void(const std::string&, const std::string&)> on_lost_;
  const std::function<void(Queue&)> sweep_;
  TimePoint last_sweep_{};  // on clock_
  Queue* queue_ = nullptr;
  bool claims_callbacks_ = true;
  std::size_t prefetch_ = 0;
  std::atomic<bool> backlog_{false};  // the last claim of jobs filled the room it had
  std::mutex pass_mutex_;             // held while a pass claims and queues
  std::function<void()> on_poll_;
  std::atomic<std::uint64_t> resumed_{0};
  bool starting_ = true;  // during the first claims, before the thread starts

  // It wakes at the next due time it knows of (a retry this server scheduled, a freed slot),
  // else every poll interval; it renews leases every third of a lease. All on clock_.
  std::mutex mutex_;
  std::condition_variable wake_;
  TimePoint due_ = TimePoint::max();
  std::uint64_t passes_begun_ = 0, passes_ended_ = 0;  // passes of the thread, under mutex_
  std::condition_variable pass_ended_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace rebound::detail

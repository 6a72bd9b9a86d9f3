// The store pump: claims of due work, and lease renewals.
#include "store_pump.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include "rebound/tenant.hpp"
#include "work_queue.hpp"

namespace rebound::detail {

void StorePump::start(Queue& queue) {
  queue_ = &queue;
  // What the store holds for this server, as far as slots allow and at most one capacity's worth
  // (the pump's thread, which renews leases, does not run yet): claims come 256 at a time, and the
  // count of what was resumed is complete when the constructor returns.
  while (pump() && admission_.free_slots() > 0 && resumed_ < admission_.capacity()) {
  }
  starting_ = false;
  thread_ = std::thread([this] { run(); });
}

void StorePump::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    wake_.notify_one();
    pass_ended_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void StorePump::wake(TimePoint at) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (at >= due_) return;
  due_ = at;
  wake_.notify_one();
}

void StorePump::wake_for_retry(TimePoint at) {
  constexpr std::size_t most_later = 1024;
  std::lock_guard<std::mutex> lock(mutex_);
  // Kept apart from due_ (the pump's own times), each for the one pass that comes at or after
  // it: a retry due 200 ms after (or before) another does not wait for the poll.
  const bool sooner = at < next_due();
  later_.insert(at);
  if (later_.size() > most_later) later_.erase(std::prev(later_.end()));
  if (sooner) wake_.notify_one();
}

StorePump::TimePoint StorePump::next_due() const {
  return later_.empty() ? due_ : std::min(due_, *later_.begin());
}

void StorePump::wake_for_finals() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finals_due_) return;
  finals_due_ = true;
  wake_.notify_one();
}

void StorePump::wake_for_store() {
  if (waiting_for_room_.load()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (store_woken_) return;
  store_woken_ = true;
  wake_.notify_one();
}

// Every time the pump keeps (the next pass, the next renewal, the next sweep) is on the queue's
// clock, the one the store's leases and due times are on: a test that moves an injected clock
// moves the pump with it. The thread sleeps in real time, towards the nearest of them, and never
// longer than a quarter second at once, so that a clock moved by hand (or a wall clock that was
// stepped) is seen within that. A clock stepped back keeps no deadline further away than the
// interval that set it; a clock that stands still (a test's) is slept on a quarter second at a
// time, not polled.
void StorePump::run() {
  constexpr auto longest_sleep = std::chrono::milliseconds(250);
  // At least a millisecond: a lease of under 3 ms would renew without pause.
  const auto renew_every = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(1),
      std::chrono::duration_cast<std::chrono::milliseconds>(leases_.duration()) / 3);
  TimePoint next_renewal = clock_() + renew_every;
  TimePoint slept_at = TimePoint::min(), seen = clock_();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // The deadline is read again after every wake: a wake for a time before the one slept
    // towards (a retry due in 5 s under a poll interval of a minute) moves it.
    for (TimePoint now = clock_(); !stop_; now = clock_()) {
      if (now < seen) {  // stepped back: the deadlines set before are that much further away
        next_renewal = std::min(next_renewal, now + renew_every);
        if (due_ != TimePoint::max() && due_ - now > poll_interval_) due_ = now + poll_interval_;
      }
      seen = now;
      if (now >= next_due() || now >= next_renewal || finals_due_ || store_woken_) break;
      const auto until = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::min(next_due(), next_renewal) - now);
      wake_.wait_for(lock, now == slept_at ? std::chrono::steady_clock::duration(longest_sleep)
                                           : std::min<std::chrono::steady_clock::duration>(
                                                 longest_sleep, until));
      slept_at = now;
    }
    if (stop_) return;
    const bool finals_now = std::exchange(finals_due_, false);
    // A store's wake-up runs a pass without taking the time asked for (a retry due later stays).
    const bool store_woken = std::exchange(store_woken_, false);
    const bool due_now = clock_() >= next_due() || store_woken;  // read under the lock
    if (due_now) {
      // Taken under the same lock as the wake that asked for it: a wake from now on asks for
      // the next pass, and is never lost to this one. The retries' times that came are this
      // pass's.
      const TimePoint now = clock_();
      if (!store_woken || now >= due_) due_ = TimePoint::max();
      while (!later_.empty() && *later_.begin() <= now)
        later_.erase(later_.begin());
      ++passes_begun_;
    }
    lock.unlock();
    // Nothing thrown here may end the thread (and with it the process): a pass that failed is
    // noted as the store's failure, and the next one tries again.
    try {
      if (finals_now) events_.finals_due();
      if (clock_() >= next_renewal) {
        next_renewal = clock_() + renew_every;
        for (const auto& [id, holder] : leases_.renew_held(store_))
          events_.lease_lost(id, holder);
      }
      if (due_now) pump();
    } catch (const std::exception& e) {
      store_.failed("pump", {}, e.what());
      wake(clock_() + poll_interval_);
    } catch (...) {
      store_.failed("pump", {}, "unknown error");
      wake(clock_() + poll_interval_);
    }
    lock.lock();
    if (due_now) {
      ++passes_ended_;
      pass_ended_.notify_all();
    }
  }
}

bool StorePump::pass_now(std::chrono::steady_clock::duration timeout) {
  std::uint64_t ours = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return false;
    ours = passes_begun_ + 1;  // the next to begin: after this call
  }
  wake(clock_());
  std::unique_lock<std::mutex> lock(mutex_);
  return pass_ended_.wait_for(lock, timeout, [&] { return stop_ || passes_ended_ >= ours; }) &&
         !stop_;
}

// Callbacks first (results already paid for), then jobs. True when the store had more than one
// claim took. Jobs are counted as resumed (taken over) unless this queue parked them itself.
bool StorePump::pump() {
  if (store_.stopped()) return false;
  if (const TimePoint now = clock_();
      now - last_sweep_ >= std::chrono::milliseconds(250) || now < last_sweep_) {
    last_sweep_ = now;
    if (queue_) events_.sweep(*queue_);
    // A fault the store got over by itself (its own retries) is seen here, with its log line,
    // even when no call and no health check met it.
    store_.failure();
  }
  // First what the pass must know (pauses a shared store keeps), then the claims.
  try {
    events_.pump_polled();
  } catch (...) {
    // A wait that could not be checked now is checked at the next poll.
  }
  std::size_t jobs = 0, callbacks = 0;
  bool more = false;
  try {
    // After shutdown begins nothing new is claimed: it stays in the store for the next start, or
    // for the other servers. The jobs this queue accepted and parked in the store are still
    // claimed while it drains (JobQueue::shutdown), as those in memory still run.
    std::lock_guard<std::mutex> pass(pass_mutex_);
    waiting_for_room_ = false;  // (set again by a claim this pass hands back for room)
    if (admission_.accepting()) {
      if (claims_callbacks_) callbacks = claim_callbacks(more);
      // Jobs only for a model that can run them: one still loading (or warming up) would be
      // handed jobs another run or server left in the store. Polled again each pass.
      if (admission_.model_ready()) jobs = claim_jobs(more, true);
    } else if (admission_.parked() > 0) {
      jobs = claim_jobs(more, false);  // only the parked ones: nothing new is taken on
    }
    store_.worked();
  } catch (const std::exception& e) {
    store_.failed("claim", {}, e.what());
  } catch (...) {
    store_.failed("claim", {}, "unknown error");
  }
  // Taken over: jobs this server did not accept, and at start the callbacks an earlier run owed
  // (later, claimed callbacks are the retries this server or another scheduled).
  const bool at_start = starting_;
  if (!at_start) callbacks = 0;
  if (jobs + callbacks > 0) {
    resumed_ += jobs + callbacks;
    observe_([&](auto& o) { o.on_claimed(jobs, callbacks, at_start); });
  }
  wake(clock_() + (more ? std::chrono::milliseconds(0) : poll_interval_));
  return more;
}

// Claims with `claim` up to `want` items, and keeps those it gets a slot and their bytes
// (`bytes_of`) for: with `unparking`, a job parked in the store takes its parked slot back (counted
// there), else a free slot; a claim whose slot a submission took meanwhile, or that does not fit
// the bytes left, is handed back at once. Slots are not reserved beforehand, so a poll never makes
// a submission see a full queue. After a hand-back the pump waits for room (a freed slot, or the
// next poll) instead of claiming again at once.
template <typename ClaimFn, typename BytesFn>
std::vector<std::pair<JobRecord, Claim>> StorePump::claim_with_slots(
    const char* what, bool& more, std::string& holder, std::size_t want, Unparking* unparking,
    bool free_slots, ClaimFn&& claim, BytesFn&& bytes_of) {
  if (want == 0) return {};
  holder = leases_.next_holder();
  std::vector<JobRecord> due = claim(want, leases_.from_now(holder), clock_());
  if (due.size() == want) more = true;
  std::vector<std::pair<JobRecord, Claim>> kept;
  kept.reserve(due.size());
  for (auto& record : due) {
    const std::string& tenant = record.job.tenant;
    const std::size_t bytes = bytes_of(record);
    const auto parked = unparking ? admission_.unpark(bytes) : Admission::Unpark::none;
    if (parked == Admission::Unpark::taken) ++unparking->unparked;
    if (parked == Admission::Unpark::taken ||
        (parked == Admission::Unpark::none && free_slots && admission_.take_slot(tenant, bytes))) {
      // From here the slot is the claim's: given back on every way out, an exception's included.
      Claim slot = Claim::slot(admission_, tenant, bytes);
      kept.emplace_back(std::move(record), std::move(slot));
    } else {
      leases_.hand_back(store_, what, key_of(record.job), holder);
      if (unparking) unparking->handed_back = true;
      more = false;
      waiting_for_room_ = true;
    }
  }
  return kept;
}

std::size_t StorePump::claim_callbacks(bool& more) {
  std::string holder;
  auto due = claim_with_slots(
      "claim_callbacks", more, holder, admission_.claimable(max_claim), nullptr, true,
      [this](std::size_t n, const Lease& lease, TimePoint at) {
        JobLeaseStore& leases = store_.store();
        return leases.claim_callbacks(n, lease, at);
      },
      // Its body is charged when the attempt builds it.
      [](const JobRecord&) { return std::size_t{0}; });
  for (auto& [record, claim] : due)
    delivery_.attempt(record, holder, std::move(claim));
  return due.size();
}

std::size_t StorePump::claim_jobs(bool& more, bool free_slots) {
  // With a prefetch, only the room left in it; jobs parked in the store take their own slots.
  std::size_t room = max_claim;
  if (prefetch_ > 0) {
    // Submissions on their way to the queue (their put under way) count as queued.
    const std::size_t depth = (queue_ ? queue_->depth() : 0) + admission_.arriving();
    room = depth >= prefetch_ ? 0 : std::min(room, prefetch_ - depth);
  }
  const std::size_t parked_before = admission_.parked();
  const std::size_t unparkable = admission_.unparkable(max_claim);
  const std::size_t want = std::min(
      room, free_slots ? std::max(admission_.claimable(max_claim), unparkable) : unparkable);
  std::string holder;
  Unparking unparking;
  auto due = claim_with_slots(
      "claim_jobs", more, holder, want, &unparking, free_slots,
      [this, skip = skipped_ ? skipped_() : std::vector<ModelRef>()](
          std::size_t n, const Lease& lease, TimePoint at) {
        JobLeaseStore& leases = store_.store();
        return skip.empty() ? leases.claim_jobs(n, lease, at)
                            : leases.claim_jobs_except(n, lease, at, skip);
      },
      [](const JobRecord& record) { return work_bytes(record.job); });
  const std::size_t unparked = unparking.unparked;
  if (due.size() < want && !unparking.handed_back) {
    // The store had no more claimable jobs than these: the jobs parked before this claim that it
    // did not bring back are gone from the queue (cancelled, or taken by another claimant of the
    // store), so their slots are freed.
    admission_.drop_parked(parked_before > unparked ? parked_before - unparked : 0);
  }
  // A claim that filled its room may have left more in the store (parked here or not): the
  // workers' next batches wake the pump for it (note_taken) rather than the next poll.
  if (want > 0) backlog_ = prefetch_ > 0 && due.size() == want;
  std::size_t queued = 0;
  for (auto& [record, claim] : due) {
    const int priority = record.job.priority;
    const std::string tenant = record.job.tenant;  // its turn
    claim.take_lease(leases_, key_of(record.job), holder);
    // (Its version is looked up when it runs: WorkItem::model stays null.)
    WorkItem item{std::move(record.job), nullptr, std::move(claim),
                  std::chrono::steady_clock::now(), nullptr};
    if (queue_->try_push(std::move(item), priority, tenant) == PushResult::accepted) {
      ++queued;  // runs: at least once
      continue;
    }
    // Shutdown closed the queue meanwhile: the job goes back to the store at once.
    item.claim.hand_back(store_, "renew");
  }
  // Jobs this queue accepted and parked are not taken over: only the others count as resumed.
  return queued > unparked ? queued - unparked : 0;
}

void StorePump::note_taken() {
  if (prefetch_ == 0 || !queue_ || (!backlog_ && admission_.parked() == 0)) return;
  if (queue_->depth() <= prefetch_ / 2) wake(clock_());
}

void StorePump::barrier() {
  std::lock_guard<std::mutex> pass(pass_mutex_);
}

}  // namespace rebound::detail

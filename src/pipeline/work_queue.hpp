// WorkQueue: a bounded queue drained by a fixed number of workers on an Asio executor, handing
// them dynamic batches (up to a size, waiting at most a delay for one to fill).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "rebound/error.hpp"
#include "rebound/job.hpp"

namespace rebound::detail {

struct WorkQueueOptions {
  std::size_t capacity = 10000;  ///< Items waiting, at most. `try_push` answers `full` beyond it.
  std::size_t workers = 2;       ///< Batches handled at once, at most.
  /// Items handed to the handler at once, at most. 1 turns batching off.
  std::size_t max_batch_size = 1;
  /// How long the oldest waiting item may wait for a batch to fill before a smaller batch goes.
  /// 0: never wait; batches form only from what is already queued.
  std::chrono::microseconds max_queue_delay{0};
  /// Items a group takes in a row at its turn (at least 1), by group; `default_weight` for the
  /// others. rebound::JobQueue sets them from JobQueueOptions::tenants.
  std::map<std::string, unsigned, std::less<>> weights{};
  unsigned default_weight = 1;
  /// The time items are stamped with and batches judged by; unset: `steady_clock::now`. (For
  /// tests: a clock that moves between two looks. The delay's timer waits, on the steady clock,
  /// the time this clock says is left; it looks again when it fires.)
  std::function<std::chrono::steady_clock::time_point()> clock{};
};

/// A bounded queue of groups taking turns (a FIFO per priority level within each group) with a
/// worker pool and dynamic batching (as Triton's dynamic batcher).
///
/// Workers are not threads of their own: each is a drain loop posted to the executor you pass in
/// (typically a `boost::asio::thread_pool` sized to `workers`), started when work arrives and
/// returned to the executor when there is nothing to do. At most `workers` run at once. A worker
/// takes up to `max_batch_size` items; when fewer are waiting and the oldest has waited less than
/// `max_queue_delay`, it leaves them for a `steady_timer` to dispatch (no thread waits).
///
/// Every item accepted by `try_push` is handed to the handler exactly once, also after `close()`
/// (the queue drains), unless `take_pending` removes it first. The handler runs without any queue
/// lock held; an exception it throws is caught and counted (`handler_failures()`).
///
/// Example:
///   boost::asio::thread_pool pool(4);
///   rebound::detail::WorkQueue<Job> queue(pool.get_executor(), {1000, 4, 32, 2ms},
///                                         [](std::vector<rebound::Job> batch) { ... });
///   if (queue.try_push(std::move(job)) == rebound::detail::PushResult::full) { ... 503 ... }
///
/// Lifetime: destroy the queue while its executor still runs handlers; the destructor closes the
/// queue, drops items not yet started and waits for running handlers to return.
/// Thread-safety: every method is thread-safe.
enum class PushResult { accepted, full, closed };

template <typename Item>
class WorkQueue final {
 public:
  using Handler = std::function<void(std::vector<Item>)>;
  /// Items whose keys differ never share a batch (a batch ends before the first item of another
  /// key, which waits for the next one); empty: any items may.
  using BatchKey = std::function<const void*(const Item&)>;
  /// Told of each batch as it leaves the queue, under the queue's lock (so that an item is always
  /// seen either waiting, by count_if, or taken). An exception from it or from BatchKey while a
  /// batch is taken is counted as a handler's failure (`handler_failures()`), and the items
  /// taken still run (count_keys passes BatchKey's exceptions on to its caller).
  using OnTaken = std::function<void(std::vector<Item>&)>;

  WorkQueue(boost::asio::any_io_executor executor, WorkQueueOptions options, Handler handler,
            BatchKey batch_key = {}, OnTaken on_taken = {})
      : executor_(std::move(executor)),
        options_(options),
        handler_(std::move(handler)),
        batch_key_(std::move(batch_key)),
        on_taken_(std::move(on_taken)),
        timer_(executor_) {
    if (options_.capacity == 0) throw Error("WorkQueue: capacity must be at least 1");
    if (options_.workers == 0) throw Error("WorkQueue: workers must be at least 1");
    if (options_.max_batch_size == 0) throw Error("WorkQueue: max_batch_size must be at least 1");
    if (options_.max_queue_delay.count() < 0)
      throw Error("WorkQueue: max_queue_delay must be >= 0");
    if (!handler_) throw Error("WorkQueue: a handler is required");
  }

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  ~WorkQueue() {
    std::unique_lock<std::mutex> lock(mutex_);
    closed_ = true;
    pending_.clear();
    timer_.cancel();
    idle_.wait(lock, [this] { return executor_ended_ || (active_workers_ == 0 && !timer_armed_); });
  }

  /// Says that every thread of the executor has ended (an owner joined its pool): the destructor
  /// then waits for no worker and no timer, since none can run any more (a batch posted or a
  /// timer armed after the threads ended, by a handler on another executor, would otherwise be
  /// waited for forever; their handlers are destroyed unrun with the executor).
  void executor_ended() {
    std::lock_guard<std::mutex> lock(mutex_);
    executor_ended_ = true;
    idle_.notify_all();
  }

  /// Adds an item at the back of its `group`'s queue in priority `level` (0 to 9, clamped; 0, the
  /// default here, is taken first). The groups that have items take turns (round robin), each
  /// taking its weight's worth of items in a row (`WorkQueueOptions::weights`, 1 unless set);
  /// within its turn a group's lowest level goes first, FIFO within a level. So a priority
  /// orders a group's own items and never another group's: a group with many urgent items
  /// delays another group's item by at most its weight per turn. (rebound::JobQueue makes each
  /// tenant a group.) `full` when `capacity` items wait; `closed` after `close()`. The item is
  /// moved from only when accepted: on `full` or `closed` the caller still has it.
  PushResult try_push(Item&& item, int level = 0, std::string_view group = {}) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) return PushResult::closed;
    if (pending_.size() >= options_.capacity) return PushResult::full;
    const auto now = this->now();
    pending_.push({std::move(item), now}, level, group);
    const bool start = schedule_locked(now);
    lock.unlock();
    if (start) boost::asio::post(executor_, [this] { drain(); });
    return PushResult::accepted;
  }

  /// Stops accepting items. Items already accepted still run, without waiting for batches to fill.
  void close() {
    std::unique_lock<std::mutex> lock(mutex_);
    closed_ = true;
    const bool start = schedule_locked(now());
    lock.unlock();
    if (start) boost::asio::post(executor_, [this] { drain(); });
  }

  /// Removes and returns the waiting items for which `pred(const Item&)` is true, group by group
  /// in turn order (each group's in the order it would take them) (`pred` runs under the queue's
  /// lock: keep it short). For items that must not wait any longer (expired, cancelled).
  template <typename Pred>
  std::vector<Item> take_if(Pred pred) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Item> out = pending_.take_if(pred);
    if (!out.empty() && pending_.empty() && active_workers_ == 0) idle_.notify_all();
    return out;
  }

  /// Removes and returns the items still waiting (not those running). For a shutdown deadline:
  /// the caller decides what becomes of them (a durable store keeps them for the next start).
  std::vector<Item> take_pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Item> out;
    out.reserve(pending_.size());
    while (!pending_.empty())
      out.push_back(pending_.pop().item);
    if (!out.empty() && active_workers_ == 0) idle_.notify_all();  // as take_if: wait_idle wakes
    return out;
  }

  /// Waits until nothing waits or runs, or until `timeout`. True when idle.
  bool wait_idle(std::chrono::steady_clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return idle_.wait_for(lock, timeout,
                          [this] { return pending_.empty() && active_workers_ == 0; });
  }

  std::size_t depth() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.size();
  }
  /// The items waiting for which `pred` is true (a walk over them all, under the lock).
  template <typename Pred>
  std::size_t count_if(Pred pred) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.count_if(pred);
  }
  /// How many items waiting have each of `keys` as their batch key (one walk for them all).
  std::vector<std::size_t> count_keys(const std::vector<const void*>& keys) const {
    std::vector<std::size_t> out(keys.size(), 0);
    if (!batch_key_ || keys.empty()) return out;
    count_if([&](const Item& item) {
      const void* key = batch_key_(item);
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (keys[i] == key) ++out[i];
      return false;
    });
    return out;
  }
  /// The least urgent level that has items waiting (the highest number); -1 when none waits.
  int least_urgent_level() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.least_urgent_level();
  }
  /// Items being handled now.
  std::size_t running() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }
  std::size_t handler_failures() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return handler_failures_;
  }
  std::size_t capacity() const { return options_.capacity; }
  const WorkQueueOptions& options() const { return options_; }
  boost::asio::any_io_executor get_executor() const { return executor_; }

 private:
  struct Pending {
    Item item;
    std::chrono::steady_clock::time_point enqueued;
  };

  // Under mutex_: whether a batch may be taken now: full, the oldest item's delay is over, or
  // the queue is closed (no more arrivals to wait for).
  bool batch_due_locked(std::chrono::steady_clock::time_point now) const {
    if (pending_.empty()) return false;
    if (closed_ || pending_.size() >= options_.max_batch_size ||
        options_.max_queue_delay.count() == 0) {
      return true;
    }
    return now - pending_.oldest() >= options_.max_queue_delay;
  }

  std::chrono::steady_clock::time_point now() const {
    return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
  }

  // Under mutex_: claims a worker when a batch is due at `now` and one is free (the caller must
  // post it: a claim nobody posts is a worker lost for good), or arms the timer for when the
  // oldest item's delay runs out.
  bool schedule_locked(std::chrono::steady_clock::time_point now) {
    if (pending_.empty() || active_workers_ >= options_.workers) return false;
    if (batch_due_locked(now)) {
      ++active_workers_;
      return true;
    }
    if (!timer_armed_) {
      timer_armed_ = true;
      // The time left by `now`, on the steady clock the timer runs on (an injected clock behind
      // it would otherwise find the deadline passed but the batch not due, again and again).
      timer_.expires_after(pending_.oldest() + options_.max_queue_delay - now);
      timer_.async_wait([this](const boost::system::error_code&) { on_timer(); });
    }
    return false;
  }

  void on_timer() {
    std::unique_lock<std::mutex> lock(mutex_);
    timer_armed_ = false;
    const bool start = schedule_locked(now());
    if (active_workers_ == 0 && !timer_armed_) idle_.notify_all();
    lock.unlock();
    if (start) boost::asio::post(executor_, [this] { drain(); });
  }

  // One worker: takes due batches until none is due. After a few batches it re-posts itself
  // instead of looping on, so a busy queue still lets other work on the executor run.
  void drain() {
    constexpr int batches_per_turn = 16;
    for (int n = 0; n < batches_per_turn; ++n) {
      std::vector<Item> batch;
      bool another = false;  // a batch cut at another key: a second worker for what is left
      bool again = false;    // no batch could be formed: this worker's turn comes again
      {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto now = this->now();
        if (!batch_due_locked(now)) {
          --active_workers_;
          // Arms the timer for a partial batch, if any waits: judged at the same `now`, so it
          // claims no worker here. (With a second look at the clock, a delay that ran out in
          // between claimed a worker that nobody posted: one worker lost each time, the partial
          // batch left without a timer, and with all of them lost the queue stood still, its
          // destructor waiting forever.) Were a worker claimed all the same, this one is it.
          if (schedule_locked(now)) continue;
          if (active_workers_ == 0 && pending_.empty()) idle_.notify_all();
          return;
        }
        const std::size_t take = std::min(options_.max_batch_size, pending_.size());
        try {
          batch.reserve(take);
          batch.push_back(pending_.pop().item);
          const void* key = batch_key_ && take > 1 ? batch_key_(batch.front()) : nullptr;
          for (std::size_t i = 1; i < take; ++i) {
            if (batch_key_ && batch_key_(pending_.front()) != key) break;
            batch.push_back(pending_.pop().item);
          }
        } catch (...) {
          // The batch's room or a key threw (an allocation that failed): counted as a handler's
          // failure. What was popped runs all the same; with nothing popped, this worker tries
          // again after what else waits on the executor. Leaving by the exception instead would
          // drop the items popped and lose the worker.
          ++handler_failures_;
          again = batch.empty();
        }
        try {
          if (on_taken_ && !batch.empty()) on_taken_(batch);
        } catch (...) {
          ++handler_failures_;  // (the batch runs without the hook's count)
        }
        running_ += batch.size();
        // What the cut left (another key's items, due already or soon) does not wait for this
        // batch's handler: a free worker takes it, or the timer is armed for it.
        if (!again && batch.size() < take) another = schedule_locked(now);
      }
      if (again) break;
      if (another) boost::asio::post(executor_, [this] { drain(); });
      const std::size_t size = batch.size();
      bool failed = false;
      try {
        handler_(std::move(batch));
      } catch (...) {
        failed = true;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      running_ -= size;
      if (failed) ++handler_failures_;
    }
    boost::asio::post(executor_, [this] { drain(); });
  }

  boost::asio::any_io_executor executor_;
  WorkQueueOptions options_;
  Handler handler_;
  const BatchKey batch_key_;
  const OnTaken on_taken_;

  mutable std::mutex mutex_;
  std::condition_variable idle_;
  // One entry per group, the groups with items taking turns (each its weight's worth of items in
  // a row); within a group, a FIFO per priority level, the lowest level first.
  class Turns {
   public:
    static constexpr int count = 10;
    explicit Turns(const WorkQueueOptions& options) : options_(options) {}
    void push(Pending p, int level, std::string_view group) {
      auto it = groups_.find(group);
      if (it == groups_.end()) {
        // Groups left empty are kept for reuse; past a bound of idle ones they go (a sweep only
        // when there are that many idle groups to drop, not at each new group).
        if (groups_.size() >= max_idle_groups + turn_.size()) drop_empty();
        it = groups_.emplace(std::string(group), Group{}).first;
        const auto weight = options_.weights.find(group);
        it->second.weight = std::max(
            1u, weight == options_.weights.end() ? options_.default_weight : weight->second);
      }
      Group& g = it->second;
      const int l = std::clamp(level, 0, count - 1);
      std::deque<Pending>& lane = g.lane(l);
      lane.push_back(std::move(p));
      if (g.size == 0) {  // it joins the turns (the item goes again if that cannot be)
        try {
          turn_.push_back(&*it);
        } catch (...) {
          lane.pop_back();
          throw;
        }
        g.credit = g.weight;
      }
      ++g.size;
      ++size_;
      ++per_level_[static_cast<std::size_t>(l)];
    }
    Pending pop() {  // precondition: !empty()
      if (turn_.empty()) throw Error("WorkQueue: pop from an empty queue");
      Entry* e = turn_.front();
      Group& g = e->second;
      Lane& lane = g.first();
      // Its turn is over after this item (its next ones wait for the others'): it goes to the
      // back first, so that nothing is taken when that cannot be.
      const bool rotate = g.size > 1 && g.credit == 1;
      if (rotate) turn_.push_back(e);
      Pending p = std::move(lane.items.front());
      lane.items.pop_front();
      --g.size;
      --size_;
      --per_level_[static_cast<std::size_t>(lane.level)];
      if (rotate) {
        turn_.pop_front();  // its place at the back is taken already
        g.credit = g.weight;
      } else if (g.size == 0) {
        turn_.pop_front();  // nothing left: it joins the turns again with its next item
      } else {
        --g.credit;  // its turn goes on
      }
      return p;
    }
    // The item pop() would take. Precondition: !empty().
    const Item& front() const {
      if (turn_.empty()) throw Error("WorkQueue: front of an empty queue");
      for (const Lane& l : turn_.front()->second.lanes)
        if (!l.items.empty()) return l.items.front().item;
      throw Error("WorkQueue: a group without items took a turn");
    }
    // When the item that has waited longest was queued. Precondition: !empty().
    std::chrono::steady_clock::time_point oldest() const {
      auto out = std::chrono::steady_clock::time_point::max();
      for (const Entry* e : turn_)
        for (const Lane& lane : e->second.lanes)
          if (!lane.items.empty()) out = std::min(out, lane.items.front().enqueued);
      return out;
    }
    template <typename Pred>
    std::vector<Item> take_if(Pred& pred) {
      std::vector<Item> out;
      // Groups left without items leave the turns, however this ends.
      struct Tidy {
        std::deque<Entry*>& turn;
        ~Tidy() {
          turn.erase(std::remove_if(turn.begin(), turn.end(),
                                    [](const Entry* e) { return e->second.size == 0; }),
                     turn.end());
        }
      } tidy{turn_};
      // Group by group, in turn order, each group's levels in order.
      for (Entry* e : turn_) {
        Group& g = e->second;
        for (Lane& lane : g.lanes) {
          for (auto it = lane.items.begin(); it != lane.items.end();) {
            if (!pred(static_cast<const Item&>(it->item))) {
              ++it;
              continue;
            }
            out.push_back(std::move(it->item));
            it = lane.items.erase(it);
            --g.size;
            --size_;
            --per_level_[static_cast<std::size_t>(lane.level)];
          }
        }
      }
      return out;
    }
    template <typename Pred>
    std::size_t count_if(Pred& pred) const {
      std::size_t n = 0;
      for (const Entry* e : turn_)
        for (const Lane& lane : e->second.lanes)
          for (const Pending& p : lane.items)
            n += pred(p.item) ? 1 : 0;
      return n;
    }
    std::size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    int least_urgent_level() const {
      for (int level = count - 1; level >= 0; --level)
        if (per_level_[static_cast<std::size_t>(level)] > 0) return level;
      return -1;
    }
    void clear() {
      turn_.clear();
      groups_.clear();
      per_level_.fill(0);
      size_ = 0;
    }

   private:
    static constexpr std::size_t max_idle_groups = 1024;
    struct Lane {
      int level = 0;
      std::deque<Pending> items;
    };
    struct Group {
      // By level, the lowest first; a lane left empty is kept for reuse (at most `count`). A
      // list: its lanes never move (a deque of move-only items cannot be copied).
      std::list<Lane> lanes;
      std::size_t size = 0;
      unsigned weight = 1, credit = 1;
      std::deque<Pending>& lane(int level) {
        auto it = std::find_if(lanes.begin(), lanes.end(),
                               [&](const Lane& l) { return l.level >= level; });
        if (it == lanes.end() || it->level != level) it = lanes.insert(it, Lane{level, {}});
        return it->items;
      }
      Lane& first() {  // precondition: size > 0
        for (Lane& l : lanes)
          if (!l.items.empty()) return l;
        throw Error("WorkQueue: a group without items took a turn");
      }
    };
    using Entry = std::pair<const std::string, Group>;
    void drop_empty() {
      for (auto it = groups_.begin(); it != groups_.end();)
        it = it->second.size == 0 ? groups_.erase(it) : std::next(it);
    }
    const WorkQueueOptions& options_;
    std::map<std::string, Group, std::less<>> groups_;
    std::deque<Entry*> turn_;  // the groups with items, in the order they take their turn
    std::array<std::size_t, count> per_level_{};
    std::size_t size_ = 0;
  };
  Turns pending_{options_};
  boost::asio::steady_timer timer_;
  bool timer_armed_ = false;
  std::size_t active_workers_ = 0;
  std::size_t running_ = 0;
  std::size_t handler_failures_ = 0;
  bool closed_ = false;
  bool executor_ended_ = false;
};

}  // namespace rebound::detail

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
};

/// A bounded FIFO (one per priority level) with a worker pool and dynamic batching (as Triton's
/// dynamic batcher).
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

  WorkQueue(boost::asio::any_io_executor executor, WorkQueueOptions options, Handler handler)
      : executor_(std::move(executor)),
        options_(options),
        handler_(std::move(handler)),
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
    idle_.wait(lock, [this] { return active_workers_ == 0 && !timer_armed_; });
  }

  /// Adds an item at the back of its `group`'s queue in priority `level` (0 to 9, clamped; 0, the
  /// default here, is taken first). Workers take items from the lowest level that has any; within
  /// a level, the groups that have items take turns, one item each (round robin), FIFO within a
  /// group: a group with many items waiting delays another group's item by at most one of its own
  /// per turn. (rebound::JobQueue makes each tenant a group.) `full` when `capacity` items wait;
  /// `closed` after `close()`. The item is moved from only when accepted: on `full` or `closed`
  /// the caller still has it.
  PushResult try_push(Item&& item, int level = 0, std::string_view group = {}) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) return PushResult::closed;
    if (pending_.size() >= options_.capacity) return PushResult::full;
    pending_.push({std::move(item), std::chrono::steady_clock::now()}, level, group);
    const bool start = schedule_locked();
    lock.unlock();
    if (start) boost::asio::post(executor_, [this] { drain(); });
    return PushResult::accepted;
  }

  /// Stops accepting items. Items already accepted still run, without waiting for batches to fill.
  void close() {
    std::unique_lock<std::mutex> lock(mutex_);
    closed_ = true;
    const bool start = schedule_locked();
    lock.unlock();
    if (start) boost::asio::post(executor_, [this] { drain(); });
  }

  /// Removes and returns the waiting items for which `pred(const Item&)` is true, in the order
  /// they would have been taken (`pred` runs under the queue's lock: keep it short). For items
  /// that must not wait any longer (expired, cancelled).
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

  // Under mutex_: claims a worker when a batch is due and one is free (the caller posts it), or
  // arms the timer for when the oldest item's delay runs out.
  bool schedule_locked() {
    if (pending_.empty() || active_workers_ >= options_.workers) return false;
    if (batch_due_locked(std::chrono::steady_clock::now())) {
      ++active_workers_;
      return true;
    }
    if (!timer_armed_) {
      timer_armed_ = true;
      timer_.expires_at(pending_.oldest() + options_.max_queue_delay);
      timer_.async_wait([this](const boost::system::error_code&) { on_timer(); });
    }
    return false;
  }

  void on_timer() {
    std::unique_lock<std::mutex> lock(mutex_);
    timer_armed_ = false;
    const bool start = schedule_locked();
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
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!batch_due_locked(std::chrono::steady_clock::now())) {
          --active_workers_;
          schedule_locked();  // arms the timer for a partial batch, if any waits
          if (active_workers_ == 0 && pending_.empty()) idle_.notify_all();
          return;
        }
        const std::size_t take = std::min(options_.max_batch_size, pending_.size());
        batch.reserve(take);
        for (std::size_t i = 0; i < take; ++i) {
          batch.push_back(pending_.pop().item);
        }
        running_ += take;
      }
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

  mutable std::mutex mutex_;
  std::condition_variable idle_;
  // Per priority level, one FIFO per group, the groups with items taking turns; items are taken
  // from the lowest level number that has any.
  class Levels {
   public:
    static constexpr int count = 10;
    void push(Pending p, int level, std::string_view group) {
      Level& l = levels_[static_cast<std::size_t>(std::clamp(level, 0, count - 1))];
      auto it = l.groups.find(group);
      if (it == l.groups.end()) {
        // Groups left empty are kept for reuse; past a bound they go.
        if (l.groups.size() >= max_idle_groups) l.drop_empty();
        it = l.groups.emplace(std::string(group), std::deque<Pending>()).first;
      }
      if (it->second.empty()) l.turn.push_back(&*it);
      it->second.push_back(std::move(p));
      ++size_;
    }
    Pending pop() {  // precondition: !empty()
      for (auto& l : levels_) {
        if (l.turn.empty()) continue;
        Group* g = l.turn.front();
        l.turn.pop_front();
        Pending p = std::move(g->second.front());
        g->second.pop_front();
        if (!g->second.empty()) l.turn.push_back(g);  // its next item waits for the others' turn
        --size_;
        return p;
      }
      throw Error("WorkQueue: pop from an empty queue");
    }
    // When the item that has waited longest was queued. Precondition: !empty().
    std::chrono::steady_clock::time_point oldest() const {
      auto out = std::chrono::steady_clock::time_point::max();
      for (const auto& l : levels_)
        for (const Group* g : l.turn)
          out = std::min(out, g->second.front().enqueued);
      return out;
    }
    template <typename Pred>
    std::vector<Item> take_if(Pred& pred) {
      std::vector<Item> out;
      for (auto& l : levels_) {
        // In the order they would have been taken: group by group, in turn order.
        for (Group* g : l.turn) {
          auto& items = g->second;
          for (auto it = items.begin(); it != items.end();) {
            if (!pred(static_cast<const Item&>(it->item))) {
              ++it;
              continue;
            }
            out.push_back(std::move(it->item));
            it = items.erase(it);
            --size_;
          }
        }
        l.turn.erase(std::remove_if(l.turn.begin(), l.turn.end(),
                                    [](const Group* g) { return g->second.empty(); }),
                     l.turn.end());
      }
      return out;
    }
    std::size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    int least_urgent_level() const {
      for (int level = count - 1; level >= 0; --level)
        if (!levels_[static_cast<std::size_t>(level)].turn.empty()) return level;
      return -1;
    }
    void clear() {
      for (auto& l : levels_) {
        l.turn.clear();
        l.groups.clear();
      }
      size_ = 0;
    }

   private:
    static constexpr std::size_t max_idle_groups = 1024;
    using Group = std::pair<const std::string, std::deque<Pending>>;
    struct Level {
      std::map<std::string, std::deque<Pending>, std::less<>> groups;
      std::deque<Group*> turn;  // the groups with items, in the order they take their turn
      void drop_empty() {
        for (auto it = groups.begin(); it != groups.end();)
          it = it->second.empty() ? groups.erase(it) : std::next(it);
      }
    };
    std::array<Level, count> levels_;
    std::size_t size_ = 0;
  };
  Levels pending_;
  boost::asio::steady_timer timer_;
  bool timer_armed_ = false;
  std::size_t active_workers_ = 0;
  std::size_t running_ = 0;
  std::size_t handler_failures_ = 0;
  bool closed_ = false;
};

}  // namespace rebound::detail

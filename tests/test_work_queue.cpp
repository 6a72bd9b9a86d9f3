// WorkQueue (detail): every accepted item is handled once, the worker bound holds, full and closed
// answers, a throwing handler does not stop the workers, and dynamic batches form by size and by
// delay. Run for several worker counts.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include <boost/asio/thread_pool.hpp>

#include "pipeline/work_queue.hpp"
#include "support/receiver.hpp"

using namespace std::chrono_literals;
using rebound::Job;
using JobQueue = rebound::detail::WorkQueue<rebound::Job>;
using rebound::detail::PushResult;

namespace {

// Holds handlers until opened.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [this] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(m_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

Job job(int n) {
  return Job{"job-" + std::to_string(n), {}, n, {}};
}

rebound::detail::WorkQueueOptions opts(std::size_t capacity, std::size_t workers,
                                       std::size_t batch = 1,
                                       std::chrono::microseconds delay = 0us) {
  return {capacity, workers, batch, delay};
}

}  // namespace

TEST_CASE("every accepted job is handled exactly once with at most `workers` at a time") {
  for (std::size_t workers : {1u, 2u, 8u}) {
    CAPTURE(workers);
    boost::asio::thread_pool pool(8);
    std::mutex m;
    std::multiset<std::string> seen;
    std::atomic<int> running{0}, peak{0};
    {
      JobQueue queue(pool.get_executor(), opts(2000, workers), [&](std::vector<Job> batch) {
        REQUIRE(batch.size() == 1);  // batching is off by default
        const int now = ++running;
        int prev = peak.load();
        while (now > prev && !peak.compare_exchange_weak(prev, now)) {
        }
        std::this_thread::sleep_for(50us);
        {
          std::lock_guard<std::mutex> lock(m);
          seen.insert(batch[0].id);
        }
        --running;
      });
      for (int i = 0; i < 1000; ++i)
        REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
      REQUIRE(queue.wait_idle(30s));
      CHECK(queue.depth() == 0);
      CHECK(queue.running() == 0);
    }
    CHECK(seen.size() == 1000);
    for (int i = 0; i < 1000; ++i)
      CHECK(seen.count("job-" + std::to_string(i)) == 1);
    CHECK(peak.load() <= static_cast<int>(workers));
    if (workers > 1) CHECK(peak.load() >= 2);  // workers really run side by side
    pool.join();
  }
}

TEST_CASE("a full queue answers `full` and takes jobs again once it drains") {
  boost::asio::thread_pool pool(2);
  Gate gate;
  std::atomic<int> handled{0};
  JobQueue queue(pool.get_executor(), opts(3, 1), [&](std::vector<Job> batch) {
    gate.wait();
    handled += static_cast<int>(batch.size());
  });
  REQUIRE(queue.try_push(job(0)) == PushResult::accepted);
  REQUIRE(rebound::test::eventually([&] { return queue.running() == 1; }));
  for (int i = 1; i <= 3; ++i)
    CHECK(queue.try_push(job(i)) == PushResult::accepted);
  CHECK(queue.depth() == 3);
  CHECK(queue.try_push(job(4)) == PushResult::full);
  gate.open();
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 4);
  CHECK(queue.try_push(job(5)) == PushResult::accepted);
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 5);
}

TEST_CASE("close refuses new jobs but drains the accepted ones") {
  for (std::size_t workers : {1u, 4u}) {
    CAPTURE(workers);
    boost::asio::thread_pool pool(4);
    Gate gate;
    std::atomic<int> handled{0};
    JobQueue queue(pool.get_executor(), opts(100, workers), [&](std::vector<Job> batch) {
      gate.wait();
      handled += static_cast<int>(batch.size());
    });
    for (int i = 0; i < 20; ++i)
      REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
    queue.close();
    CHECK(queue.try_push(job(99)) == PushResult::closed);
    gate.open();
    REQUIRE(queue.wait_idle(10s));
    CHECK(handled == 20);
  }
}

TEST_CASE("a handler that throws is counted and the workers carry on") {
  boost::asio::thread_pool pool(2);
  std::atomic<int> handled{0};
  JobQueue queue(pool.get_executor(), opts(100, 2), [&](std::vector<Job> batch) {
    ++handled;
    if (batch[0].input.get<int>() % 2 == 0) throw std::runtime_error("boom");
  });
  for (int i = 0; i < 10; ++i)
    REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 10);
  CHECK(queue.handler_failures() == 5);
}

TEST_CASE("a batch key or taken hook that throws loses no item and no worker") {
  // (JobQueue's key and hook may allocate: a bad_alloc there left the queue without the worker.)
  boost::asio::thread_pool pool(2);
  Gate gate;
  std::atomic<int> keys{0}, takes{0}, taken_items{0}, handled{0};
  auto key = [&](const Job&) -> const void* {
    if (++keys == 1) throw std::bad_alloc();
    return nullptr;
  };
  auto taken = [&](std::vector<Job>& batch) {
    taken_items += static_cast<int>(batch.size());  // (also the batch whose key threw)
    if (++takes == 2) throw std::bad_alloc();
  };
  JobQueue queue(
      pool.get_executor(), opts(100, 1, 4),
      [&](std::vector<Job> batch) {
        gate.wait();
        handled += static_cast<int>(batch.size());
      },
      key, taken);
  for (int i = 0; i < 9; ++i)
    REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
  gate.open();
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 9);
  CHECK(queue.handler_failures() == 2);
  // The one worker is still there for what comes next.
  for (int i = 9; i < 12; ++i)
    REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 12);
  CHECK(taken_items == 12);
}

TEST_CASE("batches fill up to max_batch_size from what is waiting - in order") {
  for (std::size_t workers : {1u, 3u}) {
    CAPTURE(workers);
    boost::asio::thread_pool pool(4);
    Gate gate;
    std::mutex m;
    std::vector<std::vector<int>> batches;
    JobQueue queue(pool.get_executor(), opts(1000, workers, 8), [&](std::vector<Job> batch) {
      gate.wait();
      std::vector<int> ids;
      for (auto& j : batch)
        ids.push_back(j.input.get<int>());
      std::lock_guard<std::mutex> lock(m);
      batches.push_back(ids);
    });
    // The first `workers` jobs start alone; the rest pile up behind the closed gate.
    for (int i = 0; i < 100; ++i)
      REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
    gate.open();
    REQUIRE(queue.wait_idle(10s));
    std::size_t total = 0, largest = 0;
    std::set<int> seen;
    for (const auto& b : batches) {
      CHECK(b.size() <= 8);
      total += b.size();
      largest = std::max(largest, b.size());
      for (std::size_t k = 1; k < b.size(); ++k)
        CHECK(b[k] == b[k - 1] + 1);  // FIFO within a batch
      seen.insert(b.begin(), b.end());
    }
    CHECK(total == 100);
    CHECK(seen.size() == 100);
    CHECK(largest == 8);
    CHECK(batches.size() < 100);
  }
}

TEST_CASE("items of different batch keys never share a batch - a batch ends at another key") {
  // (A JobQueue of several model versions keys its items by version.)
  boost::asio::thread_pool pool(2);
  Gate gate;
  std::mutex m;
  std::vector<std::vector<int>> batches;
  static const char version_a = 'a', version_b = 'b';
  auto key = [](const Job& j) -> const void* {
    return j.input.get<int>() % 10 == 3 ? &version_b : &version_a;  // job 3 and 13 are b's
  };
  JobQueue queue(
      pool.get_executor(), opts(100, 1, 4),
      [&](std::vector<Job> batch) {
        gate.wait();
        std::lock_guard<std::mutex> lock(m);
        batches.emplace_back();
        for (const auto& j : batch)
          batches.back().push_back(j.input.get<int>());
      },
      key);
  REQUIRE(queue.try_push(job(0)) == PushResult::accepted);
  REQUIRE(rebound::test::eventually([&] { return queue.running() == 1; }));
  for (int n : {1, 2, 3, 4, 13, 5})  // queued while the worker holds job 0
    REQUIRE(queue.try_push(job(n)) == PushResult::accepted);
  gate.open();
  REQUIRE(queue.wait_idle(10s));
  std::lock_guard<std::mutex> lock(m);
  const std::vector<std::vector<int>> expected = {{0}, {1, 2}, {3}, {4}, {13}, {5}};
  CHECK(batches == expected);  // in order, each batch of one key
}

TEST_CASE("what a batch cut at another key leaves goes to a free worker - not after the batch") {
  // Two versions' items arrive within one delay: the first version's batch blocks in its
  // handler; the other version's item must not wait for it while a second worker is free.
  boost::asio::thread_pool pool(2);
  Gate gate;
  std::atomic<int> b_handled{0};
  static const char version_a = 'a', version_b = 'b';
  JobQueue queue(
      pool.get_executor(), opts(100, 2, 4, 20ms),
      [&](std::vector<Job> batch) {
        if (batch.front().input.get<int>() < 10) {
          gate.wait();  // version a: a slow model call
        } else {
          b_handled += static_cast<int>(batch.size());
        }
      },
      [](const Job& j) -> const void* {
        return j.input.get<int>() < 10 ? &version_a : &version_b;
      });
  for (int n : {1, 2, 11})
    REQUIRE(queue.try_push(job(n)) == PushResult::accepted);
  CHECK(rebound::test::eventually([&] { return b_handled.load() == 1; }));
  gate.open();
  REQUIRE(queue.wait_idle(10s));
  CHECK(b_handled == 1);
}

TEST_CASE("a partial batch waits for max_queue_delay - then goes without filling up") {
  boost::asio::thread_pool pool(2);
  std::mutex m;
  std::vector<std::size_t> sizes;
  std::vector<std::chrono::steady_clock::time_point> when;
  // (500 ms: the three pushes below land well within it, under a sanitizer's slowdown too.)
  JobQueue queue(pool.get_executor(), opts(100, 1, 16, 500ms), [&](std::vector<Job> batch) {
    std::lock_guard<std::mutex> lock(m);
    sizes.push_back(batch.size());
    when.push_back(std::chrono::steady_clock::now());
  });
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i)
    REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
  REQUIRE(rebound::test::eventually([&] {
    std::lock_guard<std::mutex> lock(m);
    return !sizes.empty();
  }));
  std::lock_guard<std::mutex> lock(m);
  REQUIRE(sizes.size() == 1);
  CHECK(sizes[0] == 3);             // the three waited together...
  CHECK(when[0] - start >= 500ms);  // ...for the delay, since 16 never came
}

TEST_CASE("a full batch goes at once without waiting for the delay") {
  boost::asio::thread_pool pool(2);
  std::promise<std::size_t> first;
  std::atomic<bool> done{false};
  JobQueue queue(pool.get_executor(), opts(100, 1, 4, 10s), [&](std::vector<Job> batch) {
    if (!done.exchange(true)) first.set_value(batch.size());
  });
  for (int i = 0; i < 4; ++i)
    REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
  auto f = first.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);  // far less than the 10 s delay
  CHECK(f.get() == 4);
}

TEST_CASE("closing the queue sends a waiting partial batch at once") {
  boost::asio::thread_pool pool(2);
  std::atomic<int> handled{0};
  JobQueue queue(pool.get_executor(), opts(100, 1, 16, 10s),
                 [&](std::vector<Job> batch) { handled += static_cast<int>(batch.size()); });
  for (int i = 0; i < 5; ++i)
    REQUIRE(queue.try_push(job(i)) == PushResult::accepted);
  queue.close();
  REQUIRE(queue.wait_idle(5s));
  CHECK(handled == 5);
}

// A worker that finds a partial batch not yet due leaves it to the timer. It judged the batch
// and armed the timer at two looks at the clock: when the delay ran out between them, the second
// look claimed a worker that nobody started, and the batch had no timer either. Each time one
// worker was lost; with all of them lost the queue stood still and its destructor waited
// forever (an Iris test ran into ctest's timeout, 2026-12-06). A clock that moves at every look
// makes the delay run out exactly there.
TEST_CASE(
    "a partial batch a worker leaves goes when its delay runs out - whenever the clock moves") {
  boost::asio::thread_pool pool(2);
  const auto base = std::chrono::steady_clock::now();
  std::atomic<int> looks{0};
  auto o = opts(100, 1, 2, 2ms);
  o.clock = [&] { return base + std::chrono::milliseconds(++looks); };
  std::atomic<int> handled{0};
  JobQueue* self = nullptr;
  JobQueue queue(pool.get_executor(), o, [&](std::vector<Job> batch) {
    // The second item arrives while the only worker is busy with the first: that worker finds
    // it waiting, not yet due, when it is done.
    for (const Job& j : batch)
      if (j.id == "job-0") CHECK(self->try_push(job(1)) == PushResult::accepted);
    handled += static_cast<int>(batch.size());
  });
  self = &queue;
  REQUIRE(queue.try_push(job(0)) == PushResult::accepted);
  const bool idle = queue.wait_idle(5s);
  if (!idle) {  // a lost worker: the destructor would wait for it forever
    pool.stop();
    pool.join();
    queue.executor_ended();
  }
  CHECK(idle);
  CHECK(handled == 2);
}

TEST_CASE("taking the waiting items wakes a wait for the queue to be idle") {
  boost::asio::thread_pool pool(2);
  // A partial batch waits for a delay far longer than the test; no worker runs.
  JobQueue queue(pool.get_executor(), opts(100, 1, 16, 60s), [](std::vector<Job>) {});
  REQUIRE(queue.try_push(job(0)) == PushResult::accepted);
  auto idle = std::async(std::launch::async, [&] { return queue.wait_idle(60s); });
  std::this_thread::sleep_for(50ms);  // (the wait may begin before or after the take: both end)
  CHECK(queue.take_pending().size() == 1);
  // Woken by the take, not by the delay's timer a minute later.
  REQUIRE(idle.wait_for(5s) == std::future_status::ready);
  CHECK(idle.get());
}

TEST_CASE("bad options are refused") {
  boost::asio::thread_pool pool(1);
  auto noop = [](std::vector<Job>) {};
  CHECK_THROWS_AS(JobQueue(pool.get_executor(), opts(0, 1), noop), rebound::Error);
  CHECK_THROWS_AS(JobQueue(pool.get_executor(), opts(1, 0), noop), rebound::Error);
  CHECK_THROWS_AS(JobQueue(pool.get_executor(), opts(1, 1, 0), noop), rebound::Error);
  CHECK_THROWS_AS(JobQueue(pool.get_executor(), opts(1, 1), nullptr), rebound::Error);
}

namespace {
// A queue of one worker whose handler records the order items run in, held at the gate while
// the test fills the queue: the first item pushed (to `first_group`) is the one it holds.
struct TurnRecorder {
  TurnRecorder(rebound::detail::WorkQueueOptions o, const std::string& first_group)
      : queue(pool.get_executor(), o, [this](std::vector<Job> batch) {
          if (!started.exchange(true)) first_started.set_value();
          gate.wait();
          std::lock_guard<std::mutex> lock(m);
          for (auto& j : batch)
            order.push_back(j.id);
        }) {
    push("first", 5, first_group);
    REQUIRE(first_started.get_future().wait_for(10s) == std::future_status::ready);
  }
  void push(const std::string& id, int level, const std::string& group) {
    Job j{id, {}, 0, {}};
    REQUIRE(queue.try_push(std::move(j), level, group) == PushResult::accepted);
  }
  // Lets everything run; the order it ran in.
  std::vector<std::string> run() {
    gate.open();
    REQUIRE(queue.wait_idle(10s));
    std::lock_guard<std::mutex> lock(m);
    return order;
  }

  boost::asio::thread_pool pool{2};
  Gate gate;
  std::mutex m;
  std::vector<std::string> order;
  std::promise<void> first_started;
  std::atomic<bool> started{false};
  JobQueue queue;
};
}  // namespace

TEST_CASE("groups take turns - a priority orders a group's own items and never another's") {
  TurnRecorder r(opts(1000, 1), "a");
  for (int i = 0; i < 100; ++i)
    r.push("a" + std::to_string(i), 5, "a");  // a flood from one group
  for (int i = 0; i < 3; ++i)
    r.push("b" + std::to_string(i), 5, "b");  // then another group's few
  r.push("c0", 5, "c");
  r.push("urgent", 0, "a");  // goes first among a's items, not before b's and c's turns
  // What a pass of take_if sees, in the order they would run: a, b and c take turns.
  auto taken = r.queue.take_if([](const Job& j) { return j.id == "a99"; });
  REQUIRE(taken.size() == 1);
  const std::vector<std::string> order = r.run();
  REQUIRE(order.size() == 105);
  CHECK(std::vector<std::string>(order.begin(), order.begin() + 9) ==
        std::vector<std::string>{"first", "urgent", "b0", "c0", "a0", "b1", "a1", "b2", "a2"});
  CHECK(order.back() == "a98");
}

TEST_CASE("a group's weight is the items it takes in a row at its turn") {
  auto o = opts(1000, 1);
  o.weights["heavy"] = 3;
  TurnRecorder r(o, "x");
  for (int i = 0; i < 6; ++i)
    r.push("h" + std::to_string(i), 5, "heavy");
  for (int i = 0; i < 4; ++i)
    r.push("l" + std::to_string(i), 0, "light");  // urgent, but only within its own turn
  CHECK(r.run() == std::vector<std::string>{"first", "h0", "h1", "h2", "l0", "h3", "h4", "h5", "l1",
                                            "l2", "l3"});
}

TEST_CASE("a queue whose executor's threads have ended is destroyed without waiting for them") {
  // An owner that joined the pool (rebound::JobQueue's destructor) may still see work pushed by
  // handlers on another executor: a batch posted, or a timer armed for a partial batch, that no
  // thread will ever run. Told so (executor_ended), the destructor waits for neither.
  for (const auto delay : {0us, std::chrono::microseconds(10min)}) {
    CAPTURE(delay.count());
    boost::asio::thread_pool pool(1);
    auto queue = std::make_unique<JobQueue>(pool.get_executor(), opts(10, 1, 4, delay),
                                            [](std::vector<Job>) {});
    pool.stop();
    pool.join();
    REQUIRE(queue->try_push(job(1)) == PushResult::accepted);  // (posted, or the timer armed)
    queue->executor_ended();
    std::promise<void> destroyed;
    std::thread destroy([&] {
      queue.reset();
      destroyed.set_value();
    });
    if (destroyed.get_future().wait_for(10s) != std::future_status::ready) {
      // (hung: what the thread holds is this scope's; nothing can be cleaned up)
      std::fputs("a queue whose executor ended was not destroyed within 10 s\n", stderr);
      std::_Exit(1);
    }
    destroy.join();
  }
}

// JobQueue: every accepted job is handled once, the worker bound holds, full and closed answers,
// and a throwing handler does not stop the workers. Run for several worker counts.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include <boost/asio/thread_pool.hpp>

#include "rebound/job_queue.hpp"
#include "support/receiver.hpp"

using namespace std::chrono_literals;
using rebound::Job;
using rebound::JobQueue;

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

}  // namespace

TEST_CASE("every accepted job is handled exactly once - with at most `workers` at a time") {
  for (std::size_t workers : {1u, 2u, 8u}) {
    CAPTURE(workers);
    boost::asio::thread_pool pool(8);
    std::mutex m;
    std::multiset<std::string> seen;
    std::atomic<int> running{0}, peak{0};
    {
      JobQueue queue(pool.get_executor(), {2000, workers}, [&](Job j) {
        const int now = ++running;
        int prev = peak.load();
        while (now > prev && !peak.compare_exchange_weak(prev, now)) {
        }
        std::this_thread::sleep_for(50us);
        {
          std::lock_guard<std::mutex> lock(m);
          seen.insert(j.id);
        }
        --running;
      });
      for (int i = 0; i < 1000; ++i)
        REQUIRE(queue.try_push(job(i)) == JobQueue::PushResult::accepted);
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

TEST_CASE("a full queue answers `full` - and takes jobs again once it drains") {
  boost::asio::thread_pool pool(2);
  Gate gate;
  std::atomic<int> handled{0};
  JobQueue queue(pool.get_executor(), {3, 1}, [&](Job) {
    gate.wait();
    ++handled;
  });
  REQUIRE(queue.try_push(job(0)) == JobQueue::PushResult::accepted);
  REQUIRE(rebound::test::eventually([&] { return queue.running() == 1; }));
  for (int i = 1; i <= 3; ++i)
    CHECK(queue.try_push(job(i)) == JobQueue::PushResult::accepted);
  CHECK(queue.depth() == 3);
  CHECK(queue.try_push(job(4)) == JobQueue::PushResult::full);
  gate.open();
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 4);
  CHECK(queue.try_push(job(5)) == JobQueue::PushResult::accepted);
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 5);
}

TEST_CASE("close refuses new jobs but drains the accepted ones") {
  for (std::size_t workers : {1u, 4u}) {
    CAPTURE(workers);
    boost::asio::thread_pool pool(4);
    Gate gate;
    std::atomic<int> handled{0};
    JobQueue queue(pool.get_executor(), {100, workers}, [&](Job) {
      gate.wait();
      ++handled;
    });
    for (int i = 0; i < 20; ++i)
      REQUIRE(queue.try_push(job(i)) == JobQueue::PushResult::accepted);
    queue.close();
    CHECK(queue.try_push(job(99)) == JobQueue::PushResult::closed);
    gate.open();
    REQUIRE(queue.wait_idle(10s));
    CHECK(handled == 20);
  }
}

TEST_CASE("a handler that throws is counted and the workers carry on") {
  boost::asio::thread_pool pool(2);
  std::atomic<int> handled{0};
  JobQueue queue(pool.get_executor(), {100, 2}, [&](Job j) {
    ++handled;
    if (j.input.get<int>() % 2 == 0) throw std::runtime_error("boom");
  });
  for (int i = 0; i < 10; ++i)
    REQUIRE(queue.try_push(job(i)) == JobQueue::PushResult::accepted);
  REQUIRE(queue.wait_idle(10s));
  CHECK(handled == 10);
  CHECK(queue.handler_failures() == 5);
}

TEST_CASE("bad options are refused") {
  boost::asio::thread_pool pool(1);
  auto noop = [](Job) {};
  CHECK_THROWS_AS(JobQueue(pool.get_executor(), {0, 1}, noop), rebound::Error);
  CHECK_THROWS_AS(JobQueue(pool.get_executor(), {1, 0}, noop), rebound::Error);
  CHECK_THROWS_AS(JobQueue(pool.get_executor(), {1, 1}, nullptr), rebound::Error);
}

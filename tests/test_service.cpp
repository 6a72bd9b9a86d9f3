// JobQueue without HTTP: the store is the queue. An injected clock moves time on (hours of retry
// schedule, leases running out) without sleeping; a scripted transport at the CallbackTransport
// interface answers at once.
#include <doctest/doctest.h>

#include <atomic>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "rebound/detail/wire.hpp"
#include "rebound/error.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#include "support/fake_clock.hpp"
#include "support/fake_transport.hpp"
#include "support/forwarding_store.hpp"
#include "support/held_model.hpp"
#include "support/quiesce.hpp"
#include "support/receiver.hpp"
#include "support/submitting.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using rebound::CallbackState;
using rebound::JobStatus;
using rebound::test::eventually;
using TimePoint = std::chrono::system_clock::time_point;
using rebound::test::HeldModel;

namespace {

using rebound::test::FakeClock;
using rebound::test::steady_of;

using rebound::test::FakeTransport;

// A store shared by several Services, as several servers share one Redis. While `cut_off` is set,
// this server's lease renewals do not reach it (a network partition): its leases run out.
class SharedStore final : public rebound::test::ForwardingStore {
 public:
  /// While `forgetful` is set, renewals answer that no lease is held (a new primary that lost
  /// the writes: every lease this server holds is lost at once), and renew nothing.
  explicit SharedStore(std::shared_ptr<rebound::JobStore> inner,
                       std::shared_ptr<std::atomic<bool>> cut_off = nullptr,
                       std::shared_ptr<std::atomic<bool>> forgetful = nullptr)
      : ForwardingStore(std::move(inner)),
        cut_off_(std::move(cut_off)),
        forgetful_(std::move(forgetful)) {}
  bool renew(const std::string& id, const rebound::Lease& lease, TimePoint now) override {
    if (cut_off_ && *cut_off_) throw rebound::StoreUnavailable("partitioned");
    if (forgetful_ && *forgetful_) return false;
    return inner_->renew(id, lease, now);
  }

 private:
  std::shared_ptr<std::atomic<bool>> cut_off_;
  std::shared_ptr<std::atomic<bool>> forgetful_;
};

// One JobQueue with its executors, a fake clock and a scripted transport.
struct Node {
  Node(std::unique_ptr<rebound::JobStore> store, std::shared_ptr<FakeClock> clock,
       std::shared_ptr<FakeTransport::Shared> sent, rebound::JobQueueOptions so = {},
       std::unique_ptr<rebound::Model> model = std::make_unique<rebound::EchoModel>(),
       std::unique_ptr<rebound::CallbackTransport> transport = nullptr) {
    if (clock) so.clock = [clock] { return clock->now(); };
    so.poll_interval = 10ms;
    so.delivery.backoff = rebound::backoff::max_tries(rebound::backoff::constant(1h), 5);
    if (!transport) transport = std::make_unique<FakeTransport>(sent);
    service = std::make_unique<rebound::JobQueue>(pool.get_executor(), io.get_executor(),
                                                  std::move(model), std::move(store),
                                                  std::move(transport), so);
  }
  ~Node() {
    service->shutdown(5s);
    service.reset();
    work.reset();
    io_thread.join();
    pool.join();
  }
  boost::asio::thread_pool pool{2};
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::thread io_thread{[this] { io.run(); }};
  std::unique_ptr<rebound::JobQueue> service;
};

rebound::Job job(const std::string& id, const std::string& url = "http://receiver.test/hook") {
  return rebound::Job{id, url, 1, {}};
}

}  // namespace

TEST_CASE("service: callbacks waiting for their next attempt hold no slot") {
  auto clock = std::make_shared<FakeClock>();
  auto sent = std::make_shared<FakeTransport::Shared>();
  sent->script_statuses(
      std::vector<int>(20, 503));  // every first attempt fails; the next is an hour away
  rebound::JobQueueOptions so;
  so.queue_capacity = 2;
  so.origins.breaker_failures = 0;  // every first attempt goes out (the breaker's test is below)
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, sent, so);
  for (int i = 0; i < 20; ++i) {
    const std::string id = "job-" + std::to_string(i);
    // Two in memory at most; a job whose callback waits is out of memory, so the next one fits.
    REQUIRE(eventually([&] { return node.service->telemetry().in_flight() < 2; }));
    REQUIRE(rebound::test::submitted(*node.service, job(id)) == "accepted");
  }
  REQUIRE(eventually(
      [&] { return sent->count() == 20 && node.service->telemetry().in_flight() == 0; }));
  const auto record = node.service->find("job-7");
  CHECK(record->callback.state == CallbackState::pending);
  CHECK(record->callback.attempts == 1);
  CHECK(record->callback.next_attempt_at == clock->now() + 1h);
  CHECK(rebound::detail::to_status_json(*record)["callback"]["next_attempt_at"] ==
        rebound::detail::format_rfc3339(clock->now() + 1h));

  // An hour later they are due: the pump claims them two at a time, and all are delivered.
  clock->advance(1h);
  REQUIRE(eventually([&] {
    for (int i = 0; i < 20; ++i) {  // two go at once: the last may be delivered first
      if (node.service->find("job-" + std::to_string(i))->callback.state !=
          CallbackState::delivered)
        return false;
    }
    return true;
  }));
  CHECK(sent->count() == 40);
  CHECK(node.service->find("job-0")->callback.attempts == 2);
}

TEST_CASE("service: a restart resumes a retry schedule on time - not at once") {
  rebound::test::TempDir dir;
  auto clock = std::make_shared<FakeClock>();
  auto sent = std::make_shared<FakeTransport::Shared>();
  sent->script_statuses({503});
  {
    Node node(std::make_unique<rebound::SqliteJobStore>(dir.file("jobs.db")), clock, sent);
    REQUIRE(rebound::test::submitted(*node.service, job("slow-receiver")) == "accepted");
    REQUIRE(eventually([&] {
      auto r = node.service->find("slow-receiver");
      return r && r->callback.attempts == 1 && node.service->telemetry().in_flight() == 0;
    }));
  }
  clock->advance(10min);
  Node restarted(std::make_unique<rebound::SqliteJobStore>(dir.file("jobs.db")), clock, sent);
  CHECK(restarted.service->telemetry().batch_stats().resumed == 0);  // nothing due yet
  for (int i = 0; i < 3; ++i)                                        // polls: nothing is due yet
    REQUIRE(rebound::test::pump_pass(*restarted.service));
  CHECK(sent->count() == 1);
  auto record = restarted.service->find("slow-receiver");
  CHECK(record->callback.state == CallbackState::pending);
  CHECK(record->callback.next_attempt_at == clock->now() + 50min);

  clock->advance(50min);
  REQUIRE(eventually([&] {
    return restarted.service->find("slow-receiver")->callback.state == CallbackState::delivered;
  }));
  CHECK(sent->count() == 2);
  CHECK(restarted.service->find("slow-receiver")->callback.attempts == 2);
  // Same webhook-id on both attempts: receivers deduplicate across restarts.
  std::lock_guard<std::mutex> lock(sent->m);
  auto webhook_id = [](const rebound::CallbackRequest& r) {
    for (const auto& [name, value] : r.headers)
      if (name == "webhook-id") return value;
    return std::string();
  };
  CHECK(webhook_id(sent->sent[0]) == "msg_slow-receiver");
  CHECK(webhook_id(sent->sent[1]) == "msg_slow-receiver");
}

namespace {
// Two servers on one store, with a lease of an hour (renewed every 20 minutes of the injected
// clock): the first runs `id` in its held model, which takes its only slot (it cannot claim the
// job back itself); the second has room. While `partitioned` is set, the first's renewals do not
// reach the store.
struct Contest {
  explicit Contest(const std::string& id) {
    rebound::JobQueueOptions so;
    so.lease = 1h;
    so.server_id = "first";
    so.queue_capacity = 1;
    auto model = std::make_unique<HeldModel>();
    held = model.get();
    first = std::make_unique<Node>(std::make_unique<SharedStore>(store, partitioned), clock, sent,
                                   so, std::move(model));
    REQUIRE(rebound::test::submitted(*first->service, job(id)) == "accepted");
    REQUIRE(held->wait_started(1));
    so.server_id = "second";
    so.queue_capacity = 100;
    second = std::make_unique<Node>(std::make_unique<SharedStore>(store), clock, sent, so,
                                    std::make_unique<rebound::EchoModel>());
  }
  std::shared_ptr<FakeClock> clock = std::make_shared<FakeClock>();
  std::shared_ptr<FakeTransport::Shared> sent = std::make_shared<FakeTransport::Shared>();
  std::shared_ptr<rebound::MemoryJobStore> store = std::make_shared<rebound::MemoryJobStore>();
  std::shared_ptr<std::atomic<bool>> partitioned = std::make_shared<std::atomic<bool>>(false);
  HeldModel* held = nullptr;
  std::unique_ptr<Node> first, second;
};
}  // namespace

TEST_CASE("service: a job whose lease runs out is taken over - the late result is refused") {
  Contest c("contested");
  REQUIRE(rebound::test::pump_pass(*c.second->service));  // a poll: the job is held
  CHECK(c.second->service->telemetry().batch_stats().resumed == 0);

  // Cut off from the store, the first server cannot renew: its lease runs out.
  *c.partitioned = true;
  c.clock->advance(61min);
  REQUIRE(eventually([&] {
    auto r = c.store->get("contested");
    return r->status == JobStatus::succeeded && r->callback.state == CallbackState::delivered;
  }));
  CHECK(eventually([&] { return c.second->service->telemetry().batch_stats().resumed == 1; }));
  CHECK(c.store->get("contested")->outcome.result == 1);  // the echo model's answer

  c.held->open();  // the first server's model answers at last: its acknowledgement is refused
  REQUIRE(
      eventually([&] { return c.first->service->telemetry().metrics().leases_lost.load() == 1; }));
  CHECK(c.store->get("contested")->outcome.result == 1);
  // (The lost lease is counted before its slot is freed.)
  CHECK(eventually([&] { return c.first->service->telemetry().in_flight() == 0; }));
  CHECK(c.sent->count() == 1);  // one callback, from the server whose result was kept
}

TEST_CASE(
    "service: every lease lost at once - a primary that knows none - the server goes on and every "
    "job ends") {
  // What a Redis failover can do to a server: the node it is sent to answers every renewal with
  // "not held" (an empty master, before it learns it is a replica). Every job it holds, queued,
  // running or calling back, is lost to it at once; the store still has them, and once their
  // leases run out they are claimed again.
  auto clock = std::make_shared<FakeClock>();
  auto sent = std::make_shared<FakeTransport::Shared>();
  auto store = std::make_shared<rebound::MemoryJobStore>();
  auto forgetful = std::make_shared<std::atomic<bool>>(false);
  rebound::JobQueueOptions so;
  so.lease = 1min;
  so.server_id = "one";
  so.queue_capacity = 100;
  so.workers = 2;
  auto model = std::make_unique<HeldModel>();
  HeldModel* held = model.get();
  Node n(std::make_unique<SharedStore>(store, nullptr, forgetful), clock, sent, so,
         std::move(model));
  constexpr int jobs = 40;
  for (int i = 0; i < jobs; ++i)
    REQUIRE(rebound::test::submitted(*n.service, job("j" + std::to_string(i))) == "accepted");
  REQUIRE(held->wait_started(2));
  *forgetful = true;
  clock->advance(21s);  // past a third of the lease: the pump renews, and hears "not held"
  const bool renewed = rebound::test::pump_pass(*n.service);
  *forgetful = false;
  held->open();
  REQUIRE(renewed);
  // The store's leases run out; the server claims its own jobs again and runs them.
  for (int step = 0; step < 4; ++step) {
    clock->advance(1min);
    REQUIRE(rebound::test::pump_pass(*n.service));
  }
  REQUIRE(eventually(
      [&] {
        for (int i = 0; i < jobs; ++i) {
          const auto r = store->get("j" + std::to_string(i));
          if (!r || r->status != JobStatus::succeeded ||
              r->callback.state != CallbackState::delivered)
            return false;
        }
        return true;
      },
      20000ms));
  CHECK(n.service->telemetry().batch_stats().resumed > 0);  // claimed again, not kept running
  CHECK(eventually([&] { return n.service->telemetry().in_flight() == 0; }));
}

TEST_CASE("service: a live server renews its lease on the injected clock - nobody takes the job") {
  Contest c("long");
  // Three hours of the injected clock, ten minutes at a time: the first server's pump renews as
  // the clock passes each third of its lease, so the second never finds the lease run out.
  for (int step = 0; step < 18; ++step) {
    c.clock->advance(10min);
    REQUIRE(rebound::test::pump_pass(*c.first->service));
    REQUIRE(rebound::test::pump_pass(*c.second->service));
  }
  CHECK(c.store->get("long")->status == JobStatus::running);
  CHECK(c.second->service->telemetry().batch_stats().resumed == 0);
  c.held->open();
  REQUIRE(eventually([&] { return c.store->get("long")->status == JobStatus::succeeded; }));
  CHECK(c.first->service->telemetry().metrics().leases_lost.load() == 0);
}

TEST_CASE("service: a clock stepped back does not hold the pump's polls up for the step") {
  auto clock = std::make_shared<FakeClock>();
  auto sent = std::make_shared<FakeTransport::Shared>();
  auto store = std::make_shared<rebound::MemoryJobStore>();
  Node node(std::make_unique<SharedStore>(store), clock, sent);  // polls every 10 ms of the clock
  REQUIRE(rebound::test::pump_pass(*node.service));
  // The wall clock steps back an hour (an NTP step), and another server puts a job in the store.
  clock->advance(-1h);
  rebound::Job elsewhere = job("put-elsewhere");
  elsewhere.created_at = clock->now();
  REQUIRE(store->put(elsewhere) == rebound::PutOutcome::created);
  // The next poll is due 10 ms on, on the new timeline - not an hour on: the clock moves on 20 ms
  // at each look (minutes in all, never the hour).
  REQUIRE(eventually([&] {
    clock->advance(20ms);
    return store->get("put-elsewhere")->status == JobStatus::succeeded;
  }));
  // The pass counts what it claimed after handing it on, so the job can finish first.
  CHECK(eventually([&] { return node.service->telemetry().batch_stats().resumed == 1; }));
}

namespace {
// Counts what it hears; `throws` makes every hook throw, which must not matter.
struct CountingObserver final : rebound::Observer {
  explicit CountingObserver(bool throws = false) : throws(throws) {}
  bool throws;
  std::atomic<int> accepted{0}, completed{0}, delivered{0}, retried{0}, refused{0};
  void hit(std::atomic<int>& n) {
    ++n;
    if (throws) throw std::runtime_error("observer bug");
  }
  void on_accepted(const std::string&, bool) override { hit(accepted); }
  void on_refused(rebound::errc) override { hit(refused); }
  void on_completed(const rebound::JobRecord& r, std::size_t, double) override {
    if (r.status == JobStatus::succeeded) hit(completed);
  }
  void on_attempt(const std::string&, const rebound::AttemptReport& report) override {
    hit(report.verdict == rebound::AttemptVerdict::delivered ? delivered : retried);
  }
};
}  // namespace

TEST_CASE("service: observers hear the walk of a job - and one that throws changes nothing") {
  auto clock = std::make_shared<FakeClock>();
  auto sent = std::make_shared<FakeTransport::Shared>();
  sent->script_statuses({503});
  auto counting = std::make_shared<CountingObserver>();
  auto throwing = std::make_shared<CountingObserver>(true);
  rebound::JobQueueOptions so;
  so.queue_capacity = 1;
  so.observers = {throwing, counting};
  auto model = std::make_unique<HeldModel>();
  HeldModel* held = model.get();
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, sent, so, std::move(model));
  REQUIRE(rebound::test::submitted(*node.service, job("observed")) == "accepted");
  REQUIRE(held->wait_started(1));
  CHECK(rebound::test::submitted(*node.service, job("refused")) == "queue_full");
  held->open();
  REQUIRE(eventually(
      [&] { return counting->retried == 1 && node.service->telemetry().in_flight() == 0; }));
  clock->advance(1h);
  // (Observers hear a delivery before the store records it and the slot is freed.)
  REQUIRE(eventually(
      [&] { return counting->delivered == 1 && node.service->telemetry().in_flight() == 0; }));
  for (const auto& o : {counting, throwing}) {
    CHECK(o->accepted == 1);
    CHECK(o->refused == 1);
    CHECK(o->completed == 1);
    CHECK(o->retried == 1);
    CHECK(o->delivered == 1);
  }
  // The built-in metrics heard the same events.
  CHECK(node.service->telemetry().metrics().jobs_accepted.load() == 1);
  CHECK(node.service->telemetry().metrics().callbacks_delivered.load() == 1);
  CHECK(node.service->find("observed")->callback.state == CallbackState::delivered);
}

TEST_CASE("service: an attempt that outlasts its lease keeps it - it is never sent twice") {
  auto clock = std::make_shared<FakeClock>();
  auto sent = std::make_shared<FakeTransport::Shared>();
  sent->rule = [](const rebound::CallbackRequest&) { return std::optional<int>(); };  // held
  rebound::JobQueueOptions so;
  so.lease = 150ms;  // renewed every 50 ms of the clock; the receiver answers 600 ms on
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, sent, so);
  REQUIRE(rebound::test::submitted(*node.service, job("slow")) == "accepted");
  REQUIRE(eventually([&] { return sent->count() == 1; }));
  for (int step = 0; step < 30; ++step) {  // 600 ms, the pump renewing and polling in between
    clock->advance(20ms);
    REQUIRE(rebound::test::pump_pass(*node.service));
  }
  CHECK(sent->count() == 1);  // the pump never found it unheld
  sent->release();
  REQUIRE(eventually(
      [&] { return node.service->find("slow")->callback.state == CallbackState::delivered; }));
  CHECK(sent->count() == 1);
  CHECK(node.service->telemetry().metrics().leases_lost.load() == 0);
  CHECK(node.service->find("slow")->callback.attempts == 1);
}

namespace {

// Callbacks to hosts named "down..." answer 503 while `down` is true, everything else 200.
struct Split {
  std::shared_ptr<FakeTransport::Shared> shared = std::make_shared<FakeTransport::Shared>();
  std::shared_ptr<std::atomic<bool>> down = std::make_shared<std::atomic<bool>>(true);
  Split() {
    shared->rule = [down = down](const rebound::CallbackRequest& r) -> std::optional<int> {
      return r.url.find("//down") != std::string::npos && *down ? 503 : 200;
    };
  }
  std::size_t to_down() { return shared->count_to("//down"); }
  std::size_t to_up() { return shared->count_to("//down", false); }
  std::unique_ptr<FakeTransport> transport() { return std::make_unique<FakeTransport>(shared); }
};

}  // namespace

TEST_CASE("service: callbacks behind an open circuit wait in the store - not in a slot") {
  auto clock = std::make_shared<FakeClock>();
  Split split;
  rebound::JobQueueOptions so;
  so.queue_capacity = 4;
  so.origins.breaker_failures = 2;
  so.origins.breaker_cooldown = 1h;
  so.origins.clock = steady_of(clock);
  std::mutex m;
  std::vector<std::string> circuit;  // what the listener heard
  so.origins.on_circuit = [&](const std::string& origin, rebound::CircuitState state,
                              std::size_t failures) {
    std::lock_guard<std::mutex> lock(m);
    circuit.push_back(origin + " " + rebound::to_string(state) + " " + std::to_string(failures));
  };
  std::vector<std::string> log;
  so.logger =
      rebound::Logger(rebound::LogLevel::info, [&](rebound::LogLevel, const std::string& line) {
        std::lock_guard<std::mutex> lock(m);
        if (line.find("circuit_") != std::string::npos) log.push_back(line);
      });
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, nullptr, so,
            std::make_unique<rebound::EchoModel>(), split.transport());
  auto& queue = *node.service;
  for (int i = 0; i < 40; ++i) {
    // Four in memory at most: each callback to the down receiver must leave memory for the next
    // job to fit.
    REQUIRE(eventually([&] { return queue.telemetry().in_flight() < 4; }));
    REQUIRE(rebound::test::submitted(
                queue, job("down-" + std::to_string(i), "http://down.test/hook")) == "accepted");
  }
  REQUIRE(eventually([&] { return queue.telemetry().in_flight() == 0; }));
  CHECK(split.to_down() == 2);  // the two failures that opened the circuit, nothing since
  const auto endpoints = queue.operations().callback_endpoints();
  REQUIRE(endpoints.size() == 1);
  CHECK(endpoints[0].origin == "http://down.test:80");
  CHECK(endpoints[0].state == rebound::CircuitState::open);
  CHECK(endpoints[0].deferred == 38);
  const auto waiting = queue.find("down-30");
  CHECK(waiting->callback.state == CallbackState::pending);
  CHECK(waiting->callback.attempts == 0);  // no attempt spent
  // Due when the cool-down ends, one after another at the origin's pace, not all at once.
  CHECK(waiting->callback.next_attempt_at >= clock->now() + 1h);
  CHECK(waiting->callback.next_attempt_at <= clock->now() + 1h + 1s);
  CHECK(queue.telemetry().metrics().callback_deferrals >= 38);
  CHECK(queue.telemetry().render_metrics().find("rebound_callback_deferrals_total ") !=
        std::string::npos);

  // Another receiver is not touched: its callbacks go at once, with every slot free for them.
  for (int i = 0; i < 20; ++i) {
    REQUIRE(eventually([&] { return queue.telemetry().in_flight() < 4; }));
    REQUIRE(rebound::test::submitted(
                queue, job("up-" + std::to_string(i), "http://up.test/hook")) == "accepted");
  }
  // Up to four callbacks are in flight at once, so the last one submitted can be delivered
  // before an earlier one: wait for all of them.
  REQUIRE(eventually([&] {
    for (int i = 0; i < 20; ++i) {
      if (queue.find("up-" + std::to_string(i))->callback.state != CallbackState::delivered)
        return false;
    }
    return true;
  }));
  CHECK(split.to_up() == 20);

  // The receiver recovers; at the end of the cool-down one probe goes, succeeds, and the rest
  // follow: every callback is delivered, each once.
  *split.down = false;
  clock->advance(1h);
  REQUIRE(eventually([&] {
    clock->advance(100ms);  // they come due one after another
    for (int i = 0; i < 40; ++i) {
      if (queue.find("down-" + std::to_string(i))->callback.state != CallbackState::delivered)
        return false;
    }
    return true;
  }));
  CHECK(split.to_down() == 42);
  CHECK(queue.find("down-30")->callback.attempts == 1);
  for (const auto& e :
       queue.operations().callback_endpoints()) {  // idle again: listed with its counts only
    CHECK(e.state == rebound::CircuitState::closed);
    CHECK(e.in_flight == 0);
    CHECK(e.deferred == 0);
  }
  // (The listener hears the circuit close before the probe's answer is handed on, on another
  // thread: waited for, not assumed.)
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(m);
    return circuit.size() >= 2 && log.size() >= 2;
  }));
  std::lock_guard<std::mutex> lock(m);
  CHECK(circuit ==
        std::vector<std::string>{"http://down.test:80 open 2", "http://down.test:80 closed 2"});
  REQUIRE(log.size() == 2);  // one line as it opened, one as it closed
  CHECK(log[0].find(R"("event":"circuit_opened")") != std::string::npos);
  CHECK(log[0].find(R"("origin":"http://down.test:80")") != std::string::npos);
  CHECK(log[1].find(R"("event":"circuit_closed")") != std::string::npos);
}

TEST_CASE("service: a paused origin's callbacks wait in the store until it is resumed") {
  auto clock = std::make_shared<FakeClock>();
  Split split;
  rebound::JobQueueOptions so;
  so.origins.paused_retry = 10min;
  so.origins.clock = steady_of(clock);
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, nullptr, so,
            std::make_unique<rebound::EchoModel>(), split.transport());
  auto& queue = *node.service;
  CHECK(queue.operations().pause_origin("http://up.test") == "http://up.test:80");
  CHECK(queue.operations().paused_origins() == std::vector<std::string>{"http://up.test:80"});
  REQUIRE(rebound::test::submitted(queue, job("p-1", "http://up.test/hook")) == "accepted");
  REQUIRE(eventually([&] {
    auto r = queue.find("p-1");
    return r && r->status == JobStatus::succeeded && queue.telemetry().in_flight() == 0;
  }));
  CHECK(split.to_up() == 0);
  CHECK(queue.find("p-1")->callback.next_attempt_at == clock->now() + 10min);
  CHECK(queue.operations().callback_endpoints().at(0).paused);
  CHECK(queue.operations().resume_origin("http://up.test:80/anything"));
  CHECK(!queue.operations().resume_origin("http://up.test"));
  clock->advance(10min);
  REQUIRE(
      eventually([&] { return queue.find("p-1")->callback.state == CallbackState::delivered; }));
  CHECK(split.to_up() == 1);
  CHECK_THROWS_AS(queue.operations().pause_origin("mailto:x"), rebound::Error);
}

TEST_CASE("service: a callback deferred longer than callback_max_deferral becomes a dead letter") {
  auto clock = std::make_shared<FakeClock>();
  Split split;
  rebound::JobQueueOptions so;
  so.origins.breaker_failures = 1;
  so.origins.breaker_cooldown = 1h;
  so.origins.clock = steady_of(clock);
  so.callback_max_deferral = 90min;
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, nullptr, so,
            std::make_unique<rebound::EchoModel>(), split.transport());
  auto& queue = *node.service;
  REQUIRE(rebound::test::submitted(queue, job("opens", "http://down.test/hook")) == "accepted");
  REQUIRE(eventually([&] { return split.to_down() == 1; }));  // fails: the circuit opens
  REQUIRE(rebound::test::submitted(queue, job("waits", "http://down.test/hook")) == "accepted");
  REQUIRE(eventually([&] {
    auto r = queue.find("waits");
    return r->callback.state == CallbackState::pending && queue.telemetry().in_flight() == 0;
  }));
  clock->advance(1h);  // the probe (one of them) fails; the other is deferred again
  REQUIRE(eventually([&] {
    return split.to_down() == 2 && queue.telemetry().in_flight() == 0 &&
           queue.find("waits")->callback.next_attempt_at > clock->now();
  }));
  clock->advance(2h);  // past the longest deferral: a dead letter, with the reason
  REQUIRE(eventually([&] {
    auto a = queue.find("opens"), b = queue.find("waits");
    return a->callback.state == CallbackState::failed || b->callback.state == CallbackState::failed;
  }));
  const auto failed = queue.operations().failed_callbacks(10);
  REQUIRE(!failed.empty());
  CHECK(failed[0].callback.last_error.find("deferred for longer") != std::string::npos);
  CHECK(split.to_down() <= 3);
}

namespace {
// Holds every callback to a host named "slow..." unanswered until `release`; answers others 200.
std::shared_ptr<FakeTransport::Shared> holding_slow() {
  auto shared = std::make_shared<FakeTransport::Shared>();
  shared->rule = [](const rebound::CallbackRequest& r) -> std::optional<int> {
    if (r.url.find("//slow") != std::string::npos) return std::nullopt;
    return 200;
  };
  return shared;
}
}  // namespace

TEST_CASE("service: a slow receiver that never fails holds at most a quarter of the slots") {
  auto clock = std::make_shared<FakeClock>();
  auto slow = holding_slow();
  rebound::JobQueueOptions so;
  so.queue_capacity = 400;          // 100 may wait in memory for one origin
  so.origins.breaker_failures = 0;  // it never fails: no circuit opens
  so.origins.clock = steady_of(clock);
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, nullptr, so,
            std::make_unique<rebound::EchoModel>(), std::make_unique<FakeTransport>(slow));
  auto& queue = *node.service;
  int accepted = 0;
  for (int i = 0; i < 600; ++i) {
    accepted += rebound::test::submitted(
                    queue, job("slow-" + std::to_string(i), "http://slow.test/hook")) == "accepted";
  }
  // 64 in flight and 100 waiting hold slots; the rest went back to the store.
  REQUIRE(eventually([&] { return queue.telemetry().in_flight() <= 164; }));
  CHECK(accepted >= 400);
  const auto e = queue.operations().callback_endpoints().at(0);
  CHECK(e.in_flight == 64);
  CHECK(e.waiting == 100);
  CHECK(e.deferred > 0);
  // Another receiver's callbacks still find slots.
  for (int i = 0; i < 50; ++i)
    REQUIRE(rebound::test::submitted(
                queue, job("up-" + std::to_string(i), "http://up.test/hook")) == "accepted");
  REQUIRE(eventually([&] { return slow->count_to("//up") == 50; }));
  slow->release();
}

TEST_CASE("service: an origin whose circuit opens with hundreds waiting is deferred in slices") {
  // The gate sends back everything that waited for the origin at once, on the thread that heard
  // the failure: the io thread, which drives every other origin's deliveries. They are recorded
  // a slice at a time, so that the io thread's other handlers run in between.
  auto clock = std::make_shared<FakeClock>();
  auto down = holding_slow();
  rebound::JobQueueOptions so;
  so.queue_capacity = 2000;
  so.origins.max_per_origin = 1;
  so.origins.max_waiting_per_origin = 1000;
  so.origins.breaker_failures = 1;
  so.origins.breaker_cooldown = 1h;
  so.origins.clock = steady_of(clock);
  Node node(std::make_unique<rebound::MemoryJobStore>(), clock, nullptr, so,
            std::make_unique<rebound::EchoModel>(), std::make_unique<FakeTransport>(down));
  auto& queue = *node.service;
  for (int i = 0; i < 301; ++i)
    REQUIRE(rebound::test::submitted(
                queue, job("slow-" + std::to_string(i), "http://slow.test/hook")) == "accepted");
  // One held by the receiver, 300 waiting in memory behind it.
  REQUIRE(eventually([&] {
    const auto e = queue.operations().callback_endpoints();
    return e.size() == 1 && e[0].in_flight == 1 && e[0].waiting == 300;
  }));
  // (Shared with the handlers: they may outlive a failed REQUIRE here.)
  auto deferred_by_then = std::make_shared<std::promise<std::uint64_t>>();
  auto seen = deferred_by_then->get_future();
  auto io = node.io.get_executor();
  boost::asio::post(io, [&queue, io, down, deferred_by_then] {
    down->release(503);  // the circuit opens here: the 300 are sent back
    // (The sender posts each answer to the io executor: a handler posted now runs after them, and
    // one it posts after whatever they posted in turn.)
    boost::asio::post(io, [&queue, io, deferred_by_then] {
      boost::asio::post(io, [&queue, deferred_by_then] {
        deferred_by_then->set_value(queue.telemetry().metrics().callback_deferrals.load());
      });
    });
  });
  REQUIRE(seen.wait_for(10s) == std::future_status::ready);
  const std::uint64_t between = seen.get();
  CHECK(between > 0);
  CHECK(between < 300);  // a handler posted after the burst ran before its end
  REQUIRE(eventually([&] {
    return queue.telemetry().metrics().callback_deferrals.load() == 300 &&
           queue.telemetry().in_flight() == 0;
  }));
  const auto waiting = queue.find("slow-300");
  CHECK(waiting->callback.state == CallbackState::pending);
  CHECK(waiting->callback.attempts == 0);
  CHECK(waiting->callback.next_attempt_at >= clock->now() + 1h);
}

// JobQueue's C++ face: the one-line constructor, results through completion tokens (a handler,
// use_future; use_awaitable is in test_job_queue_coro.cpp), refusals as rebound::errc, every
// handler called exactly once (also when the queue goes away with work in flight), validation
// inside submit, make_store and make_model.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_future.hpp>

#include "../src/pipeline/front_door.hpp"
#include "rebound/delivery/backoff.hpp"
#include "rebound/errc.hpp"
#include "rebound/error.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/make_model.hpp"
#include "rebound/store/make_store.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#include "rebound/tenant.hpp"
#include "support/failing_store.hpp"
#include "support/fake_clock.hpp"
#include "support/fake_transport.hpp"
#include "support/forwarding_store.hpp"
#include "support/held_model.hpp"
#include "support/quiesce.hpp"
#include "support/receiver.hpp"
#include "support/submitting.hpp"
#include "support/temp_dir.hpp"
#ifdef REBOUND_TEST_REDIS
#include "support/redis_server.hpp"
#endif

using boost::system::error_code;
using rebound::errc;
using rebound::JobQueue;
using rebound::JobRecord;
using rebound::JobStatus;
using namespace std::chrono_literals;

namespace {

rebound::Job job(std::string id, nlohmann::json input = nullptr, std::string callback = {}) {
  rebound::Job j;
  j.id = std::move(id);
  j.input = std::move(input);
  j.callback_url = std::move(callback);
  return j;
}

// Accepts integers only (validate), doubles them (predict).
class Doubler final : public rebound::Model {
 public:
  std::string name() const override { return "doubler"; }
  std::optional<rebound::ErrorInfo> validate(const nlohmann::json& input) const override {
    if (input.is_number_integer()) return std::nullopt;
    return rebound::ErrorInfo{"invalid_input", "must be an integer"};
  }
  rebound::Prediction predict(const nlohmann::json& input) override {
    ++calls;
    return rebound::Prediction::success(input.get<int>() * 2);
  }
  std::atomic<int> calls{0};
};

// What one handler got, and how often it was called.
struct Outcome {
  std::mutex m;
  int calls = 0;
  error_code ec;
  JobRecord record;
  std::thread::id thread;
};

auto recorder(const std::shared_ptr<Outcome>& out) {
  return [out](error_code ec, JobRecord record) {
    std::lock_guard<std::mutex> lock(out->m);
    ++out->calls;
    out->ec = ec;
    out->record = std::move(record);
    out->thread = std::this_thread::get_id();
  };
}

int calls_of(const std::shared_ptr<Outcome>& out) {
  std::lock_guard<std::mutex> lock(out->m);
  return out->calls;
}

}  // namespace

TEST_CASE("job queue: one line builds it - use_future gives the job's final record") {
  JobQueue queue(std::make_unique<Doubler>());
  const JobRecord done = queue.async_submit(job("a", 21), boost::asio::use_future).get();
  CHECK(done.job.id == "a");
  CHECK(done.status == JobStatus::succeeded);
  CHECK(done.outcome.result == 42);
  // The record as stored: the request, and when it started and finished.
  CHECK(done.job.input == 21);
  CHECK(done.started_at != std::chrono::system_clock::time_point{});
  CHECK(done.outcome.finished_at >= done.started_at);
  // It is final in the store when the future is ready.
  const auto stored = queue.find("a");
  REQUIRE(stored);
  CHECK(stored->status == JobStatus::succeeded);
  CHECK(stored->outcome.result == 42);
}

TEST_CASE("job queue: submit_many answers each job as submit would - with one store write") {
  rebound::test::TempDir dir;
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.queue_capacity = 4;
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model), std::make_unique<rebound::SqliteJobStore>(dir.file("j.db")),
                 options);
  REQUIRE(rebound::test::submitted(queue, job("old", 1)) == "accepted");
  using rebound::test::outcomes_of;
  using V = std::vector<std::string>;
  CHECK(outcomes_of(queue.submit_many({job("a", 1), job("old", 1), job("old", 2), job("b", 2)})) ==
        V{"accepted", "duplicate", "id_conflict", "accepted"});
  CHECK(queue.telemetry().in_flight() == 3);
  // Capacity 4: one more fits; the others are refused.
  CHECK(outcomes_of(queue.submit_many({job("c", 3), job("d", 4), job("e", 5)})) ==
        V{"accepted", "queue_full", "queue_full"});
  CHECK(queue.telemetry().in_flight() == 4);
  CHECK_FALSE(queue.find("d"));
  // Full: an id twice in one call is still told a duplicate (or a conflict) of the first.
  CHECK(outcomes_of(queue.submit_many({job("c", 3), job("c", 3), job("c", 4)})) ==
        V{"duplicate", "duplicate", "id_conflict"});
  // A first job in conflict with the stored one says nothing of the others under its id: the
  // stored request among them is a duplicate, as it would be alone.
  CHECK(outcomes_of(
            queue.submit_many({job("c", 5), job("c", 3), job("c", 5), job("c", 6), job("c", 3)})) ==
        V{"id_conflict", "duplicate", "id_conflict", "id_conflict", "duplicate"});
  held->open();
  for (const char* id : {"a", "b", "c"})
    CHECK(queue.async_wait(id, boost::asio::use_future).get().status == JobStatus::succeeded);
  CHECK(queue.find("b")->outcome.result == nlohmann::json{{"echo", 2}});
}

namespace {
// One worker on a held model, over a store whose reads the test can hold (FailingStore's gate).
struct SlowReads {
  std::shared_ptr<rebound::test::FailingStore::Switch> gate =
      std::make_shared<rebound::test::FailingStore::Switch>();
  rebound::test::HeldModel* held = nullptr;
  JobQueue queue;
  explicit SlowReads(rebound::JobQueueOptions options = one_worker())
      : queue(model(), std::make_unique<rebound::test::FailingStore>(gate), options) {}
  // (A test that failed with a job held, or its reads closed, must not hold the queue's end.)
  ~SlowReads() {
    held->open();
    gate->reads.open();
  }

 private:
  std::unique_ptr<rebound::Model> model() {
    auto m = std::make_unique<rebound::test::HeldModel>();
    held = m.get();
    return m;
  }
  static rebound::JobQueueOptions one_worker() {
    rebound::JobQueueOptions options;
    options.workers = 1;
    return options;
  }
};
}  // namespace

TEST_CASE("job queue: a wait for a job this queue finished is read back off the io thread") {
  SlowReads slow;
  auto& gate = slow.gate;
  auto* held = slow.held;
  JobQueue& queue = slow.queue;
  REQUIRE(rebound::test::submitted(queue, job("j", 1)) == "accepted");
  REQUIRE(rebound::test::submitted(queue, job("k", 2)) == "accepted");
  auto waited = queue.async_wait("j", boost::asio::use_future);
  // The store's reads are slow (a read behind a commit, a round trip to Redis): the finished job
  // is read back for its waiter on the pump's thread. The thread that heard the store acknowledge
  // the job (the worker here, the io executor with a store that answers from its own thread)
  // goes on meanwhile: the worker runs the next job, the io executor runs what is posted to it.
  gate->reads.close();
  held->open();
  REQUIRE(rebound::test::eventually([&] { return gate->reads.waiting() >= 1; }));
  CHECK(rebound::test::eventually([&] { return held->order().size() == 2; }));
  std::promise<void> ran;
  boost::asio::post(queue.get_executor(), [&] { ran.set_value(); });
  CHECK(ran.get_future().wait_for(5s) == std::future_status::ready);
  CHECK(waited.wait_for(0s) == std::future_status::timeout);
  gate->reads.open();
  const auto record = waited.get();
  CHECK(record.status == JobStatus::succeeded);
  CHECK(record.outcome.result == nlohmann::json{{"echo", 1}});
  CHECK(record.job.input == 1);  // as the store keeps it
}

TEST_CASE("job queue: a wait is answered with the record the acknowledgement stored - no read") {
  SlowReads slow;
  slow.gate->answer_records = true;  // the store answers the record, as the library's stores do
  JobQueue& queue = slow.queue;
  REQUIRE(rebound::test::submitted(queue, job("j", 1)) == "accepted");
  REQUIRE(rebound::test::submitted(queue, job("k", 2)) == "accepted");
  auto waited = queue.async_wait("j", boost::asio::use_future);
  // (The wait looks once as it registers, on the pump's thread: done by the end of a pass.)
  REQUIRE(rebound::test::pump_pass(queue));
  const std::size_t gets = slow.gate->gets, get_manys = slow.gate->get_manys;
  // Every read would wait: the waiter's answer must come from the acknowledgement alone.
  const auto reads_closed = slow.gate->reads.closed_while_in_scope();
  slow.held->open();
  REQUIRE(waited.wait_for(10s) == std::future_status::ready);
  const auto record = waited.get();
  CHECK(record.status == JobStatus::succeeded);
  CHECK(record.outcome.result == nlohmann::json{{"echo", 1}});
  CHECK(record.job.input == 1);  // as the store keeps it
  CHECK(slow.gate->gets == gets);
  CHECK(slow.gate->get_manys == get_manys);
  // A job nobody waits for is not asked for its record (a copy of its input and result).
  REQUIRE(rebound::test::eventually([&] { return queue.telemetry().in_flight() == 0; }));
  CHECK(slow.gate->records_asked == 1);
  slow.gate->reads.open();
  CHECK(queue.async_wait("k", boost::asio::use_future).get().status == JobStatus::succeeded);
}

TEST_CASE("job queue: async_wait on the io thread does not wait for a slow store's read") {
  // (Before the queue: its io thread may still set them when a check below fails.)
  std::promise<std::future<JobRecord>> running, unknown;
  std::promise<void> ran;
  SlowReads slow;
  auto& gate = slow.gate;
  JobQueue& queue = slow.queue;
  REQUIRE(rebound::test::submitted(queue, job("j", 1)) == "accepted");
  REQUIRE(slow.held->wait_started(1));
  // Every read waits (a Redis far away): waits started on the io thread (a coroutine's, a
  // handler's) return at once, and the io thread goes on; the pump reads each job once.
  const auto reads_closed = gate->reads.closed_while_in_scope();
  boost::asio::post(queue.get_executor(), [&] {
    running.set_value(queue.async_wait("j", boost::asio::use_future));
    unknown.set_value(queue.async_wait("nobody", boost::asio::use_future));
  });
  auto running_wait = running.get_future();
  auto unknown_wait = unknown.get_future();
  REQUIRE(running_wait.wait_for(5s) == std::future_status::ready);
  REQUIRE(unknown_wait.wait_for(5s) == std::future_status::ready);
  boost::asio::post(queue.get_executor(), [&] { ran.set_value(); });
  CHECK(ran.get_future().wait_for(5s) == std::future_status::ready);
  auto on_running = running_wait.get();
  auto on_unknown = unknown_wait.get();
  REQUIRE(rebound::test::eventually([&] { return gate->reads.waiting() >= 1; }));
  CHECK(on_unknown.wait_for(0s) == std::future_status::timeout);  // (not known until read)
  gate->reads.open();
  REQUIRE(on_unknown.wait_for(10s) == std::future_status::ready);
  try {
    on_unknown.get();
    FAIL("a wait for an unknown job was answered with a record");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::not_found);
  }
  slow.held->open();
  REQUIRE(on_running.wait_for(10s) == std::future_status::ready);
  CHECK(on_running.get().outcome.result == nlohmann::json{{"echo", 1}});
}

TEST_CASE("job queue: a full queue looks an id up off the io thread - duplicate or conflict") {
  // (Before the queue: its io thread may still set them when a check below fails.)
  using Answer = std::pair<boost::system::error_code, rebound::Submitted>;
  std::promise<Answer> again, conflict, other;
  std::promise<void> returned;
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.queue_capacity = 1;
  SlowReads slow(options);
  auto& gate = slow.gate;
  JobQueue& queue = slow.queue;
  REQUIRE(rebound::test::submitted(queue, job("j", 1)) == "accepted");
  REQUIRE(slow.held->wait_started(1));  // it holds the queue's one slot
  // Every read waits (a Redis far away): refusals for room, submitted on the io thread, return
  // at once; the pump looks their ids up, and a resubmission of the stored job is a duplicate.
  const auto reads_closed = gate->reads.closed_while_in_scope();
  auto answer_to = [](std::promise<Answer>& p) {
    return [&p](boost::system::error_code ec, const rebound::Submitted& s) {
      p.set_value({ec, s});
    };
  };
  boost::asio::post(queue.get_executor(), [&] {
    queue.submit(job("j", 1), answer_to(again));
    queue.submit(job("j", 2), answer_to(conflict));
    queue.submit(job("k", 3), answer_to(other));
    returned.set_value();
  });
  REQUIRE(returned.get_future().wait_for(5s) == std::future_status::ready);
  auto again_answer = again.get_future();
  REQUIRE(rebound::test::eventually([&] { return gate->reads.waiting() >= 1; }));
  CHECK(again_answer.wait_for(0s) == std::future_status::timeout);  // (not known until read)
  gate->reads.open();
  REQUIRE(again_answer.wait_for(10s) == std::future_status::ready);
  const Answer resubmitted = again_answer.get();
  CHECK_FALSE(resubmitted.first);
  CHECK(resubmitted.second.duplicate);
  auto conflict_answer = conflict.get_future();
  REQUIRE(conflict_answer.wait_for(10s) == std::future_status::ready);
  CHECK(conflict_answer.get().first == rebound::errc::id_conflict);
  auto other_answer = other.get_future();
  REQUIRE(other_answer.wait_for(10s) == std::future_status::ready);
  CHECK(other_answer.get().first == rebound::errc::queue_full);
  // While the store is failing, no look-up: a refusal for room is answered as it is.
  // (The first may still look, fail and answer store_unavailable: that marks it failing.)
  gate->fail();
  CHECK(rebound::test::eventually(
      [&] { return rebound::test::submitted(queue, job("j", 1)) == "queue_full"; }));
  gate->heal();
}

TEST_CASE("job queue: a wait that cannot look at its job fails alone - earlier waits go on") {
  SlowReads slow;
  JobQueue& queue = slow.queue;
  REQUIRE(rebound::test::submitted(queue, job("j", 1)) == "accepted");
  REQUIRE(slow.held->wait_started(1));  // (marked running before the store fails)
  auto first = queue.async_wait("j", boost::asio::use_future);
  REQUIRE(rebound::test::pump_pass(queue));  // its look done: it waits for the job's end
  slow.gate->fail();
  auto second = queue.async_wait("j", boost::asio::use_future);
  REQUIRE(second.wait_for(10s) == std::future_status::ready);
  try {
    second.get();
    FAIL("a wait that could not read its job was answered with a record");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::store_unavailable);
  }
  slow.gate->heal();
  CHECK(first.wait_for(0s) == std::future_status::timeout);
  slow.held->open();
  REQUIRE(first.wait_for(10s) == std::future_status::ready);
  CHECK(first.get().status == JobStatus::succeeded);
}

TEST_CASE("job queue: past max_waiting a final job is still answered - a running one is refused") {
  // The same answers whether the store's reads wait (read on the pump) or not (memory).
  for (const bool reads_wait : {false, true}) {
    CAPTURE(reads_wait);
    rebound::JobQueueOptions options;
    options.workers = 1;
    options.max_waiting = 1;
    auto model = std::make_unique<rebound::test::HeldModel>();
    auto* held = model.get();
    auto gate = std::make_shared<rebound::test::FailingStore::Switch>();
    std::unique_ptr<rebound::JobStore> store;
    if (reads_wait) {
      store = std::make_unique<rebound::test::FailingStore>(gate);
    } else {
      store = std::make_unique<rebound::MemoryJobStore>();
    }
    JobQueue queue(std::move(model), std::move(store), options);
    struct Open {
      rebound::test::HeldModel* model;
      ~Open() { model->open(); }  // (also when a check below fails)
    } open_at_end{held};
    held->open();
    REQUIRE(rebound::test::submitted(queue, job("done", 1)) == "accepted");
    REQUIRE(queue.async_wait("done", boost::asio::use_future).get().status == JobStatus::succeeded);
    held->close();
    REQUIRE(rebound::test::submitted(queue, job("running", 2)) == "accepted");
    REQUIRE(held->wait_started(2));
    auto first = queue.async_wait("running", boost::asio::use_future);  // the one place
    REQUIRE(rebound::test::pump_pass(queue));
    auto code_of = [](std::future<JobRecord> f) {
      REQUIRE(f.wait_for(10s) == std::future_status::ready);
      try {
        f.get();
      } catch (const boost::system::system_error& e) {
        return e.code();
      }
      return boost::system::error_code{};
    };
    CHECK(code_of(queue.async_wait("running", boost::asio::use_future)) ==
          rebound::errc::too_many_waiters);
    CHECK(code_of(queue.async_wait("nobody", boost::asio::use_future)) == rebound::errc::not_found);
    auto done = queue.async_wait("done", boost::asio::use_future);
    REQUIRE(done.wait_for(10s) == std::future_status::ready);
    CHECK(done.get().outcome.result == nlohmann::json{{"echo", 1}});
    held->open();
    REQUIRE(first.wait_for(10s) == std::future_status::ready);
    CHECK(first.get().status == JobStatus::succeeded);
  }
}

TEST_CASE("job queue: a wait on a SQLite store whose commits fail is answered - the queue closes") {
  rebound::test::TempDir dir;
  const std::string path = dir.file("j.db");
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.store_retry_interval = 20ms;
  rebound::SqliteJobStoreOptions store_options;
  store_options.retry_interval = 20ms;
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  {
    JobQueue queue(std::move(model), std::make_unique<rebound::SqliteJobStore>(path, store_options),
                   options);
    REQUIRE(rebound::test::submitted(queue, job("j", 1)) == "accepted");
    auto waited = queue.async_wait("j", boost::asio::use_future);
    REQUIRE(held->wait_started(1));
    std::filesystem::remove(path);  // every commit fails from here on
    // The acknowledgement asks for the record, which a commit would answer: none comes, and the
    // wait is answered with the job as this queue finished it all the same.
    held->open();
    REQUIRE(waited.wait_for(10s) == std::future_status::ready);
    const auto record = waited.get();
    CHECK(record.status == JobStatus::succeeded);
    CHECK(record.outcome.result == nlohmann::json{{"echo", 1}});
  }  // (closed with its writes still failing: nothing waits for an answer that never comes)
}

TEST_CASE("job queue: the finished jobs waited for are read back 256 a call - never one by one") {
  SlowReads slow;
  auto& gate = slow.gate;
  JobQueue& queue = slow.queue;
  constexpr int n = 600;
  std::vector<std::future<JobRecord>> waits;
  for (int i = 0; i < n; ++i) {
    const std::string id = "w" + std::to_string(i);
    REQUIRE(rebound::test::submitted(queue, job(id, i)) == "accepted");
    waits.push_back(queue.async_wait(id, boost::asio::use_future));
  }
  // (Each wait looks at its job once as it registers, on the pump: done by the end of a pass.)
  REQUIRE(rebound::test::pump_pass(queue));
  const std::size_t gets = gate->gets, get_manys = gate->get_manys;
  gate->most_ids_read = 0;
  // The reads stall (a Redis far away) while every job finishes: hundreds of finished jobs wait
  // to be read back for their waiters at once.
  gate->reads.close();
  slow.held->open();
  REQUIRE(rebound::test::eventually([&] { return queue.telemetry().in_flight() == 0; }));
  REQUIRE(rebound::test::eventually([&] { return gate->reads.waiting() >= 1; }));
  gate->reads.open();
  for (int i = 0; i < n; ++i) {
    REQUIRE(waits[i].wait_for(20s) == std::future_status::ready);
    const JobRecord r = waits[i].get();
    CHECK(r.status == JobStatus::succeeded);
    CHECK(r.job.input == i);
  }
  CHECK(gate->gets == gets);  // no read an id
  CHECK(gate->get_manys >= get_manys + 3);
  CHECK(gate->most_ids_read == 256);  // a call's reads are bounded
}

namespace {
// A queue on a counting fake store that waits for jobs another server accepted and holds: it never
// claims them, so their waits are answered by its polls of the store.
struct WaitsElsewhere {
  std::shared_ptr<rebound::test::FailingStore::Switch> gate =
      std::make_shared<rebound::test::FailingStore::Switch>();
  rebound::test::FailingStore* store = nullptr;
  JobQueue queue;
  const rebound::Lease elsewhere{"other-server/1", std::chrono::system_clock::now() + 1h};
  WaitsElsewhere() : queue(std::make_unique<rebound::EchoModel>(), owned_store(), polls()) {}

  /// Stores `id`, held by the other server, and waits for it here.
  std::future<JobRecord> wait_for(const std::string& id, nlohmann::json input) {
    REQUIRE(store->put(job(id, std::move(input)), elsewhere) == rebound::PutOutcome::created);
    return queue.async_wait(id, boost::asio::use_future);
  }

 private:
  std::unique_ptr<rebound::JobStore> owned_store() {
    auto s = std::make_unique<rebound::test::FailingStore>(gate);
    store = s.get();
    return s;
  }
  static rebound::JobQueueOptions polls() {
    rebound::JobQueueOptions options;
    options.poll_interval = 100ms;
    return options;
  }
};
}  // namespace

TEST_CASE("job queue: waits for jobs another server finishes are polled 256 a call") {
  WaitsElsewhere w;
  auto& gate = w.gate;
  // (600: a poll that read before the jobs ended completes at most 256, and a later one still
  // reads 256.)
  constexpr int n = 600;
  std::vector<std::future<JobRecord>> waits;
  for (int i = 0; i < n; ++i)
    waits.push_back(w.wait_for("e" + std::to_string(i), i));
  // (Each wait looks at its job once as it registers, on the pump: done by the end of a pass.)
  REQUIRE(rebound::test::pump_pass(w.queue));
  const std::size_t gets = gate->gets, get_manys = gate->get_manys;
  gate->most_ids_read = 0;
  for (int i = 0; i < n; ++i)
    w.store->complete("e" + std::to_string(i), {JobStatus::succeeded, i * 2, std::nullopt});
  for (int i = 0; i < n; ++i) {
    REQUIRE(waits[i].wait_for(20s) == std::future_status::ready);
    const JobRecord r = waits[i].get();
    CHECK(r.status == JobStatus::succeeded);
    CHECK(r.outcome.result == i * 2);
  }
  CHECK(gate->gets == gets);
  CHECK(gate->get_manys >= get_manys + 3);  // 600 waits: three polls at least
  CHECK(gate->most_ids_read == 256);
}

TEST_CASE("job queue: one record the store cannot read holds up only its own wait") {
  WaitsElsewhere w;
  std::vector<std::future<JobRecord>> waits;
  for (const char* id : {"a", "bad", "c"})
    waits.push_back(w.wait_for(id, 1));
  REQUIRE(rebound::test::pump_pass(w.queue));  // (their first looks done: they wait)
  w.gate->make_unreadable("bad");              // every poll's batch read now fails
  for (const char* id : {"a", "bad", "c"})
    w.store->complete(id, {JobStatus::succeeded, 2, std::nullopt});
  // The polls read them one by one then: the others' waits are answered, the unreadable one's
  // waits until it can be read.
  CHECK(waits[0].wait_for(20s) == std::future_status::ready);
  CHECK(waits[2].wait_for(20s) == std::future_status::ready);
  CHECK(waits[1].wait_for(0s) == std::future_status::timeout);
  CHECK(waits[0].get().status == JobStatus::succeeded);
  w.gate->make_unreadable("");
  CHECK(waits[1].wait_for(20s) == std::future_status::ready);
}

TEST_CASE("job queue: a drain that ends while a finished job is read back still answers its wait") {
  SlowReads slow;
  auto& gate = slow.gate;
  auto* held = slow.held;
  JobQueue& queue = slow.queue;
  REQUIRE(rebound::test::submitted(queue, job("j", 1)) == "accepted");
  auto waited = queue.async_wait("j", boost::asio::use_future);
  REQUIRE(rebound::test::pump_pass(queue));  // (the wait's first look done: it waits)
  gate->reads.close();
  held->open();
  // The job is done (its slot free), its record being read back for the wait: the drain has
  // nothing left to wait for, yet the wait is answered with the job, not "shutting down".
  REQUIRE(rebound::test::eventually([&] { return gate->reads.waiting() >= 1; }));
  REQUIRE(rebound::test::eventually([&] { return queue.telemetry().in_flight() == 0; }));
  auto drained = std::async(std::launch::async, [&] { return queue.shutdown(10s); });
  CHECK(drained.wait_for(200ms) == std::future_status::timeout);
  gate->reads.open();
  CHECK(drained.get());
  CHECK(waited.get().status == JobStatus::succeeded);
}

TEST_CASE("job queue: submit_many with one slot free takes an id sent twice once") {
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.queue_capacity = 2;
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model), nullptr, options);
  REQUIRE(rebound::test::submitted(queue, job("first", 1)) == "accepted");
  using rebound::test::outcomes_of;
  using V = std::vector<std::string>;
  CHECK(outcomes_of(queue.submit_many({job("x", 1), job("x", 1), job("x", 2), job("y", 1)})) ==
        V{"accepted", "duplicate", "id_conflict", "queue_full"});
  CHECK(queue.telemetry().in_flight() == 2);
  // A resubmitted call whose jobs are all stored takes nothing; its new job the freed slot.
  held->open();
  CHECK(queue.async_wait("x", boost::asio::use_future).get().status == JobStatus::succeeded);
  REQUIRE(rebound::test::eventually([&] { return queue.telemetry().in_flight() <= 1; }));
  CHECK(outcomes_of(queue.submit_many({job("x", 1), job("y", 1)})) == V{"duplicate", "accepted"});
}

TEST_CASE("job queue: submit_many refuses an invalid input alone - the others go on") {
  JobQueue queue(std::make_unique<Doubler>());
  using rebound::test::outcomes_of;
  using V = std::vector<std::string>;
  auto why = queue.submit_many({job("x", 1), job("y", "text"), job("z", 3)});
  CHECK(outcomes_of(why) == V{"accepted", "invalid_input", "accepted"});
  REQUIRE(why.size() == 3);
  CHECK(why[1].reason.message == "must be an integer");
  CHECK(why[1].field == "input");
  CHECK(why[0].reason.code.empty());
  CHECK(queue.async_wait("z", boost::asio::use_future).get().outcome.result == 6);
  CHECK(queue.async_wait("x", boost::asio::use_future).get().outcome.result == 2);
  CHECK_FALSE(queue.find("y"));
  // A repeated id is checked as its own submission would be: the invalid one is refused, the
  // valid one taken, whichever comes first.
  why = queue.submit_many({job("r", "text"), job("r", 4), job("s", 5), job("s", "text")});
  CHECK(outcomes_of(why) == V{"invalid_input", "accepted", "accepted", "invalid_input"});
  CHECK(why[1].reason.code.empty());
  CHECK(why[3].reason.message == "must be an integer");
  CHECK(queue.async_wait("r", boost::asio::use_future).get().outcome.result == 8);
  CHECK(queue.submit_many({}).empty());
}

TEST_CASE("job queue: a model's error message is kept to 4 KiB - whatever the model threw") {
  class Thrower final : public rebound::Model {
   public:
    std::string name() const override { return "thrower"; }
    rebound::Prediction predict(const nlohmann::json& input) override {
      if (input == "throws") throw std::runtime_error(std::string(1000000, 'w'));
      // A code far longer than any, and a message cut inside a two-byte character.
      return rebound::Prediction::failure(std::string(500, 'c'), std::string(4095, 'm') + "é!");
    }
  };
  JobQueue queue(std::make_unique<Thrower>());
  const JobRecord thrown = queue.async_submit(job("t", "throws"), boost::asio::use_future).get();
  REQUIRE(thrown.outcome.error);
  CHECK(thrown.outcome.error->code == "model_error");
  CHECK(thrown.outcome.error->message.size() == 4096);
  CHECK(thrown.outcome.error->message.rfind("the model failed: www", 0) == 0);
  const JobRecord failed = queue.async_submit(job("f", "fails"), boost::asio::use_future).get();
  REQUIRE(failed.outcome.error);
  CHECK(failed.outcome.error->code == std::string(64, 'c'));
  CHECK(failed.outcome.error->message == std::string(4095, 'm'));  // not half a character
  CHECK(queue.find("f")->outcome.error->message == std::string(4095, 'm'));
}

TEST_CASE("job queue: work in memory is bounded in bytes - as the inputs really take") {
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.max_work_bytes = 8u << 20;  // 8 MiB
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model), nullptr, options);
  // 200,000 numbers: about 3.2 MB of tree each (16 bytes a value, and the vector's spare room).
  const nlohmann::json big = nlohmann::json::parse("[" + [] {
    std::string s;
    for (int i = 0; i < 200000; ++i)
      s += i ? ",0" : "0";
    return s;
  }() + "]");
  CHECK(rebound::test::submitted(queue, job("one", big)) == "accepted");
  CHECK(rebound::test::submitted(queue, job("two", big)) == "accepted");
  // A third would pass 8 MiB: refused, as a full queue is, whatever the count of jobs.
  CHECK(rebound::test::submitted(queue, job("three", big)) == "queue_full");
  auto refused = queue.async_submit(job("three", big), boost::asio::use_future);
  CHECK_THROWS_AS(refused.get(), boost::system::system_error);
  // Small work still fits beside them.
  CHECK(rebound::test::submitted(queue, job("small", 1)) == "accepted");
  CHECK(queue.telemetry().in_flight() == 3);
  held->open();
  CHECK(queue.async_wait("two", boost::asio::use_future).get().status == JobStatus::succeeded);
  CHECK(queue.async_wait("small", boost::asio::use_future).get().status == JobStatus::succeeded);
  REQUIRE(rebound::test::quiesce(queue));  // slots go back after the record
  CHECK(rebound::test::submitted(queue, job("three", big)) == "accepted");
  CHECK(queue.async_wait("three", boost::asio::use_future).get().status == JobStatus::succeeded);
}

TEST_CASE("job queue: jobs claimed from the store take no more than the free bytes") {
  rebound::test::TempDir dir;
  const std::string path = dir.file("jobs.db");
  const nlohmann::json big = nlohmann::json::parse("[" + [] {
    std::string s;
    for (int i = 0; i < 200000; ++i)
      s += i ? ",0" : "0";
    return s;
  }() + "]");  // read back from the store: about 4.2 MB of tree (the parser's spare room)
  {
    rebound::SqliteJobStore store(path);  // accepted by a server that stopped before running them
    for (int i = 0; i < 12; ++i)
      REQUIRE(store.put(job("stored-" + std::to_string(i), big)) == rebound::PutOutcome::created);
  }
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.max_work_bytes = 11u << 20;
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model), std::make_unique<rebound::SqliteJobStore>(path), options);
  REQUIRE(held->wait_started(1));
  auto work_bytes = [&] {
    const std::string metrics = queue.telemetry().render_metrics();
    const auto at = metrics.find("\nrebound_work_bytes ");
    REQUIRE(at != std::string::npos);
    return std::stoull(metrics.substr(at + 20));
  };
  // Two fit in 11 MiB, a third would not: it stays in the store, through several polls.
  for (int i = 0; i < 3; ++i) {
    REQUIRE(rebound::test::pump_pass(queue));
    CHECK(queue.telemetry().in_flight() <= 2);
    CHECK(work_bytes() <= (11u << 20));
  }
  CHECK(queue.telemetry().in_flight() == 2);
  held->open();
  for (int i = 0; i < 12; ++i) {
    CHECK(queue.async_wait("stored-" + std::to_string(i), boost::asio::use_future).get().status ==
          JobStatus::succeeded);
  }
}

TEST_CASE("job queue: one job larger than the whole byte budget is taken when nothing else is") {
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.max_work_bytes = 1024;
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model), nullptr, options);
  const nlohmann::json big = nlohmann::json::array({1, 2, 3, "a string longer than sixteen"});
  CHECK(rebound::test::submitted(queue, job("alone", std::string(4096, 'x'))) == "accepted");
  CHECK(rebound::test::submitted(queue, job("beside", big)) == "queue_full");
  held->open();
  CHECK(queue.async_wait("alone", boost::asio::use_future).get().status == JobStatus::succeeded);
  REQUIRE(rebound::test::quiesce(queue));  // slots go back after the record
  CHECK(rebound::test::submitted(queue, job("beside", big)) == "accepted");
}

// The io thread of a queue: where its handlers run by default.
std::thread::id io_thread_of(JobQueue& queue) {
  std::promise<std::thread::id> id;
  boost::asio::post(queue.get_executor(), [&id] { id.set_value(std::this_thread::get_id()); });
  return id.get_future().get();
}

TEST_CASE(
    "job queue: /metrics counts the store's queue at most once a second - a failed count is "
    "not kept and a slow one holds off the next") {
  auto clock = std::make_shared<rebound::test::FakeClock>();
  auto control = std::make_shared<rebound::test::FailingStore::Switch>();
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.clock = rebound::test::clock_of(clock);
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model), std::make_unique<rebound::test::FailingStore>(control), options);
  struct Open {
    rebound::test::HeldModel* model;
    ~Open() { model->open(); }  // (also when a check below fails)
  } open_at_end{held};
  const auto queued = [&]() -> std::string {
    const std::string text = queue.telemetry().render_metrics();
    const std::string name = "\nrebound_queue_jobs{state=\"queued\"} ";
    const auto at = text.find(name);
    if (at == std::string::npos) return "none";
    return text.substr(at + name.size(), text.find('\n', at + 1) - at - name.size());
  };
  REQUIRE(rebound::test::submitted(queue, job("running", 1)) == "accepted");
  REQUIRE(held->wait_started(1));
  REQUIRE(rebound::test::submitted(queue, job("queued-1", 2)) == "accepted");
  CHECK(queued() == "1");
  // A job more: the store counts it (Telemetry::queue_stats, GET /v1/stats), /metrics shows the
  // count of less than a second ago.
  REQUIRE(rebound::test::submitted(queue, job("queued-2", 3)) == "accepted");
  REQUIRE(queue.telemetry().queue_stats()->queued == 2);
  CHECK(queued() == "1");
  clock->advance(999ms);
  CHECK(queued() == "1");
  clock->advance(1ms);
  CHECK(queued() == "2");
  // A store that fails: the gauges are left out, and the failure is not kept: the next scrape,
  // in the same second, counts again.
  clock->advance(1s);
  control->fail();
  CHECK(queued() == "none");
  control->heal();
  CHECK(queued() == "2");
  // A clock stepped back counts again (the last count is not taken as a second newer).
  REQUIRE(rebound::test::submitted(queue, job("queued-3", 4)) == "accepted");
  clock->advance(-5s);
  CHECK(queued() == "3");
  // A scrape whose count is held at the store, and another meanwhile: what the other shows at
  // once (it neither waits for that count nor counts too), then what the first one counted.
  const auto scraped_while_counting = [&]() -> std::pair<std::string, std::string> {
    std::future<std::string> counting, meanwhile;  // (waited for after the gate opens)
    std::string shown;
    {
      auto held_count = control->counts.closed_while_in_scope();
      counting = std::async(std::launch::async, queued);
      REQUIRE(rebound::test::eventually([&] { return control->counts.waiting() == 1; }));
      meanwhile = std::async(std::launch::async, queued);
      REQUIRE(meanwhile.wait_for(10s) == std::future_status::ready);
      shown = meanwhile.get();
      CHECK(control->counts.waiting() == 1);
    }
    return {shown, counting.get()};
  };
  // While a slow store counts, the last count is shown.
  REQUIRE(rebound::test::submitted(queue, job("queued-4", 5)) == "accepted");
  clock->advance(1s);
  CHECK(scraped_while_counting() == std::pair<std::string, std::string>{"3", "4"});
  CHECK(queued() == "4");
  // A count of 10 s ago is not shown meanwhile (a store that hangs in the count does not freeze
  // the gauges): the gauges are left out.
  clock->advance(10s);
  CHECK(scraped_while_counting() == std::pair<std::string, std::string>{"none", "4"});
  // A count that takes long (a long backlog in a shared database) is kept 20 times as long as it
  // took, at most a minute: what a scrape counted while the clock moved on by `took`.
  const auto count_taking = [&](std::chrono::milliseconds took) {
    std::future<std::string> counting;
    {
      auto held_count = control->counts.closed_while_in_scope();
      counting = std::async(std::launch::async, queued);
      REQUIRE(rebound::test::eventually([&] { return control->counts.waiting() == 1; }));
      clock->advance(took);
    }
    return counting.get();
  };
  clock->advance(1s);
  CHECK(count_taking(200ms) == "4");
  REQUIRE(rebound::test::submitted(queue, job("queued-5", 6)) == "accepted");
  clock->advance(3799ms);  // (3,999 ms after the count began)
  CHECK(queued() == "4");
  clock->advance(1ms);
  CHECK(queued() == "5");
  // That count took no time: a second again.
  REQUIRE(rebound::test::submitted(queue, job("queued-6", 7)) == "accepted");
  clock->advance(1s);
  CHECK(queued() == "6");
  // A count of 10 s: kept a minute, not 200 s.
  clock->advance(1s);
  CHECK(count_taking(10s) == "6");
  REQUIRE(rebound::test::submitted(queue, job("queued-7", 8)) == "accepted");
  clock->advance(49s);
  CHECK(queued() == "6");
  // While another scrape counts, a count kept a minute is shown for two (not 10 s).
  clock->advance(1s);
  CHECK(scraped_while_counting() == std::pair<std::string, std::string>{"6", "7"});
  clock->advance(1s);
  CHECK(count_taking(10s) == "7");
  clock->advance(110s);  // (120 s after that count began)
  CHECK(scraped_while_counting() == std::pair<std::string, std::string>{"none", "7"});
  // A count that fails after 50 ms is tried again at once, as one that fails at once.
  REQUIRE(rebound::test::submitted(queue, job("queued-8", 9)) == "accepted");
  clock->advance(1s);
  control->fail();
  CHECK(count_taking(50ms) == "none");
  control->heal();
  CHECK(queued() == "8");
  // One that fails after 200 ms (a statement timeout) holds off the next count for 4 s, the
  // gauges left out meanwhile.
  REQUIRE(rebound::test::submitted(queue, job("queued-9", 10)) == "accepted");
  clock->advance(1s);
  control->fail();
  CHECK(count_taking(200ms) == "none");
  control->heal();
  CHECK(queued() == "none");
  clock->advance(3799ms);  // (3,999 ms after the count began)
  CHECK(queued() == "none");
  clock->advance(1ms);
  CHECK(queued() == "9");
}

TEST_CASE("job queue: recent_queue_stats is the count /metrics shows - its own failure thrown") {
  auto clock = std::make_shared<rebound::test::FakeClock>();
  auto control = std::make_shared<rebound::test::FailingStore::Switch>();
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.clock = rebound::test::clock_of(clock);
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model), std::make_unique<rebound::test::FailingStore>(control), options);
  struct Open {
    rebound::test::HeldModel* model;
    ~Open() { model->open(); }  // (also when a check below fails)
  } open_at_end{held};
  const auto& telemetry = queue.telemetry();
  REQUIRE(rebound::test::submitted(queue, job("running", 1)) == "accepted");
  REQUIRE(held->wait_started(1));
  REQUIRE(rebound::test::submitted(queue, job("queued-1", 2)) == "accepted");
  REQUIRE(telemetry.recent_queue_stats()->queued == 1);
  REQUIRE(rebound::test::submitted(queue, job("queued-2", 3)) == "accepted");
  // The scrape shows the count made by the call above, and the call the scrape's.
  CHECK(telemetry.render_metrics().find("\nrebound_queue_jobs{state=\"queued\"} 1\n") !=
        std::string::npos);
  CHECK(telemetry.recent_queue_stats()->queued == 1);
  CHECK(telemetry.queue_stats()->queued == 2);  // (counts at each call)
  clock->advance(1s);
  CHECK(telemetry.render_metrics().find("\nrebound_queue_jobs{state=\"queued\"} 2\n") !=
        std::string::npos);
  CHECK(telemetry.recent_queue_stats()->queued == 2);
  // A failing store: the call that counts throws, and the next one counts again.
  clock->advance(1s);
  control->fail();
  CHECK_THROWS_AS(telemetry.recent_queue_stats(), rebound::StoreUnavailable);
  control->heal();
  CHECK(telemetry.recent_queue_stats()->queued == 2);
  // A count that fails after 200 ms (a statement timeout): meanwhile the others get the last
  // count; then no count, and no throw, until 4 s after it began.
  clock->advance(1s);
  control->fail();
  {
    std::future<std::optional<rebound::QueueStats>> counting;
    {
      auto held_count = control->counts.closed_while_in_scope();
      counting = std::async(std::launch::async, [&] { return telemetry.recent_queue_stats(); });
      REQUIRE(rebound::test::eventually([&] { return control->counts.waiting() == 1; }));
      CHECK(telemetry.recent_queue_stats()->queued == 2);
      clock->advance(200ms);
    }
    CHECK_THROWS_AS(counting.get(), rebound::StoreUnavailable);
  }
  control->heal();
  CHECK_FALSE(telemetry.recent_queue_stats());
  clock->advance(3799ms);
  CHECK_FALSE(telemetry.recent_queue_stats());
  clock->advance(1ms);
  CHECK(telemetry.recent_queue_stats()->queued == 2);
}

TEST_CASE("job queue: a plain handler runs once on the queue's executor by default") {
  JobQueue queue(std::make_unique<Doubler>());
  auto out = std::make_shared<Outcome>();
  const std::thread::id io_thread = io_thread_of(queue);
  queue.async_submit(job("h", 2), recorder(out));
  REQUIRE(rebound::test::eventually([&] { return calls_of(out) == 1; }));
  REQUIRE(rebound::test::quiesce(queue));  // a second call would have come by now
  std::lock_guard<std::mutex> lock(out->m);
  CHECK(out->calls == 1);
  CHECK_FALSE(out->ec);
  CHECK(out->record.outcome.result == 4);
  CHECK(out->thread == io_thread);
}

TEST_CASE("job queue: a handler bound to another executor runs there") {
  JobQueue queue(std::make_unique<Doubler>());
  boost::asio::io_context mine;
  auto out = std::make_shared<Outcome>();
  queue.async_submit(job("b", 1), boost::asio::bind_executor(mine, recorder(out)));
  // The handler's executor is kept busy (a work guard) until the handler ran there: run()
  // returns only after it.
  mine.run_for(10s);
  CHECK(calls_of(out) == 1);
  CHECK(out->thread == std::this_thread::get_id());
  CHECK(out->record.outcome.result == 2);
}

TEST_CASE("job queue: refusals are rebound::errc codes with messages") {
  JobQueue queue(std::make_unique<Doubler>());
  SUBCASE("invalid input: validate runs inside async_submit and submit - nothing is stored") {
    auto f = queue.async_submit(job("bad", "text"), boost::asio::use_future);
    try {
      f.get();
      FAIL("an invalid input was accepted");
    } catch (const boost::system::system_error& e) {
      CHECK(e.code() == errc::invalid_input);
      CHECK(std::string(e.code().category().name()) == "rebound");
      CHECK(e.code().message() == "the model refused the input");
    }
    rebound::Submitted why;
    CHECK(rebound::test::submitted(queue, job("bad2", "text"), &why) == "invalid_input");
    CHECK(why.reason.code == "invalid_input");
    CHECK(why.reason.message == "must be an integer");
    CHECK(why.field == "input");
    CHECK_FALSE(queue.find("bad"));
    CHECK_FALSE(queue.find("bad2"));
  }
  SUBCASE("a different request under a taken id: id_conflict") {
    REQUIRE(queue.async_submit(job("same", 1), boost::asio::use_future).get().outcome.result == 2);
    auto out = std::make_shared<Outcome>();
    queue.async_submit(job("same", 5), recorder(out));
    REQUIRE(rebound::test::eventually([&] { return calls_of(out) == 1; }));
    CHECK(out->ec == errc::id_conflict);
    CHECK(out->record.job.id.empty());
  }
  SUBCASE("a callback URL without a transport: no_transport (never accepted and dropped)") {
    boost::asio::thread_pool pool(1);
    boost::asio::io_context io;
    JobQueue bare(pool.get_executor(), io.get_executor(), std::make_unique<Doubler>(), nullptr,
                  nullptr);
    CHECK_FALSE(bare.operations().delivers_callbacks());
    CHECK(rebound::test::submitted(bare, job("cb", 1, "https://example.com/hook")) ==
          "no_transport");
    CHECK_FALSE(bare.find("cb"));
    // Nor does it take a dead letter it could not send.
    CHECK(bare.redeliver("cb") == errc::no_transport);
  }
  SUBCASE("async_wait for an unknown id: not_found") {
    auto f = queue.async_wait("nobody", boost::asio::use_future);
    CHECK_THROWS_AS(f.get(), boost::system::system_error);
  }
}

TEST_CASE(
    "job queue: the same request again completes with the first job's record - it runs once") {
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model));
  auto first = std::make_shared<Outcome>();
  auto second = std::make_shared<Outcome>();
  queue.async_submit(job("dup", 7), recorder(first));
  REQUIRE(held->wait_started(1));
  queue.async_submit(job("dup", 7), recorder(second));  // while the first one runs
  held->open();
  REQUIRE(rebound::test::eventually([&] { return calls_of(first) == 1 && calls_of(second) == 1; }));
  CHECK_FALSE(second->ec);
  CHECK(second->record.status == JobStatus::succeeded);
  CHECK(second->record.outcome.result == first->record.outcome.result);
  // And once it is final, at once.
  const JobRecord again = queue.async_submit(job("dup", 7), boost::asio::use_future).get();
  CHECK(again.status == JobStatus::succeeded);
  CHECK(queue.telemetry().batch_stats().items == 1);
}

TEST_CASE("job queue: 4 threads submit 500 jobs each - every handler fires exactly once") {
  rebound::JobQueueOptions o;
  o.workers = 2;
  o.queue_capacity = 4 * 500;
  auto model = std::make_unique<Doubler>();
  auto* doubler = model.get();
  JobQueue queue(std::move(model), nullptr, o);
  constexpr int threads = 4, each = 500;
  std::vector<std::atomic<int>> calls(threads * each);
  std::atomic<int> wrong{0};
  std::atomic<int> done{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < threads; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = 0; i < each; ++i) {
        const int n = t * each + i;
        queue.async_submit(job("j" + std::to_string(n), n), [&, n](error_code ec, JobRecord r) {
          if (ec || r.outcome.result != 2 * n) ++wrong;
          ++calls[n];
          ++done;
        });
      }
    });
  }
  for (auto& s : submitters)
    s.join();
  REQUIRE(rebound::test::eventually([&] { return done == threads * each; }));
  REQUIRE(rebound::test::quiesce(queue));  // any second call would have landed by now
  int once = 0;
  for (auto& c : calls)
    once += c == 1 ? 1 : 0;
  CHECK(once == threads * each);
  CHECK(wrong == 0);
  CHECK(doubler->calls == threads * each);
}

TEST_CASE("job queue: destroyed with work in flight - every handler fires - nothing hangs") {
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  std::vector<std::shared_ptr<Outcome>> outs;
  std::future<rebound::Prediction> invocation;
  std::future<JobRecord> waited;
  boost::asio::io_context elsewhere;  // a handler on an executor of the caller's
  auto bound = std::make_shared<Outcome>();
  {
    rebound::JobQueueOptions o;
    o.workers = 1;
    o.drain_on_destroy = 0ms;
    JobQueue queue(std::move(model), nullptr, o);
    for (int i = 0; i < 20; ++i) {
      outs.push_back(std::make_shared<Outcome>());
      queue.async_submit(job("f" + std::to_string(i), i), recorder(outs.back()));
    }
    REQUIRE(held->wait_started(1));
    invocation = queue.async_invoke(5, boost::asio::use_future);
    waited = queue.async_wait("f10", boost::asio::use_future);
    queue.async_submit(job("bound", 1), boost::asio::bind_executor(elsewhere, recorder(bound)));
    // The running job must end for the destructor to return: it does once the destructor has
    // set the queued work aside (the invocation answered), or after 3 s at the latest.
    std::thread opener([held, &invocation] {
      invocation.wait_for(3s);
      held->open();
    });
    opener.detach();
  }  // the destructor returns: nothing hangs
  int succeeded = 0, stopped = 0;
  for (auto& out : outs) {
    CHECK(calls_of(out) == 1);
    if (!out->ec) ++succeeded;
    if (out->ec == errc::shutting_down) ++stopped;
  }
  CHECK(succeeded + stopped == 20);
  CHECK(stopped >= 1);
  try {
    invocation.get();
    FAIL("an invocation taken off the queue answered");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == errc::shutting_down);
  }
  CHECK_THROWS_AS(waited.get(), boost::system::system_error);
  elsewhere.run_for(5s);
  CHECK(calls_of(bound) == 1);
  CHECK(bound->ec == errc::shutting_down);
}

TEST_CASE("job queue: shutdown completes waits that cannot end here - new ones are refused") {
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  rebound::JobQueueOptions o;
  o.workers = 1;
  JobQueue queue(std::move(model), nullptr, o);
  auto running = std::make_shared<Outcome>();
  auto queued = std::make_shared<Outcome>();
  queue.async_submit(job("running", 1), recorder(running));
  REQUIRE(held->wait_started(1));
  queue.async_submit(job("queued", 2), recorder(queued));
  CHECK_FALSE(queue.shutdown(100ms));  // the deadline passes with both in flight
  REQUIRE(rebound::test::eventually([&] { return calls_of(queued) == 1; }));
  CHECK(queued->ec == errc::shutting_down);
  held->open();
  auto late = queue.async_submit(job("late", 3), boost::asio::use_future);
  try {
    late.get();
    FAIL("a submission after shutdown was accepted");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == errc::shutting_down);
  }
  REQUIRE(rebound::test::eventually([&] { return calls_of(running) == 1; }));
}

TEST_CASE(
    "job queue: abandon_running stops a model that polls its flag - the job runs at the next "
    "start") {
  rebound::test::TempDir dir;
  rebound::JobQueueOptions o;
  o.workers = 1;
  const auto started = std::chrono::steady_clock::now();
  {
    JobQueue queue(rebound::make_builtin_model("sleep:60"),
                   std::make_unique<rebound::SqliteJobStore>(dir.file("j.db")), o);
    REQUIRE(rebound::test::submitted(queue, job("long", 1)) == "accepted");
    REQUIRE(rebound::test::eventually([&] {
      const auto record = queue.find("long");
      return record && record->status == JobStatus::running;
    }));
    CHECK_FALSE(queue.shutdown(50ms));  // the model call is still running
    queue.abandon_running();
  }  // (the queue's threads end with the model call)
  // The built-in sleep model polls the flag: the call ended long before its 60 s.
  CHECK(std::chrono::steady_clock::now() - started < 30s);
  // Its job was left unfinished, its lease ended: the next start runs it at once.
  JobQueue again(std::make_unique<Doubler>(),
                 std::make_unique<rebound::SqliteJobStore>(dir.file("j.db")), o);
  const auto done = again.async_wait("long", boost::asio::use_future);
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  const JobRecord record = again.find("long").value();
  CHECK(record.status == JobStatus::succeeded);
  CHECK(record.outcome.result == 2);
}

TEST_CASE(
    "job queue: a model call past the inference timeout is told to stop - the worker is free "
    "again") {
  rebound::JobQueueOptions o;
  o.workers = 1;
  o.inference_timeout = 100ms;
  JobQueue queue(rebound::make_builtin_model("sleep:60"), nullptr, o);
  auto first = queue.async_submit(job("first", 1), boost::asio::use_future);
  REQUIRE(first.wait_for(10s) == std::future_status::ready);
  CHECK(first.get().outcome.error->code == "inference_timeout");
  // The one worker is not held for the rest of the first call's 60 s: the sleep model polls its
  // flag, raised at the timeout, so the second job runs (and times out) in turn.
  auto second = queue.async_submit(job("second", 2), boost::asio::use_future);
  REQUIRE(second.wait_for(10s) == std::future_status::ready);
  CHECK(second.get().outcome.error->code == "inference_timeout");
}

TEST_CASE("job queue: async_wait completes when the job ends - also when it was cancelled") {
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  rebound::JobQueueOptions o;
  o.workers = 1;
  JobQueue queue(std::move(model), nullptr, o);
  REQUIRE(rebound::test::submitted(queue, job("first", 1)) == "accepted");
  REQUIRE(held->wait_started(1));
  REQUIRE(rebound::test::submitted(queue, job("second", 2)) == "accepted");
  auto first = queue.async_wait("first", boost::asio::use_future);
  auto second = queue.async_wait("second", boost::asio::use_future);
  CHECK_FALSE(queue.cancel("second"));
  REQUIRE(second.wait_for(10s) == std::future_status::ready);
  CHECK(second.get().status == JobStatus::cancelled);
  CHECK(first.wait_for(0s) == std::future_status::timeout);  // held by the model until opened
  held->open();
  REQUIRE(first.wait_for(10s) == std::future_status::ready);
  CHECK(first.get().status == JobStatus::succeeded);
  // A job final already: at once.
  CHECK(queue.async_wait("first", boost::asio::use_future).get().status == JobStatus::succeeded);
}

TEST_CASE("job queue: async_invoke answers through the same queue - invalid input is refused") {
  JobQueue queue(std::make_unique<Doubler>());
  const rebound::Prediction p = queue.async_invoke(8, boost::asio::use_future).get();
  REQUIRE(p.ok());
  CHECK(p.output() == 16);
  std::promise<error_code> refused;
  queue.async_invoke("eight", [&](error_code ec, rebound::Prediction q) {
    refused.set_value(ec);
    CHECK_FALSE(q.ok());
  });
  CHECK(refused.get_future().get() == errc::invalid_input);
  CHECK_FALSE(queue.find(""));  // nothing stored
}

// What a submission's handler answered: each answer, and the thread it came on.
struct Answers {
  std::mutex m;
  std::condition_variable answered;
  std::vector<rebound::Submitted> answers;
  std::vector<std::thread::id> threads;
  void take(const rebound::Submitted& s) {
    std::lock_guard<std::mutex> lock(m);
    answers.push_back(s);
    threads.push_back(std::this_thread::get_id());
    answered.notify_all();
  }
  // For JobQueue::submit.
  auto handler() {
    return [this](boost::system::error_code ec, rebound::Submitted s) {
      CHECK(ec == s.error);
      take(s);
    };
  }
  bool wait_for(std::size_t n) {
    std::unique_lock<std::mutex> lock(m);
    return answered.wait_for(lock, std::chrono::seconds(10), [&] { return answers.size() >= n; });
  }
  std::vector<std::string> outcomes() {
    std::lock_guard<std::mutex> lock(m);
    return rebound::test::outcomes_of(answers);
  }
};

TEST_CASE("job queue: submit completes once the store holds the job - on the handler's executor") {
  using V = std::vector<std::string>;
  const auto caller = std::this_thread::get_id();
  for (const bool sqlite : {false, true}) {
    CAPTURE(sqlite);
    rebound::test::TempDir dir;
    JobQueue queue(std::make_unique<Doubler>(),
                   sqlite ? rebound::make_store("sqlite:" + dir.file("j.db")) : nullptr);
    const auto io = io_thread_of(queue);
    Answers s;
    queue.submit(job("a", 21), s.handler());
    queue.submit(job("a", 21), s.handler());  // the same request again
    queue.submit(job("bad", "x"), s.handler());
    queue.submit(job("a/b/c", 1), s.handler());  // breaks the id rule
    REQUIRE(s.wait_for(4));
    {
      std::lock_guard<std::mutex> lock(s.m);
      // Never inline, always on the io executor (the handler names none), refusals included.
      for (const auto thread : s.threads) {
        CHECK(thread != caller);
        CHECK(thread == io);
      }
    }
    // Refusals come at once; the puts after the store answered (SQLite: its commit), in order.
    V outcomes = s.outcomes();
    std::sort(outcomes.begin(), outcomes.end());
    CHECK(outcomes == V{"accepted", "duplicate", "invalid_input", "invalid_job"});
    CHECK(queue.async_wait("a", boost::asio::use_future).get().outcome.result == 42);
    // Fire and forget: nobody is told; the job runs all the same.
    queue.submit(job("d", 4), boost::asio::detached);
    CHECK(queue.async_wait("d", boost::asio::use_future).get().outcome.result == 8);
    // With a future: the Submitted, or the refusal thrown.
    CHECK_FALSE(queue.submit(job("a", 21), boost::asio::use_future).get().error);
    CHECK_THROWS_AS(queue.submit(job("a", 22), boost::asio::use_future).get(),
                    boost::system::system_error);
    CHECK(queue.shutdown(std::chrono::seconds(5)));
    queue.submit(job("c", 2), s.handler());
    REQUIRE(s.wait_for(5));
    CHECK(s.outcomes().back() == "shutting_down");
  }
}

TEST_CASE("job queue: the front door answers a submission without a hop - inline when it can") {
  const auto caller = std::this_thread::get_id();
  auto answer = [](Answers& s) {
    return [&s](const rebound::Submitted& verdict) { s.take(verdict); };
  };
  SUBCASE("memory: before submit returns, on this thread") {
    JobQueue queue(std::make_unique<Doubler>());
    Answers s;
    rebound::detail::FrontDoor::submit(queue, job("b", 2), answer(s));
    std::lock_guard<std::mutex> lock(s.m);
    REQUIRE(s.answers.size() == 1);
    CHECK(rebound::test::outcome_of(s.answers[0]) == "accepted");
    CHECK(s.threads[0] == caller);
  }
  SUBCASE("SQLite: refusals at once; the put from the io thread after the commit") {
    rebound::test::TempDir dir;
    JobQueue queue(std::make_unique<Doubler>(), rebound::make_store("sqlite:" + dir.file("j.db")));
    const auto io = io_thread_of(queue);
    Answers s;
    rebound::detail::FrontDoor::submit(queue, job("bad", "x"), answer(s));
    {
      std::lock_guard<std::mutex> lock(s.m);
      REQUIRE(s.answers.size() == 1);
      CHECK(s.threads[0] == caller);
    }
    rebound::detail::FrontDoor::submit(queue, job("a", 21), answer(s));
    REQUIRE(s.wait_for(2));
    std::lock_guard<std::mutex> lock(s.m);
    CHECK(rebound::test::outcome_of(s.answers[1]) == "accepted");
    CHECK(s.threads[1] == io);
  }
}

TEST_CASE("job queue: submit guards every rule a job has over HTTP - invalid_job names the field") {
  rebound::JobQueueOptions options;  // private addresses refused, as rebound-server's default
  options.allow_private_callbacks = false;
  JobQueue queue(std::make_unique<Doubler>(), nullptr, options);
  struct Case {
    rebound::Job job;
    std::string field;
  };
  auto with = [](auto change) {
    rebound::Job j = job("ok", 1);
    change(j);
    return j;
  };
  const std::vector<Case> broken = {
      {job("", 1), "id"},
      {job("has space", 1), "id"},
      {job("..", 1), "id"},
      {job(std::string(129, 'x'), 1), "id"},
      {job("/x", 1), "id"},
      {job("acme/42", 1), "id"},  // never a tenant's job by its id: the tenant is a field
      {job("a/b/c", 1), "id"},
      {with([](rebound::Job& j) { j.tenant = "has space"; }), "tenant"},
      {with([](rebound::Job& j) { j.tenant = "a/b"; }), "tenant"},
      {with([](rebound::Job& j) { j.tenant = std::string(65, 't'); }), "tenant"},
      {job("x", 1, "ftp://hooks.example.com/x"), "callback_url"},
      {job("x", 1, "https://user@hooks.example.com/x"), "callback_url"},
      {job("x", 1, "http://127.0.0.1:9/x"), "callback_url"},  // the SSRF literal check
      {job("x", 1, "http://[::1]/x"), "callback_url"},
      {with([](rebound::Job& j) { j.priority = -1; }), "priority"},
      {with([](rebound::Job& j) { j.priority = 10; }), "priority"},
      {with([](rebound::Job& j) { j.max_queue = std::chrono::milliseconds(-1); }),
       "max_queue_seconds"},
      {with([](rebound::Job& j) { j.max_queue = std::chrono::hours(24 * 8); }),
       "max_queue_seconds"},
      {with([](rebound::Job& j) { j.webhook_events = 0; }), "webhook_events"},
      {with([](rebound::Job& j) { j.webhook_events = 4; }), "webhook_events"},
      {with([](rebound::Job& j) { j.traceparent = "00-not-a-trace"; }), "traceparent"},
  };
  for (const Case& c : broken) {
    CAPTURE(c.job.id);
    CAPTURE(c.field);
    rebound::Submitted why;
    CHECK(rebound::test::submitted(queue, c.job, &why) == "invalid_job");
    CHECK(why.field == c.field);
    CHECK(why.reason.code == "invalid_field");
    CHECK(why.reason.message.find("'" + c.field + "'") != std::string::npos);
    // async_submit and submit_many refuse it alike.
    auto f = queue.async_submit(c.job, boost::asio::use_future);
    CHECK_THROWS_AS(f.get(), boost::system::system_error);
    const auto many = queue.submit_many({c.job});
    REQUIRE(many.size() == 1);
    CHECK(many[0].error == errc::invalid_job);
    CHECK(many[0].field == c.field);
  }
  CHECK(queue.telemetry().in_flight() == 0);
  // The edges of each rule are inside it.
  CHECK(rebound::test::submitted(queue, with([](rebound::Job& j) {
                                   j.id = "A.b_c:d-9";
                                   j.tenant = "tenant-1";
                                   j.priority = 0;
                                   j.max_queue = std::chrono::hours(24 * 7);
                                   j.webhook_events =
                                       rebound::webhook_started | rebound::webhook_completed;
                                 })) == "accepted");
  CHECK(rebound::test::submitted(queue, job(std::string(128, 'x'), 1)) == "accepted");
  CHECK(rebound::test::submitted(
            queue, with([](rebound::Job& j) { j.tenant = std::string(64, 't'); })) == "accepted");
}

TEST_CASE("job queue: the tenant is a field - two tenants' jobs with one id are each their own") {
  for (const bool on_sqlite : {false, true}) {
    CAPTURE(on_sqlite);
    rebound::test::TempDir dir;
    JobQueue queue(std::make_unique<Doubler>(),
                   on_sqlite ? rebound::make_store("sqlite:" + dir.file("jobs.db")) : nullptr);
    rebound::Job acme = job("42", 1);
    acme.tenant = "acme";
    rebound::Job globex = job("42", 10);
    globex.tenant = "globex";
    const JobRecord a = queue.async_submit(acme, boost::asio::use_future).get();
    const JobRecord g = queue.async_submit(globex, boost::asio::use_future).get();
    CHECK(a.job.id == "42");
    CHECK(a.job.tenant == "acme");
    CHECK(a.outcome.result == 2);
    CHECK(g.job.tenant == "globex");
    CHECK(g.outcome.result == 20);
    // Each is found by its id and tenant, never by a string that joins them.
    CHECK(queue.find({"42", "acme"})->outcome.result == 2);
    CHECK(queue.find({"42", "globex"})->job.tenant == "globex");
    CHECK_FALSE(queue.find("42").has_value());
    CHECK_FALSE(queue.find("acme/42").has_value());
    CHECK(queue.async_wait(rebound::JobRef("42", "globex"), boost::asio::use_future)
              .get()
              .outcome.result == 20);
    // The same request again is a duplicate of its own tenant's job only.
    rebound::Submitted again;
    CHECK(rebound::test::submitted(queue, acme, &again) == "duplicate");
    rebound::Job other = acme;
    other.input = 3;
    CHECK(rebound::test::submitted(queue, other) == "id_conflict");
    other.tenant = "initech";
    CHECK(rebound::test::submitted(queue, other) == "accepted");
    CHECK(queue.cancel({"42", "acme"}) == errc::already_final);
    CHECK(queue.cancel({"43", "acme"}) == errc::not_found);
  }
}

TEST_CASE("job queue: a SQLite store from make_store keeps results across queues") {
  rebound::test::TempDir dir;
  const std::string uri = "sqlite:" + dir.file("jobs.db");
  {
    JobQueue queue(std::make_unique<Doubler>(), rebound::make_store(uri));
    CHECK(queue.async_submit(job("kept", 4), boost::asio::use_future).get().outcome.result == 8);
  }
  JobQueue again(std::make_unique<Doubler>(), rebound::make_store(uri));
  CHECK(again.async_wait("kept", boost::asio::use_future).get().outcome.result == 8);
}

TEST_CASE("job queue: what a store holds at start is resumed and counted - not 256 of it") {
  auto store = std::make_unique<rebound::MemoryJobStore>();
  for (int i = 0; i < 600; ++i) {
    rebound::Job j = job("left-" + std::to_string(i), i);
    j.created_at = std::chrono::system_clock::now();
    REQUIRE(store->put(j) == rebound::PutOutcome::created);
  }
  rebound::JobQueueOptions o;
  o.queue_capacity = 1000;
  JobQueue queue(std::make_unique<Doubler>(), std::move(store), o);
  CHECK(queue.telemetry().batch_stats().resumed == 600);  // when the constructor returns
  CHECK(queue.async_wait("left-599", boost::asio::use_future).get().outcome.result == 1198);
}

TEST_CASE("make_store and make_model: what they make - clear errors for the rest") {
  CHECK(dynamic_cast<rebound::MemoryJobStore*>(rebound::make_store("memory").get()));
  CHECK(rebound::make_model("echo")->name() == "echo");
  CHECK(rebound::make_model("sleep:0.01")->name() == "sleep");
  auto message = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const rebound::Error& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(message([] { rebound::make_store("mysql://db"); }).find("unsupported store") !=
        std::string::npos);
  // A PostgreSQL store is made only by a program linked with rebound::postgres, and says why not.
  CHECK(message([] { rebound::make_store("postgresql://127.0.0.1:1/db"); }) != "no error");
  CHECK(message([] { rebound::make_store("sqlite:"); }).find("needs a path") != std::string::npos);
  CHECK(message([] { rebound::make_store("sqlite:/nonexistent/dir/x.db"); }) != "no error");
  CHECK(message([] { rebound::make_model("sleep:-1"); }).find("sleep needs seconds") !=
        std::string::npos);
  CHECK(message([] { rebound::make_model(""); }).find("empty") != std::string::npos);
#ifndef REBOUND_HAS_TORCH
  CHECK(message([] { rebound::make_model("/opt/ml/model"); }).find("TorchScript") !=
        std::string::npos);
#endif
}

#ifdef REBOUND_TEST_REDIS
TEST_CASE("job queue: async_wait for a job another server on Redis finishes") {
  rebound::test::RedisServer redis;
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  rebound::JobQueueOptions o;
  o.workers = 1;
  o.poll_interval = 100ms;
  JobQueue runs(std::move(model), rebound::make_store(redis.uri()), o);
  // The same model on both (servers that share a store serve one model: docs/models.md).
  auto same = std::make_unique<rebound::test::HeldModel>();
  same->open();
  JobQueue waits(std::move(same), rebound::make_store(redis.uri()), o);
  REQUIRE(rebound::test::submitted(runs, job("elsewhere", 3)) == "accepted");
  REQUIRE(held->wait_started(1));
  auto done = waits.async_wait("elsewhere", boost::asio::use_future);
  REQUIRE(rebound::test::pump_pass(waits));  // a poll of the store has seen it running
  CHECK(done.wait_for(0s) == std::future_status::timeout);
  held->open();
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  const JobRecord record = done.get();
  CHECK(record.status == JobStatus::succeeded);
  CHECK(record.outcome.result == nlohmann::json{{"echo", 3}});  // the other server ran it
  // A resubmission to the other server completes with the same record, not a second run.
  CHECK(waits.async_submit(job("elsewhere", 3), boost::asio::use_future).get().outcome.result ==
        nlohmann::json{{"echo", 3}});
}
#endif

namespace {
// Hears the order in which jobs complete.
struct CompletionOrder final : rebound::Observer {
  std::mutex m;
  std::vector<std::string> ids;
  void on_completed(const JobRecord& record, std::size_t, double) override {
    std::lock_guard<std::mutex> lock(m);
    ids.push_back(rebound::key_of(record.job));
  }
};

rebound::Job tenant_job(std::string tenant, std::string id, nlohmann::json input) {
  rebound::Job j = job(std::move(id), std::move(input));
  j.tenant = std::move(tenant);
  return j;
}
}  // namespace

TEST_CASE("job queue: a tenant's flood delays another tenant's job by one of its own per turn") {
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  auto order = std::make_shared<CompletionOrder>();
  rebound::JobQueueOptions o;
  o.workers = 1;
  o.observers = {order};
  JobQueue queue(std::move(model), nullptr, o);
  REQUIRE(rebound::test::submitted(queue, tenant_job("acme", "first", 0)) == "accepted");
  REQUIRE(held->wait_started(1));  // the one worker is busy
  for (int i = 0; i < 2000; ++i) {
    REQUIRE(rebound::test::submitted(queue, tenant_job("acme", std::to_string(i), i)) ==
            "accepted");
  }
  for (int i = 0; i < 5; ++i) {
    REQUIRE(rebound::test::submitted(queue, tenant_job("globex", std::to_string(i), i)) ==
            "accepted");
  }
  held->open();
  REQUIRE(rebound::test::eventually([&] {
    std::lock_guard<std::mutex> lock(order->m);
    return order->ids.size() == 2006;
  }));
  std::lock_guard<std::mutex> lock(order->m);
  for (int i = 0; i < 5; ++i) {
    const auto at = std::find(order->ids.begin(), order->ids.end(),
                              rebound::job_key("globex", std::to_string(i))) -
                    order->ids.begin();
    CAPTURE(i);
    CHECK(at <= 2 + 2 * i);  // after "first", one of acme's before each of globex's
  }
}

TEST_CASE("job queue: quiesce is false while a job is held - true once all has run out") {
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  JobQueue queue(std::move(model));
  auto out = std::make_shared<Outcome>();
  queue.async_submit(job("held", 1), recorder(out));
  REQUIRE(held->wait_started(1));
  CHECK_FALSE(rebound::test::quiesce(queue, std::chrono::milliseconds(200)));
  CHECK(rebound::test::pump_pass(queue));  // the pump goes on meanwhile
  held->open();
  REQUIRE(rebound::test::quiesce(queue));
  // Quiet means the handler has run too: nothing is left to arrive.
  CHECK(calls_of(out) == 1);
  CHECK(queue.telemetry().in_flight() == 0);
}

TEST_CASE("job queue: a model that fails with the code shutting_down is the model's failure") {
  // The queue's own refusal and a model's failure are told apart by the error code, not by the
  // Prediction's code: a model may name its failures as it likes.
  class Stopping final : public rebound::Model {
   public:
    std::string name() const override { return "stopping"; }
    rebound::Prediction predict(const nlohmann::json&) override {
      return rebound::Prediction::failure("shutting_down", "the model's own words");
    }
  };
  JobQueue queue(std::make_unique<Stopping>());
  std::promise<std::pair<error_code, rebound::Prediction>> answer;
  queue.async_invoke(1, [&](error_code ec, rebound::Prediction p) {
    answer.set_value({ec, std::move(p)});
  });
  auto [ec, prediction] = answer.get_future().get();
  CHECK_FALSE(ec);
  REQUIRE_FALSE(prediction.ok());
  CHECK(prediction.error().code == "shutting_down");
  CHECK(prediction.error().message == "the model's own words");
  // A job fails with it, as with any model failure.
  const rebound::JobRecord r = queue.async_submit(job("stops", 1), boost::asio::use_future).get();
  CHECK(r.status == JobStatus::failed);
  CHECK(r.outcome.error->code == "shutting_down");
  // The queue's own refusal after shutdown is errc::shutting_down.
  CHECK(queue.shutdown(std::chrono::seconds(5)));
  CHECK_THROWS_AS(queue.async_invoke(1, boost::asio::use_future).get(),
                  boost::system::system_error);
}

namespace {
// A queue whose pump polls once an hour (and whose renewals, a third of a 3 h lease, never wake
// it either): only a retry's own time sends it on time. Retries 200 ms apart, 3 tries.
rebound::JobQueueOptions polled_hourly(std::shared_ptr<rebound::test::FakeTransport::Shared> sent) {
  rebound::JobQueueOptions options;
  options.poll_interval = std::chrono::hours(1);
  options.lease = std::chrono::hours(3);
  options.delivery.backoff =
      rebound::backoff::max_tries(rebound::backoff::constant(std::chrono::milliseconds(200)), 3);
  options.transport = [sent](boost::asio::any_io_executor, const rebound::AddressGuard&) {
    return std::make_unique<rebound::test::FakeTransport>(sent);
  };
  return options;
}
}  // namespace

TEST_CASE("job queue: a retry due before the pump's next poll goes out on time - not at the poll") {
  // The pump sleeps towards its next poll (an hour here); a retry scheduled sooner must move that
  // deadline, not wait for it.
  auto sent = std::make_shared<rebound::test::FakeTransport::Shared>();
  sent->script_statuses({503});  // the first attempt fails; the retry is due 200 ms later
  JobQueue queue(std::make_unique<Doubler>(), nullptr, polled_hourly(sent));
  REQUIRE(rebound::test::submitted(queue, job("retried", 1, "https://hooks.example.com/x")) ==
          "accepted");
  REQUIRE(rebound::test::eventually(
      [&] { return queue.find("retried")->callback.state == rebound::CallbackState::delivered; },
      std::chrono::seconds(20)));
  CHECK(sent->count() == 2);
}

TEST_CASE("job queue: a retry due after another's goes out on time - not at the poll after") {
  // Two retries, the second due a little after the first: the pass that sends the first must
  // not leave the second to the next poll (an hour here).
  auto sent = std::make_shared<rebound::test::FakeTransport::Shared>();
  sent->script_statuses({503, 503});  // each job's first attempt fails
  JobQueue queue(std::make_unique<Doubler>(), nullptr, polled_hourly(sent));
  REQUIRE(rebound::test::submitted(queue, job("first", 1, "https://hooks.example.com/x")) ==
          "accepted");
  // The second fails after the first did: its retry is due after the first's.
  REQUIRE(rebound::test::eventually([&] { return sent->count() >= 1; }));
  REQUIRE(rebound::test::submitted(queue, job("second", 2, "https://hooks.example.com/x")) ==
          "accepted");
  for (const char* id : {"first", "second"}) {
    CAPTURE(id);
    CHECK(rebound::test::eventually(
        [&] { return queue.find(id)->callback.state == rebound::CallbackState::delivered; },
        std::chrono::seconds(20)));
  }
  CHECK(sent->count() == 4);
}

namespace {
// Counts the pump's passes: each claims callbacks once.
struct PassCountingStore : rebound::test::ForwardingStore {
  using ForwardingStore::ForwardingStore;
  std::vector<JobRecord> claim_callbacks(std::size_t max, const rebound::Lease& lease,
                                         TimePoint now) override {
    ++passes;
    return ForwardingStore::claim_callbacks(max, lease, now);
  }
  std::atomic<int> passes{0};
};
}  // namespace

TEST_CASE("job queue: after a burst of retries the pump passes once a poll - not once a retry") {
  // 30 retries due at 30 different times take about 30 passes. Once they are sent, those times are
  // spent: the pump passes once a poll interval again (a pump that kept its own poll times with
  // the retries' went on with 30 passes a poll interval, for as long as it ran).
  auto sent = std::make_shared<rebound::test::FakeTransport::Shared>();
  {
    auto seen = std::make_shared<std::set<std::string>>();  // called outside sent->m, one thread
    auto seen_mutex = std::make_shared<std::mutex>();
    sent->rule = [seen, seen_mutex](const rebound::CallbackRequest& r) -> std::optional<int> {
      std::lock_guard<std::mutex> lock(*seen_mutex);
      return seen->insert(r.url).second ? 503 : 200;  // each job's first attempt fails
    };
  }
  auto owned = std::make_unique<PassCountingStore>(std::make_shared<rebound::MemoryJobStore>());
  PassCountingStore& store = *owned;
  rebound::JobQueueOptions options;
  options.poll_interval = 100ms;
  options.delivery.backoff =
      rebound::backoff::max_tries(rebound::backoff::constant(std::chrono::milliseconds(150)), 3);
  options.transport = [sent](boost::asio::any_io_executor, const rebound::AddressGuard&) {
    return std::make_unique<rebound::test::FakeTransport>(sent);
  };
  JobQueue queue(std::make_unique<Doubler>(), std::move(owned), options);
  constexpr int jobs = 30;
  for (int i = 0; i < jobs; ++i) {
    // (A receiver each, so that no origin's breaker opens; 7 ms apart, so the retries are too.)
    REQUIRE(rebound::test::submitted(
                queue, job("burst-" + std::to_string(i), i,
                           "https://hooks" + std::to_string(i) + ".example.com/x")) == "accepted");
    std::this_thread::sleep_for(7ms);
  }
  REQUIRE(rebound::test::eventually([&] { return sent->count() == 2 * jobs; }, 20s));
  std::this_thread::sleep_for(300ms);  // (the last retries' passes end)
  const int before = store.passes;
  const auto from = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1s);
  const int passes = store.passes - before;
  const auto polls = (std::chrono::steady_clock::now() - from) / 100ms;  // (a late wake-up)
  // About one a 100 ms poll; a pump whose spent times come back makes about 300 a second.
  CHECK(passes >= 1);
  CHECK(passes <= 2 * polls + 5);
  CHECK(sent->count() == 2 * jobs);
}

namespace {
// A shared store's wake-ups (FleetStore::watch_work), fired by the test: the memory store under
// it plays the store another server writes to. Counts the claims of jobs.
struct WakingStore : rebound::test::ForwardingStore {
  using ForwardingStore::ForwardingStore;
  std::uint64_t watch_work(std::function<void()> woken) override {
    std::lock_guard<std::mutex> lock(mutex);
    watcher = std::move(woken);
    return 1;
  }
  void unwatch_work(std::uint64_t) override {
    std::lock_guard<std::mutex> lock(mutex);
    watcher = nullptr;
  }
  std::vector<JobRecord> claim_jobs(std::size_t max, const rebound::Lease& lease,
                                    TimePoint now) override {
    ++claims;
    return ForwardingStore::claim_jobs(max, lease, now);
  }
  void wake() {
    std::lock_guard<std::mutex> lock(mutex);
    if (watcher) watcher();
  }
  std::mutex mutex;
  std::function<void()> watcher;
  std::atomic<int> claims{0};
};

// Waits up to 10 s for `id` in `store` to succeed.
bool succeeds(const rebound::JobStore& store, const std::string& id) {
  return rebound::test::eventually(
      [&] {
        const auto record = store.get(id);
        return record && record->status == JobStatus::succeeded;
      },
      10s);
}
}  // namespace

TEST_CASE(
    "job queue: a store's wake-up claims at once - but not again after a hand-back for room "
    "until that room frees") {
  auto inner = std::make_shared<rebound::MemoryJobStore>();
  auto owned = std::make_unique<WakingStore>(inner);
  WakingStore& store = *owned;
  auto held = std::make_shared<rebound::test::Held>();
  held->open();
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.max_work_bytes = 64 << 10;
  options.poll_interval = 60s;  // (what a wake-up does not claim waits a minute)
  JobQueue queue(std::make_unique<rebound::test::HeldModel>(held), std::move(owned), options);
  struct Open {  // (a check that fails with the model held must not hold the queue's end)
    rebound::test::Held& held;
    ~Open() { held.open(); }
  } open_at_end{*held};
  // Another server left a job for anyone: the wake-up claims it now.
  REQUIRE(inner->put(job("left", 1)) == rebound::PutOutcome::created);
  store.wake();
  CHECK(succeeds(*inner, "left"));
  // Its worker busy, the queue claims a job left that is too large for the work bytes it has
  // left and hands it back; the wake-ups that follow (each server that hands it back wakes the
  // others) claim nothing until room frees here.
  held->close();
  REQUIRE(rebound::test::submitted(queue, job("busy", 2)) == "accepted");
  REQUIRE(held->wait_started(2));
  REQUIRE(inner->put(job("next", std::string(100 << 10, 'x'))) == rebound::PutOutcome::created);
  const int before = store.claims;
  store.wake();
  rebound::test::eventually([&] { return store.claims > before; }, 2s);
  std::this_thread::sleep_for(100ms);  // (the pass hands it back)
  const int handed_back = store.claims;
  REQUIRE(handed_back > before);
  for (int i = 0; i < 5; ++i) {
    store.wake();
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(200ms);
  CHECK(store.claims.load() == handed_back);
  // The room it wanted, once the job ahead of it is done, claims it at once: not at the next
  // poll, a minute away here. Wake-ups count again after.
  held->open();
  REQUIRE(succeeds(*inner, "busy"));
  CHECK(succeeds(*inner, "next"));
  REQUIRE(inner->put(job("later", 4)) == rebound::PutOutcome::created);
  store.wake();
  CHECK(succeeds(*inner, "later"));
}

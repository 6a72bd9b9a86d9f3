// Model::ready and Model::warm_up as a JobQueue honours them: a model warmed up once before it
// takes work, and no job run on a model that cannot run it yet (a submission refused not_ready,
// a job left in the store waiting there).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <boost/asio/use_future.hpp>

#include "rebound/job_queue.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "support/fake_transport.hpp"
#include "support/log_lines.hpp"
#include "support/quiesce.hpp"
#include "support/receiver.hpp"

using namespace std::chrono_literals;
using rebound::JobStatus;

namespace {

// What a model saw, shared with the test (the queue owns the model).
struct Seen {
  std::atomic<bool> loaded{false};       // what ready() says
  std::atomic<int> warm_ups{0};          // warm_up calls begun
  std::atomic<bool> warm{false};         // a warm_up returned (or threw)
  std::atomic<int> predictions{0};       // predict calls
  std::atomic<int> cold_predictions{0};  // predict calls before it was loaded and warm
  std::atomic<bool> throw_in_warm_up{false};
  // A warm_up waits until released (when `hold` is set).
  std::mutex m;
  std::condition_variable cv;
  bool hold = false;
  std::thread::id warm_up_thread;  // under m
  void release() {
    std::lock_guard<std::mutex> lock(m);
    hold = false;
    cv.notify_all();
  }
  std::thread::id thread_of_warm_up() {
    std::lock_guard<std::mutex> lock(m);
    return warm_up_thread;
  }
};

// Releases a held warm-up however the test ends (the queue's destructor waits for it).
struct Released {
  std::shared_ptr<Seen> seen;
  ~Released() { seen->release(); }
};

class WarmedModel final : public rebound::Model {
 public:
  explicit WarmedModel(std::shared_ptr<Seen> seen) : seen_(std::move(seen)) {}
  std::string name() const override { return "warmed"; }
  bool ready() const override { return seen_->loaded; }
  void warm_up() override {
    std::unique_lock<std::mutex> lock(seen_->m);
    seen_->warm_up_thread = std::this_thread::get_id();
    ++seen_->warm_ups;
    seen_->cv.wait(lock, [&] { return !seen_->hold; });
    seen_->warm = true;
    if (seen_->throw_in_warm_up) throw std::runtime_error("no GPU memory for the warm-up batch");
  }
  rebound::Prediction predict(const nlohmann::json& input) override {
    ++seen_->predictions;
    if (!seen_->loaded || !seen_->warm) ++seen_->cold_predictions;
    return rebound::Prediction::success(input);
  }

 private:
  std::shared_ptr<Seen> seen_;
};

rebound::Job job(const std::string& id) {
  return rebound::make_job(id, nlohmann::json{{"x", id}});
}

}  // namespace

TEST_CASE("a model ready at the start is warmed up once - by the constructor - before any job") {
  auto seen = std::make_shared<Seen>();
  seen->loaded = true;
  rebound::JobQueue queue(std::make_unique<WarmedModel>(seen));
  CHECK(seen->warm_ups == 1);
  CHECK(seen->warm);
  CHECK(seen->thread_of_warm_up() == std::this_thread::get_id());
  CHECK(queue.ready());
  const rebound::JobRecord done = queue.async_submit(job("a"), boost::asio::use_future).get();
  CHECK(done.status == JobStatus::succeeded);
  CHECK(seen->warm_ups == 1);  // not again for a job
  CHECK(seen->cold_predictions == 0);
}

TEST_CASE(
    "a model that loads in the background is warmed up on a thread of its own - the queue ready "
    "only after it") {
  auto seen = std::make_shared<Seen>();
  seen->hold = true;
  const Released released{seen};
  rebound::JobQueue queue(std::make_unique<WarmedModel>(seen));
  CHECK_FALSE(queue.ready());
  CHECK_FALSE(queue.telemetry().model_ready());
  CHECK(queue.submit_many({job("early")}).front().error == rebound::errc::not_ready);
  CHECK(seen->warm_ups == 0);  // not before the model says it is ready
  seen->loaded = true;
  // The first look that finds the model ready starts its warm-up, elsewhere; until it returns
  // the queue is not ready and refuses submissions as a loading model does.
  CHECK_FALSE(queue.ready());
  REQUIRE(rebound::test::eventually([&] { return seen->warm_ups == 1; }));
  CHECK(seen->thread_of_warm_up() != std::this_thread::get_id());
  CHECK_FALSE(queue.ready());
  CHECK_FALSE(queue.telemetry().model_ready());  // GET /v1/models: "loading"
  CHECK(queue.submit_many({job("warming")}).front().error == rebound::errc::not_ready);
  seen->release();
  REQUIRE(rebound::test::eventually([&] { return queue.ready(); }));
  CHECK(queue.telemetry().model_ready());
  const rebound::JobRecord done = queue.async_submit(job("b"), boost::asio::use_future).get();
  CHECK(done.status == JobStatus::succeeded);
  CHECK(seen->warm_ups == 1);
  CHECK(seen->cold_predictions == 0);
}

TEST_CASE(
    "while the model loads and warms up - a job left in the store waits there - a callback owed "
    "goes out") {
  // A restart on a durable store (here a memory store handed over with what an earlier run left
  // in it): the queue claims no job for a model still loading or warming up, and delivers the
  // callbacks it owes meanwhile (they need no model); once the model is warm the job runs.
  auto seen = std::make_shared<Seen>();
  seen->hold = true;
  const Released released{seen};
  auto store = std::make_unique<rebound::MemoryJobStore>();
  rebound::Job left = job("left");
  left.created_at = std::chrono::system_clock::now();
  REQUIRE(store->put(left) == rebound::PutOutcome::created);
  rebound::Job owed = rebound::make_job("owed", 1, "https://hooks.example.com/x");
  owed.created_at = left.created_at;
  REQUIRE(store->put(owed) == rebound::PutOutcome::created);
  store->complete("owed", {JobStatus::succeeded, 1, std::nullopt});
  store->update_callback("owed", {rebound::CallbackState::pending, 0, {}});  // due now
  auto sent = std::make_shared<rebound::test::FakeTransport::Shared>();
  rebound::JobQueueOptions options;
  options.poll_interval = 20ms;
  options.transport = [sent](boost::asio::any_io_executor, const rebound::AddressGuard&) {
    return std::make_unique<rebound::test::FakeTransport>(sent);
  };
  rebound::JobQueue queue(std::make_unique<WarmedModel>(seen), std::move(store), options);
  REQUIRE(rebound::test::eventually([&] {
    return queue.find(rebound::JobRef{"owed"})->callback.state == rebound::CallbackState::delivered;
  }));
  CHECK(sent->count() == 1);
  REQUIRE(rebound::test::pump_pass(queue));
  CHECK(queue.find(rebound::JobRef{"left"})->status == JobStatus::queued);
  CHECK(seen->predictions == 0);
  // Ready, and warming up (held): still no claim of the job, pass after pass.
  seen->loaded = true;
  REQUIRE(rebound::test::eventually([&] { return seen->warm_ups == 1; }));
  REQUIRE(rebound::test::pump_pass(queue));
  REQUIRE(rebound::test::pump_pass(queue));
  CHECK(queue.find(rebound::JobRef{"left"})->status == JobStatus::queued);
  CHECK(seen->predictions == 0);
  seen->release();
  REQUIRE(rebound::test::eventually(
      [&] { return queue.find(rebound::JobRef{"left"})->status == JobStatus::succeeded; }));
  CHECK(seen->warm_ups == 1);
  CHECK(seen->cold_predictions == 0);
}

TEST_CASE("a warm-up that throws is logged - and the model serves all the same") {
  auto seen = std::make_shared<Seen>();
  seen->loaded = true;
  seen->throw_in_warm_up = true;
  rebound::test::LogLines lines;
  rebound::JobQueueOptions options;
  options.logger = lines.logger();
  rebound::JobQueue queue(std::make_unique<WarmedModel>(seen), nullptr, options);
  const auto logged = lines.of("model_warm_up_failed");
  REQUIRE(logged.size() == 1);
  CHECK(logged.front()["error"] == "no GPU memory for the warm-up batch");
  CHECK(queue.ready());
  const rebound::JobRecord done = queue.async_submit(job("c"), boost::asio::use_future).get();
  CHECK(done.status == JobStatus::succeeded);
}

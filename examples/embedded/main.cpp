// rebound without HTTP: a model of your own in a JobQueue that owns its threads, and results back
// in C++ through a future and (C++20) a coroutine. Usage: rebound-embedded
#include <algorithm>
#include <future>
#include <iostream>
#include <string>
#include <utility>  // before Boost 1.74's awaitable.hpp, which needs std::exchange
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <rebound/rebound.hpp>

struct Doubler final : rebound::Model {
  std::string name() const override { return "doubler"; }
  rebound::Prediction predict(const nlohmann::json& x) override {
    if (!x.is_number_integer()) return rebound::Prediction::failure("invalid_input", "not an int");
    return rebound::Prediction::success(x.get<int>() * 2);
  }
};

// A second version of the same model (ModelRepository, below): it triples.
struct Tripler final : rebound::Model {
  std::string name() const override { return "tripler"; }
  rebound::Prediction predict(const nlohmann::json& x) override {
    if (!x.is_number_integer()) return rebound::Prediction::failure("invalid_input", "not an int");
    return rebound::Prediction::success(x.get<int>() * 3);
  }
};

#if defined(BOOST_ASIO_HAS_CO_AWAIT)
// make_job, not a braced rebound::Job{...}: GCC 12 miscompiles a braced aggregate temporary
// inside co_await (it frees a bad pointer).
boost::asio::awaitable<int> doubled(rebound::JobQueue& queue, int x) {
  auto done =
      co_await queue.async_submit(rebound::make_job("job-2", x), boost::asio::use_awaitable);
  co_return done.outcome.result.get<int>();
}
#endif

int main() {
  rebound::JobQueue queue(std::make_unique<Doubler>());  // memory store, threads of its own
  auto done = queue.async_submit(rebound::make_job("job-1", 21), boost::asio::use_future).get();
  std::cout << done.job.id << ": " << done.outcome.result << std::endl;  // job-1: 42
#if defined(BOOST_ASIO_HAS_CO_AWAIT)
  auto answer =
      boost::asio::co_spawn(queue.get_executor(), doubled(queue, 50), boost::asio::use_future);
  std::cout << "job-2: " << answer.get() << std::endl;  // job-2: 100
#endif
  // What an operator console reads: every job, filtered and paged, newest first.
  rebound::JobFilter succeeded;
  succeeded.status = rebound::JobStatus::succeeded;
  const rebound::JobPage page = queue.operations().list_jobs(succeeded, std::nullopt, 10);
  for (const rebound::JobRecord& job : page.jobs)
    std::cout << "listed: " << job.job.id << std::endl;  // listed: job-2, listed: job-1
  // Many jobs at once: one write to the store for them all (a SQLite transaction, a Redis batch),
  // one status each, as submit would answer it.
  std::vector<rebound::Job> many;
  for (int i = 3; i <= 5; ++i)
    many.push_back(rebound::make_job("job-" + std::to_string(i), i));
  const std::vector<rebound::Submitted> statuses = queue.submit_many(std::move(many));
  const bool all_in = std::all_of(statuses.begin(), statuses.end(),
                                  [](const rebound::Submitted& s) { return s && !s.duplicate; });
  const auto five = queue.async_wait("job-5", boost::asio::use_future).get();
  std::cout << "job-5: " << five.outcome.result << std::endl;  // job-5: 10
  // Without waiting for the end: told once the store holds the job (a durable store's commit
  // holds no thread meanwhile); its end is for async_wait, or its callback. (With
  // boost::asio::detached nobody is told.) A refusal throws from get().
  const rebound::Submitted six_in =
      queue.submit(rebound::make_job("job-6", 3), boost::asio::use_future).get();
  const auto six = queue.async_wait("job-6", boost::asio::use_future).get();
  std::cout << "job-6: " << six.outcome.result << std::endl;  // job-6: 6
  // A job that breaks a rule is refused as rebound-server refuses it over HTTP, and a handler
  // reads which field and why (an id holds no space):
  //   job 7: the job breaks a rule of submission (id)
  std::promise<bool> seven;
  queue.submit(rebound::make_job("job 7", 7),
               [&seven](boost::system::error_code ec, const rebound::Submitted& s) {
                 std::cout << "job 7: " << ec.message() << " (" << s.field << ")" << std::endl;
                 seven.set_value(ec == rebound::errc::invalid_job && s.field == "id");
               });
  const bool seven_refused = seven.get_future().get();
  // Every job names the model and version it ran on (its callback too); a job may ask for them.
  // The queue serves its one model as version "1" of Model::name():
  //   job-8 ran on doubler/1; resnet: no model of that name
  rebound::Job eight = rebound::make_job("job-8", 4);
  eight.model.name = "doubler";
  const auto ran = queue.async_submit(std::move(eight), boost::asio::use_future).get();
  std::cout << "job-8 ran on " << ran.job.model.name << "/" << ran.job.model.version;
  rebound::Job nine = rebound::make_job("job-9", 4);
  nine.model.name = "resnet";
  std::promise<boost::system::error_code> nine_in;
  queue.submit(std::move(nine), [&nine_in](boost::system::error_code ec,
                                           const rebound::Submitted&) { nine_in.set_value(ec); });
  const boost::system::error_code nine_refused = nine_in.get_future().get();
  std::cout << "; resnet: " << nine_refused.message() << std::endl;
  const bool models_said = ran.job.model == rebound::ModelRef{"doubler", "1"} &&
                           nine_refused == rebound::errc::model_not_found;
  // Several models, or several versions of one (ModelRepository): a job runs on the version
  // chosen when it was accepted, a model's highest version is its default, and a job may pin one.
  //   versions: doubler/1 -> 20, doubler/2 -> 30
  rebound::ModelRepository models;
  models.add(std::make_unique<Doubler>(), "1").add("doubler", "2", std::make_unique<Tripler>());
  rebound::JobQueue versions(std::move(models));
  rebound::Job pinned = rebound::make_job("p", 10);
  pinned.model = rebound::ModelRef{"doubler", "1"};
  const auto on_one = versions.async_submit(std::move(pinned), boost::asio::use_future).get();
  const auto on_default =
      versions.async_submit(rebound::make_job("q", 10), boost::asio::use_future).get();
  std::cout << "versions: doubler/" << on_one.job.model.version << " -> " << on_one.outcome.result
            << ", doubler/" << on_default.job.model.version << " -> " << on_default.outcome.result
            << std::endl;
  const bool versions_ran = on_one.outcome.result == 20 && on_default.outcome.result == 30;
  return done.outcome.result == 42 && !page.jobs.empty() && all_in && five.outcome.result == 10 &&
                 six_in && !six_in.duplicate && six.outcome.result == 6 && seven_refused &&
                 models_said && versions_ran
             ? 0
             : 1;
}

// A JobQueue serving several models, each in versions (ModelRepository): every job runs on the
// version chosen when it was accepted, batches never mix versions, and a repository directory
// (make_model_repository) is read without ever leaving it.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <boost/system/system_error.hpp>

#include "rebound/errc.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/make_model.hpp"
#include "rebound/model_repository.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "support/forwarding_store.hpp"

using namespace std::chrono_literals;
using rebound::JobStatus;
using rebound::ModelRef;
namespace fs = std::filesystem;

namespace {

// What every version saw: each input it ran, by the version's label ("iris/2").
struct Ledger {
  std::mutex m;
  std::vector<std::pair<std::string, std::string>> runs;  // (version, input's "for")
  std::set<std::size_t> batch_sizes;
};

// Answers {"by": "<name>/<version>"} and notes each input it ran in the ledger.
class Labelled final : public rebound::Model {
 public:
  Labelled(std::string name, std::string label, std::shared_ptr<Ledger> ledger,
           std::size_t bytes = 0)
      : name_(std::move(name)),
        label_(std::move(label)),
        ledger_(std::move(ledger)),
        bytes_(bytes) {}
  std::string name() const override { return name_; }
  std::size_t memory_bytes() const override { return bytes_; }
  rebound::BatchingPreference batching() const override { return {16, 20ms}; }
  rebound::Prediction predict(const nlohmann::json& input) override {
    note(input, 1);
    return rebound::Prediction::success({{"by", label_}});
  }
  std::vector<rebound::Prediction> predict_batch(
      const std::vector<nlohmann::json>& inputs) override {
    std::vector<rebound::Prediction> out;
    for (const auto& input : inputs) {
      note(input, inputs.size());
      out.push_back(rebound::Prediction::success({{"by", label_}}));
    }
    return out;
  }

 private:
  void note(const nlohmann::json& input, std::size_t batch) {
    std::lock_guard<std::mutex> lock(ledger_->m);
    ledger_->runs.emplace_back(label_, input.value("for", ""));
    ledger_->batch_sizes.insert(batch);
  }
  std::string name_, label_;
  std::shared_ptr<Ledger> ledger_;
  std::size_t bytes_;
};

rebound::ModelRepository two_models(const std::shared_ptr<Ledger>& ledger) {
  rebound::ModelRepository models;
  models.add(std::make_unique<Labelled>("echo", "echo/1", ledger))
      .add(std::make_unique<Labelled>("iris", "iris/1", ledger), "1")
      .add(std::make_unique<Labelled>("iris", "iris/2", ledger), "2")
      .set_default_model("iris");
  return models;
}

rebound::Job job_for(const std::string& id, ModelRef model) {
  rebound::Job job = rebound::make_job(id, {{"for", model.name + "/" + model.version}});
  job.model = std::move(model);
  return job;
}

// A folder of its own under the system's temporary directory, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    char pattern[] = "/tmp/rebound-repo-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& relative, const std::string& text) const {
    fs::create_directories((path / relative).parent_path());
    std::ofstream(path / relative) << text;
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rebound::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("ModelRepository: versions in numeric order - the highest is a model's default") {
  auto ledger = std::make_shared<Ledger>();
  rebound::ModelRepository models;
  models.add(std::make_unique<Labelled>("iris", "iris/9", ledger), "9")
      .add(std::make_unique<Labelled>("iris", "iris/10", ledger), "10")
      .add(std::make_unique<Labelled>("echo", "echo/1", ledger));
  CHECK(models.default_model() == "iris");  // the first added
  CHECK(models.default_version("iris") == "10");
  CHECK(models.default_version("none").empty());
  CHECK(models.size() == 3);
  const std::vector<ModelRef> listed = models.list();
  REQUIRE(listed.size() == 3);
  CHECK(listed[0] == ModelRef{"echo", "1"});
  CHECK(listed[1] == ModelRef{"iris", "9"});
  CHECK(listed[2] == ModelRef{"iris", "10"});
  CHECK(models.find({}) == models.find({"iris", "10"}));
  CHECK(models.find({"iris", ""}) == models.find({"iris", "10"}));
  CHECK(models.find({"iris", "11"}) == nullptr);
  CHECK(models.find({"nope", ""}) == nullptr);
  models.set_default_model("echo");
  CHECK(models.find({}) == models.find({"echo", "1"}));

  CHECK(error_of([&] { models.set_default_model("nope"); }).find("not in the repository") !=
        std::string::npos);
  CHECK(error_of([&] {
          models.add(std::make_unique<Labelled>("iris", "x", ledger), "9");
        }).find("added twice") != std::string::npos);
  CHECK(error_of([&] {
          models.add(std::make_unique<Labelled>("iris", "x", ledger), "09");
        }).find("is not a version") != std::string::npos);
  CHECK(error_of([&] {
          models.add(std::make_unique<Labelled>("../etc", "x", ledger));
        }).find("is not a model name") != std::string::npos);
  CHECK(error_of([&] { models.add(nullptr); }).find("a model is required") != std::string::npos);
  CHECK_THROWS_AS(rebound::JobQueue(rebound::ModelRepository()), rebound::Error);
}

TEST_CASE("a queue of several models runs each job on the version chosen when it was accepted") {
  auto ledger = std::make_shared<Ledger>();
  rebound::JobQueueOptions options;
  options.workers = 2;
  rebound::JobQueue queue(two_models(ledger), nullptr, options);
  CHECK(queue.model()->name() == "iris");      // the default model's default version
  REQUIRE(queue.models().list().size() == 2);  // echo, iris
  CHECK(queue.models().find("iris")->versions.size() == 2);

  auto run = [&](rebound::Job job) {
    return queue.async_submit(std::move(job), boost::asio::use_future).get();
  };
  const auto by_default = run(rebound::make_job("plain", {{"for", "iris/2"}}));
  CHECK(by_default.status == JobStatus::succeeded);
  CHECK(by_default.job.model == ModelRef{"iris", "2"});
  CHECK(by_default.outcome.result == nlohmann::json{{"by", "iris/2"}});

  const auto pinned = run(job_for("pinned", {"iris", "1"}));
  CHECK(pinned.job.model == ModelRef{"iris", "1"});
  CHECK(pinned.outcome.result == nlohmann::json{{"by", "iris/1"}});

  const auto other = run(job_for("other", {"echo", ""}));
  CHECK(other.job.model == ModelRef{"echo", "1"});
  CHECK(other.outcome.result == nlohmann::json{{"by", "echo/1"}});

  // Refused before anything is stored, and said why.
  try {
    run(job_for("no-model", {"resnet", ""}));
    FAIL("a model the queue does not serve was accepted");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::model_not_found);
  }
  try {
    run(job_for("no-version", {"iris", "3"}));
    FAIL("a version the queue does not serve was accepted");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::version_unavailable);
  }
  std::promise<rebound::Submitted> answered;
  queue.submit(
      job_for("no-version-2", {"iris", "3"}),
      [&](boost::system::error_code, const rebound::Submitted& s) { answered.set_value(s); });
  const rebound::Submitted refused = answered.get_future().get();
  CHECK(refused.error == rebound::errc::version_unavailable);
  CHECK(refused.field == "version");
  CHECK(refused.reason.message.find("ready: '1', '2'") != std::string::npos);
  CHECK_FALSE(queue.find({"no-version-2"}));

  // Invocations choose the same way.
  const auto invoked =
      queue.async_invoke(ModelRef{"iris", "1"}, {{"for", "iris/1"}}, boost::asio::use_future).get();
  CHECK(invoked.output() == nlohmann::json{{"by", "iris/1"}});
  CHECK(queue.async_invoke({{"for", "iris/2"}}, boost::asio::use_future).get().output() ==
        nlohmann::json{{"by", "iris/2"}});
  try {
    queue.async_invoke(ModelRef{"nope", ""}, nlohmann::json::object(), boost::asio::use_future)
        .get();
    FAIL("an invocation of a model the queue does not serve ran");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::model_not_found);
  }

  // /metrics counts each version's jobs (not invocations, not refusals).
  const std::string metrics = queue.telemetry().render_metrics();
  for (const char* line :
       {"rebound_model_jobs_completed_total{model=\"echo\",version=\"1\",status=\"succeeded\"} 1\n",
        "rebound_model_jobs_completed_total{model=\"iris\",version=\"1\",status=\"succeeded\"} 1\n",
        "rebound_model_jobs_completed_total{model=\"iris\",version=\"2\",status=\"succeeded\"} 1\n",
        "rebound_model_jobs_completed_total{model=\"iris\",version=\"2\",status=\"failed\"} 0\n",
        "rebound_model_inference_seconds_total{model=\"iris\",version=\"1\"} "}) {
    CAPTURE(line);
    CHECK(metrics.find(line) != std::string::npos);
  }
}

TEST_CASE("batches never mix models or versions") {
  auto ledger = std::make_shared<Ledger>();
  rebound::JobQueueOptions options;
  options.workers = 1;
  rebound::JobQueue queue(two_models(ledger), nullptr, options);
  // Submitted together, in runs of ten a version: without the split, batches (up to 16) would
  // straddle the runs.
  const std::vector<ModelRef> refs = {{"iris", "1"}, {"iris", "2"}, {"echo", "1"}};
  std::vector<std::future<rebound::JobRecord>> ends;
  for (int i = 0; i < 90; ++i) {
    ends.push_back(queue.async_submit(job_for("j" + std::to_string(i), refs[(i / 10) % 3]),
                                      boost::asio::use_future));
  }
  for (auto& end : ends) {
    const rebound::JobRecord r = end.get();
    CHECK(r.status == JobStatus::succeeded);
    CHECK(r.outcome.result["by"] == r.job.model.name + "/" + r.job.model.version);
  }
  std::lock_guard<std::mutex> lock(ledger->m);
  CHECK(ledger->runs.size() == 90);
  for (const auto& [version, wanted] : ledger->runs)
    CHECK(version == wanted);  // every input reached the version it was for, and no other
  CHECK(*ledger->batch_sizes.rbegin() > 1);  // (batches did form)
}

TEST_CASE("a stored job whose version the queue does not serve fails and says why") {
  // Jobs an earlier run (or another server) stored for versions this queue lacks.
  auto store = std::make_unique<rebound::MemoryJobStore>();
  for (const auto& [id, ref] :
       std::vector<std::pair<std::string, ModelRef>>{{"old-version", {"iris", "7"}},
                                                     {"gone-model", {"resnet", "1"}},
                                                     {"kept", {"iris", "1"}}}) {
    rebound::Job job = job_for(id, ref);
    job.created_at = std::chrono::system_clock::now();
    REQUIRE(store->put(job, std::nullopt) == rebound::PutOutcome::created);
  }
  auto ledger = std::make_shared<Ledger>();
  rebound::JobQueue queue(two_models(ledger), std::move(store));
  auto end_of = [&](const std::string& id) {
    return queue.async_wait({id}, boost::asio::use_future).get();
  };
  const auto old_version = end_of("old-version");
  CHECK(old_version.status == JobStatus::failed);
  REQUIRE(old_version.outcome.error);
  CHECK(old_version.outcome.error->code == "version_unavailable");
  CHECK(old_version.job.model == ModelRef{"iris", "7"});  // as it was stored
  const auto gone = end_of("gone-model");
  REQUIRE(gone.outcome.error);
  CHECK(gone.outcome.error->code == "model_not_found");
  const auto kept = end_of("kept");
  CHECK(kept.status == JobStatus::succeeded);
  CHECK(kept.outcome.result == nlohmann::json{{"by", "iris/1"}});
  std::lock_guard<std::mutex> lock(ledger->m);
  CHECK(ledger->runs.size() == 1);  // only "kept" ran
}

TEST_CASE("one version added to a repository pins as strictly - one Model alone runs every job") {
  auto stored = [](const std::string& id, ModelRef ref) {
    auto store = std::make_unique<rebound::MemoryJobStore>();
    rebound::Job job = job_for(id, std::move(ref));
    job.created_at = std::chrono::system_clock::now();
    REQUIRE(store->put(job, std::nullopt) == rebound::PutOutcome::created);
    return store;
  };
  auto ledger = std::make_shared<Ledger>();
  {
    rebound::ModelRepository one;
    one.add(std::make_unique<Labelled>("iris", "iris/1", ledger));
    CHECK_FALSE(one.runs_every_job());
    rebound::JobQueue queue(std::move(one), stored("for-2", {"iris", "2"}));
    const auto r = queue.async_wait({"for-2"}, boost::asio::use_future).get();
    REQUIRE(r.outcome.error);
    CHECK(r.outcome.error->code == "version_unavailable");
  }
  {
    // A queue built on one Model: the job runs on it, whatever it names (as before versions).
    rebound::JobQueue queue(std::make_unique<Labelled>("iris", "iris/1", ledger),
                            stored("for-2", {"iris", "2"}));
    const auto r = queue.async_wait({"for-2"}, boost::asio::use_future).get();
    CHECK(r.status == JobStatus::succeeded);
    CHECK(r.outcome.result == nlohmann::json{{"by", "iris/1"}});
  }
  // A model whose name is no model name can be served alone, never beside another.
  rebound::ModelRepository alone(std::make_unique<Labelled>("Iris Classifier", "x", ledger));
  CHECK(alone.runs_every_job());
  CHECK(error_of([&] {
          alone.add(std::make_unique<Labelled>("echo", "echo/1", ledger));
        }).find("can only be served alone") != std::string::npos);
}

TEST_CASE(
    "make_model_repository: DIR/<name>/<version>/ - every version loaded and the highest the "
    "default") {
  TempDir repo;
  repo.write("fast/1/config.json", R"({"backend": "echo"})");
  repo.write("slow/1/config.json", R"({"backend": "echo"})");
  repo.write("slow/2/config.json", R"({"backend": "sleep", "seconds": 0})");
  repo.write("README.md", "plain files are passed over");
  repo.write(".cache/1/config.json", R"({"backend": "echo"})");  // as are hidden entries

  CHECK(error_of([&] {
          rebound::make_model_repository(repo.path.string());
        }).find("several models") != std::string::npos);
  rebound::ModelRepository models = rebound::make_model_repository(repo.path.string(), "slow");
  const std::vector<ModelRef> listed = models.list();
  REQUIRE(listed.size() == 3);
  CHECK(listed[0] == ModelRef{"fast", "1"});
  CHECK(listed[1] == ModelRef{"slow", "1"});
  CHECK(listed[2] == ModelRef{"slow", "2"});
  CHECK(models.default_version("slow") == "2");
  CHECK(models.default_model() == "slow");
  rebound::JobQueue queue(std::move(models));
  rebound::Job job = rebound::make_job("a", {{"x", 1}});
  job.model.name = "fast";
  CHECK(queue.async_submit(job, boost::asio::use_future).get().outcome.result ==
        nlohmann::json{{"x", 1}});
  CHECK(queue.async_submit(rebound::make_job("b", {{"x", 2}}), boost::asio::use_future)
            .get()
            .outcome.result == "OK");  // slow/2 (the sleep backend answers OK), not echo
  rebound::Job pinned = rebound::make_job("c", {{"x", 3}});
  pinned.model = ModelRef{"slow", "1"};
  CHECK(queue.async_submit(pinned, boost::asio::use_future).get().outcome.result ==
        nlohmann::json{{"x", 3}});  // slow/1 echoes
  CHECK(error_of([&] {
          rebound::make_model_repository(repo.path.string(), "nope");
        }).find("not in the repository") != std::string::npos);
}

TEST_CASE("make_model_repository: names - versions and links that would leave it are refused") {
  auto refusal = [](const std::function<void(const TempDir&)>& layout) {
    TempDir repo;
    layout(repo);
    return error_of([&] { rebound::make_model_repository(repo.path.string()); });
  };
  CHECK(refusal([](const TempDir& r) {
          r.write("Iris/1/config.json", R"({"backend":"echo"})");
        }).find("'Iris' is not a model name") != std::string::npos);
  CHECK(refusal([](const TempDir& r) {
          r.write("iris/01/config.json", R"({"backend":"echo"})");
        }).find("'iris/01' is not a version") != std::string::npos);
  CHECK(refusal([](const TempDir& r) {
          r.write("iris/v2/config.json", R"({"backend":"echo"})");
        }).find("is not a version") != std::string::npos);
  CHECK(refusal([](const TempDir& r) {
          fs::create_directories(r.path / "iris");
        }).find("has no version") != std::string::npos);
  CHECK(refusal([](const TempDir& r) {
          r.write("iris/1/config.json", R"({"backend":"gpu"})");
        }).find("unknown backend") != std::string::npos);
  CHECK(refusal([](const TempDir&) {}).find("no model in it") != std::string::npos);
  // A version that is a link to a directory elsewhere, and a model file that is a link out.
  TempDir outside;
  outside.write("1/config.json", R"({"backend": "echo"})");
  outside.write("model.pt", "not a model");
  CHECK(refusal([&](const TempDir& r) {
          fs::create_directories(r.path / "iris");
          fs::create_directory_symlink(outside.path / "1", r.path / "iris" / "1");
        }).find("leads outside the repository") != std::string::npos);
  CHECK(refusal([&](const TempDir& r) {
          fs::create_directories(r.path / "iris" / "1");
          fs::create_symlink(outside.path / "model.pt", r.path / "iris" / "1" / "model.pt");
        }).find("leads outside the repository") != std::string::npos);
  CHECK(refusal([&](const TempDir& r) {  // a whole model linked in from elsewhere
          fs::create_directory_symlink(outside.path, r.path / "iris");
        })
            .find("'iris' leads outside the repository") != std::string::npos);
  CHECK(refusal([&](const TempDir& r) {  // any file of the version (its digest reads them all)
          r.write("iris/1/config.json", R"({"backend": "echo"})");
          fs::create_directories(r.path / "iris" / "1" / "extra");
          fs::create_symlink("/etc/hostname", r.path / "iris" / "1" / "extra" / "notes");
        })
            .find("'iris/1/extra/notes' leads outside the repository") != std::string::npos);
  CHECK(refusal([&](const TempDir& r) {  // a link that leads nowhere is no file to pass over
          r.write("iris/1/config.json", R"({"backend": "echo"})");
          fs::create_directory_symlink(r.path / "nowhere", r.path / "iris" / "3");
        })
            .find("'iris/3' cannot be resolved") != std::string::npos);
  CHECK(refusal([&](const TempDir& r) {  // nor is a loop inside a version
          r.write("iris/1/config.json", R"({"backend": "echo"})");
          fs::create_symlink("loop", r.path / "iris" / "1" / "loop");
        })
            .find("'iris/1/loop' cannot be resolved") != std::string::npos);
  CHECK(refusal([&](const TempDir& r) {  // every version is checked, not the default alone
          r.write("iris/2/config.json", R"({"backend": "echo"})");
          fs::create_directories(r.path / "iris");
          fs::create_directory_symlink(outside.path / "1", r.path / "iris" / "1");
        })
            .find("'iris/1' leads outside the repository") != std::string::npos);
  CHECK(error_of([] {
          rebound::make_model_repository("/nonexistent/models");
        }).find("not a directory") != std::string::npos);
}

namespace {

// A version that holds every call until `open` (a job of it waiting proves a drain waits), and
// notes its end in the ledger when it is released.
class Gated final : public rebound::Model {
 public:
  Gated(std::string label, std::shared_future<void> open, std::shared_ptr<std::atomic<int>> alive)
      : label_(std::move(label)), open_(std::move(open)), alive_(std::move(alive)) {
    ++*alive_;
  }
  ~Gated() override { --*alive_; }
  std::string name() const override { return "iris"; }
  rebound::Prediction predict(const nlohmann::json&) override {
    open_.wait();
    return rebound::Prediction::success({{"by", label_}});
  }

 private:
  std::string label_;
  std::shared_future<void> open_;
  std::shared_ptr<std::atomic<int>> alive_;
};

template <typename F>
bool eventually(F&& f, std::chrono::milliseconds within = 10s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f();
}

const rebound::ModelVersionInfo* version_of(const rebound::ModelInfo& m, const std::string& v) {
  for (const auto& info : m.versions)
    if (info.version == v) return &info;
  return nullptr;
}

}  // namespace

TEST_CASE("ServedModels: a version loaded live serves - a failed load leaves the rest serving") {
  auto ledger = std::make_shared<Ledger>();
  rebound::ModelRepository models;
  models.add(std::make_unique<Labelled>("iris", "iris/1", ledger), "1");
  std::atomic<int> loads{0};
  models.set_loader([&](const ModelRef& ref) -> std::unique_ptr<rebound::Model> {
    ++loads;
    if (ref.version == "3") throw rebound::Error("model.pt is corrupt");
    return std::make_unique<Labelled>(ref.name, ref.name + "/" + ref.version, ledger);
  });
  models.set_digester([](const ModelRef& ref) { return "sha256:" + ref.name + ref.version; });
  rebound::JobQueue queue(std::move(models));
  auto& served = queue.models();

  const rebound::ModelInfo loaded = served.async_load("iris", "2", boost::asio::use_future).get();
  const auto* two = version_of(loaded, "2");
  REQUIRE(two);
  CHECK(two->state == rebound::VersionState::ready);
  CHECK(two->digest == "sha256:iris2");
  CHECK(loaded.route.default_version == "1");  // a load alone sends it no job
  // Loading a ready version again loads nothing.
  served.async_load("iris", "2", boost::asio::use_future).get();
  CHECK(loads == 1);
  auto pinned = queue.async_submit(job_for("to-2", {"iris", "2"}), boost::asio::use_future);
  CHECK(pinned.get().outcome.result == nlohmann::json{{"by", "iris/2"}});

  // A version that fails to load says why; what served keeps serving.
  std::promise<std::pair<boost::system::error_code, rebound::ModelInfo>> failed;
  served.async_load("iris", "3", [&](boost::system::error_code ec, rebound::ModelInfo m) {
    failed.set_value({ec, std::move(m)});
  });
  const auto [ec, after] = failed.get_future().get();
  CHECK(ec == rebound::errc::load_failed);
  const auto* three = version_of(after, "3");
  REQUIRE(three);
  CHECK(three->state == rebound::VersionState::failed);
  REQUIRE(three->error);
  CHECK(three->error->message.find("corrupt") != std::string::npos);
  const auto plain = queue.async_submit(job_for("plain", {}), boost::asio::use_future).get();
  CHECK(plain.job.model == ModelRef{"iris", "1"});
  try {
    queue.async_submit(job_for("to-3", {"iris", "3"}), boost::asio::use_future).get();
    FAIL("a failed version took a job");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::version_unavailable);
  }

  // A new model may be added: its first version is its default.
  served.async_load("fresh", "7", boost::asio::use_future).get();
  CHECK(served.find("fresh")->route.default_version == "7");
  const auto fresh =
      queue.async_submit(job_for("fresh-job", {"fresh", ""}), boost::asio::use_future).get();
  CHECK(fresh.job.model == ModelRef{"fresh", "7"});
  // Names and versions that are none are refused before the loader sees them.
  CHECK_THROWS(served.async_load("../etc", "1", boost::asio::use_future).get());
  CHECK_THROWS(served.async_load("iris", "01", boost::asio::use_future).get());
  CHECK(loads == 3);  // 2, 3 and fresh/7
}

TEST_CASE("ServedModels: a route splits by tenant and id - stale generations are refused") {
  auto ledger = std::make_shared<Ledger>();
  rebound::JobQueueOptions options;
  options.queue_capacity = 4096;
  options.max_queue_delay = 0ms;  // one job at a time here: no batch to wait for
  rebound::JobQueue queue(two_models(ledger), nullptr, options);
  auto& served = queue.models();
  const std::uint64_t first = served.find("iris")->generation;
  CHECK(served.find("iris")->route.default_version == "2");

  rebound::ModelInfo after;
  REQUIRE_FALSE(served.set_route("iris", {"1", {{"2", 10}}}, first, &after));
  CHECK(after.generation == first + 1);
  CHECK(served.set_route("iris", {"1", {}}, first) == rebound::errc::route_changed);
  CHECK(served.set_route("iris", {"1", {{"3", 10}}}) == rebound::errc::version_unavailable);
  CHECK(served.set_route("iris", {"1", {{"2", 60}, {"2", 10}}}) == rebound::errc::invalid_route);
  CHECK(served.set_route("iris", {"1", {{"2", 101}}}) == rebound::errc::invalid_route);
  CHECK(served.set_route("nope", {"1", {}}) == rebound::errc::model_not_found);
  CHECK(served.find("iris")->generation == first + 1);  // none of those changed it

  std::vector<rebound::Job> jobs;
  for (int i = 0; i < 2000; ++i)
    jobs.push_back(job_for("split-" + std::to_string(i), {"iris", ""}));
  std::map<std::string, int> by_version;
  std::map<std::string, std::string> chosen;
  for (auto& job : jobs) {
    const std::string id = job.id;
    const auto r = queue.async_submit(std::move(job), boost::asio::use_future).get();
    ++by_version[r.job.model.version];
    chosen[id] = r.job.model.version;
  }
  CHECK(by_version["2"] >= 140);  // 10 % of 2000, within a few points
  CHECK(by_version["2"] <= 260);
  CHECK(by_version["1"] + by_version["2"] == 2000);
  // The choice is the job's: the same tenant and id land on the same version in another queue.
  rebound::JobQueue again(two_models(ledger), nullptr, options);
  REQUIRE_FALSE(again.models().set_route("iris", {"1", {{"2", 10}}}));
  for (int i = 0; i < 50; ++i) {
    const std::string id = "split-" + std::to_string(i);
    const auto r = again.async_submit(job_for(id, {"iris", ""}), boost::asio::use_future).get();
    CHECK(r.job.model.version == chosen[id]);
  }
}

TEST_CASE("ServedModels: an unload drains - queued jobs finish on their version first") {
  std::promise<void> gate, opened;
  const std::shared_future<void> open = gate.get_future().share();
  opened.set_value();  // (version 2 never waits)
  auto alive = std::make_shared<std::atomic<int>>(0);
  rebound::ModelRepository models;
  models.add(std::make_unique<Gated>("iris/1", open, alive), "1")
      .add(std::make_unique<Gated>("iris/2", opened.get_future().share(), alive), "2");
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.max_batch_size = 1;
  rebound::JobQueue queue(std::move(models), nullptr, options);
  auto& served = queue.models();
  REQUIRE_FALSE(served.set_route("iris", {"1", {}}));
  std::vector<std::future<rebound::JobRecord>> v1;
  for (int i = 0; i < 5; ++i) {
    v1.push_back(queue.async_submit(job_for("v1-" + std::to_string(i), {"iris", ""}),
                                    boost::asio::use_future));
  }
  CHECK(eventually([&] { return version_of(*served.find("iris"), "1")->running == 1; }));
  CHECK(version_of(*served.find("iris"), "1")->queued == 4);

  // While the route names it, it stays.
  CHECK_THROWS(served.async_unload("iris", "1", boost::asio::use_future).get());
  REQUIRE_FALSE(served.set_route("iris", {"2", {}}));
  auto unloaded = served.async_unload("iris", "1", boost::asio::use_future);
  CHECK(unloaded.wait_for(100ms) == std::future_status::timeout);  // its jobs are still queued
  CHECK(version_of(*served.find("iris"), "1")->state == rebound::VersionState::draining);
  try {
    queue.async_submit(job_for("late", {"iris", "1"}), boost::asio::use_future).get();
    FAIL("a draining version took a new job");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::version_unavailable);
  }
  CHECK(*alive == 2);

  gate.set_value();
  for (auto& f : v1) {
    const auto r = f.get();
    CHECK(r.status == JobStatus::succeeded);
    CHECK(r.job.model == ModelRef{"iris", "1"});
  }
  const rebound::ModelInfo info = unloaded.get();
  CHECK(version_of(info, "1")->state == rebound::VersionState::unloaded);
  CHECK(*alive == 1);  // its Model is released
  const rebound::JobRecord after =
      queue.async_submit(job_for("after", {}), boost::asio::use_future).get();
  CHECK(after.job.model == ModelRef{"iris", "2"});
  CHECK(after.outcome.result == nlohmann::json{{"by", "iris/2"}});
  // Loaded again, it serves again (no loader here: refused).
  std::promise<boost::system::error_code> reload;
  served.async_load(
      "iris", "1", [&](boost::system::error_code ec, rebound::ModelInfo) { reload.set_value(ec); });
  CHECK(reload.get_future().get() == rebound::errc::no_loader);
}

TEST_CASE(
    "ServedModels: an unload with reroute sends jobs not started to the route - recorded so") {
  std::promise<void> gate_1, gate_2;
  auto alive = std::make_shared<std::atomic<int>>(0);
  rebound::ModelRepository models;
  models.add(std::make_unique<Gated>("iris/1", gate_1.get_future().share(), alive), "1")
      .add(std::make_unique<Gated>("iris/2", gate_2.get_future().share(), alive), "2");
  auto owned = std::make_unique<rebound::MemoryJobStore>();
  rebound::MemoryJobStore* store = owned.get();  // (thread-safe: the test adds a job to it)
  rebound::JobQueueOptions options;
  options.workers = 1;
  options.max_batch_size = 16;  // the jobs left wait for one batch
  rebound::JobQueue queue(std::move(models), std::move(owned), options);
  auto& served = queue.models();
  REQUIRE_FALSE(served.set_route("iris", {"1", {}}));
  // One job runs on version 1 (held at its gate); three more wait for it, and one more is found
  // in the store (claimed, not submitted: no Model holds it for its version).
  std::vector<std::future<rebound::JobRecord>> ends;
  std::vector<std::string> ids;
  const auto submit = [&](const std::string& id) {
    ids.push_back(id);
    ends.push_back(queue.async_submit(job_for(id, {"iris", ""}), boost::asio::use_future));
  };
  submit("first");
  REQUIRE(eventually([&] { return version_of(*served.find("iris"), "1")->running == 1; }));
  for (int i = 0; i < 3; ++i)
    submit("v1-" + std::to_string(i));
  rebound::Job parked = job_for("stored", {"iris", "1"});
  parked.created_at = std::chrono::system_clock::now();
  REQUIRE(store->put(parked, std::nullopt) == rebound::PutOutcome::created);
  ids.push_back("stored");
  REQUIRE(eventually([&] { return version_of(*served.find("iris"), "1")->queued == 4; }));

  REQUIRE_FALSE(served.set_route("iris", {"2", {}}));
  auto unloaded =
      served.async_unload("iris", "1", rebound::QueuedJobs::reroute, boost::asio::use_future);
  CHECK(unloaded.wait_for(50ms) == std::future_status::timeout);  // "first" runs on it
  gate_1.set_value();
  // The drain ends once the others were sent on, while they still wait at version 2's gate.
  REQUIRE(unloaded.wait_for(10s) == std::future_status::ready);
  CHECK(version_of(unloaded.get(), "1")->state == rebound::VersionState::unloaded);
  CHECK(*alive == 1);  // version 1's Model is released
  // (The last job sent on may count at version 1 no more and at version 2 not yet as the drain
  // ends.)
  CHECK(eventually([&] { return version_of(*served.find("iris"), "2")->running == 4; }));
  gate_2.set_value();
  for (auto& f : ends) {
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    CHECK(f.get().status == JobStatus::succeeded);
  }

  // "first" ran on version 1; every other ran on version 2, and its record (as the store keeps
  // it) and result agree.
  for (const std::string& id : ids) {
    CAPTURE(id);
    std::optional<rebound::JobRecord> r;
    REQUIRE(eventually([&] {
      r = queue.find({id});
      return r && r->status == JobStatus::succeeded;
    }));
    const std::string version = id == "first" ? "1" : "2";
    CHECK(r->job.model == ModelRef{"iris", version});
    CHECK(r->outcome.result == nlohmann::json{{"by", "iris/" + version}});
  }
  // New jobs go where the route sends them.
  CHECK(queue.async_submit(job_for("after", {}), boost::asio::use_future).get().job.model ==
        ModelRef{"iris", "2"});
}

TEST_CASE("ServedModels: a queue may start empty with a loader - a model retired and loaded back") {
  auto ledger = std::make_shared<Ledger>();
  rebound::ModelRepository none;
  CHECK_THROWS_AS(rebound::JobQueue(rebound::ModelRepository()), rebound::Error);  // no loader
  none.set_loader([&](const ModelRef& ref) -> std::unique_ptr<rebound::Model> {
    return std::make_unique<Labelled>(ref.name, ref.name + "/" + ref.version, ledger);
  });
  rebound::JobQueue queue(std::move(none));
  CHECK(queue.ready());  // nothing to wait for
  CHECK(queue.models().list().empty());
  CHECK_FALSE(queue.model());
  try {
    queue.async_submit(job_for("early", {"iris", ""}), boost::asio::use_future).get();
    FAIL("a job for a model not loaded was accepted");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::model_not_found);
  }
  queue.models().async_load("iris", "1", boost::asio::use_future).get();
  CHECK(queue.async_submit(job_for("loaded", {"iris", ""}), boost::asio::use_future)
            .get()
            .outcome.result == nlohmann::json{{"by", "iris/1"}});

  // Retired: its route is emptied, its versions drain and unload; a job naming it is refused.
  const rebound::ModelInfo retired =
      queue.models().async_unload_model("iris", boost::asio::use_future).get();
  CHECK(retired.route.default_version.empty());
  CHECK(version_of(retired, "1")->state == rebound::VersionState::unloaded);
  try {
    queue.async_submit(job_for("retired", {"iris", ""}), boost::asio::use_future).get();
    FAIL("a job for a retired model was accepted");
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == rebound::errc::version_unavailable);
  }
  // Loaded back, its version is its default again.
  queue.models().async_load("iris", "1", boost::asio::use_future).get();
  CHECK(
      queue.async_submit(job_for("back", {"iris", ""}), boost::asio::use_future).get().job.model ==
      ModelRef{"iris", "1"});
  CHECK_THROWS(queue.models().async_unload_model("nope", boost::asio::use_future).get());
}

namespace {

// One MemoryJobStore shared by several queues, as the servers of a fleet share one Redis, with
// the calls a fleet's models need: claims that skip versions, and the model configs.
class Shared final : public rebound::test::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::vector<rebound::JobRecord> claim_jobs_except(std::size_t max, const rebound::Lease& lease,
                                                    TimePoint now,
                                                    const std::vector<ModelRef>& skip) override {
    return inner_->claim_jobs_except(max, lease, now, skip);
  }
  std::optional<std::uint64_t> put_model_config(const std::string& name, const std::string& config,
                                                std::uint64_t if_generation) override {
    return inner_->put_model_config(name, config, if_generation);
  }
  std::optional<std::vector<rebound::ModelConfig>> model_configs() const override {
    return inner_->model_configs();
  }
  std::vector<ModelRef> waiting_versions(const std::vector<ModelRef>& versions,
                                         TimePoint since) const override {
    return inner_->waiting_versions(versions, since);
  }
};

// A server of the fleet: version 1 of iris at its start, a loader for any other. With a memory
// budget, each version weighs 10 bytes.
std::unique_ptr<rebound::JobQueue> fleet_server(
    const std::shared_ptr<rebound::MemoryJobStore>& store, const std::shared_ptr<Ledger>& ledger,
    const std::string& server, std::size_t budget = 0) {
  const std::size_t bytes = budget > 0 ? 10 : 0;
  rebound::ModelRepository models;
  models.add(std::make_unique<Labelled>("iris", server + ":iris/1", ledger, bytes), "1");
  models.set_loader(
      [ledger, server, bytes](const ModelRef& ref) -> std::unique_ptr<rebound::Model> {
        if (ref.version == "9") throw rebound::Error("no such version on " + server);
        return std::make_unique<Labelled>(ref.name, server + ":" + ref.name + "/" + ref.version,
                                          ledger, bytes);
      });
  if (budget > 0) models.set_memory_budget(budget);
  rebound::JobQueueOptions options;
  options.max_queue_delay = 0ms;
  options.poll_interval = 20ms;
  return std::make_unique<rebound::JobQueue>(std::move(models), std::make_unique<Shared>(store),
                                             options);
}

rebound::VersionState state_of(rebound::JobQueue& q, const std::string& model,
                               const std::string& version) {
  const auto info = q.models().find(model);
  const auto* v = info ? version_of(*info, version) : nullptr;
  return v ? v->state : rebound::VersionState::unloaded;
}

}  // namespace

TEST_CASE("ServedModels on a shared store: every server follows loads - routes and unloads") {
  auto ledger = std::make_shared<Ledger>();
  auto store = std::make_shared<rebound::MemoryJobStore>();
  auto a = fleet_server(store, ledger, "a");
  auto b = fleet_server(store, ledger, "b");
  CHECK(a->models().find("iris")->generation == b->models().find("iris")->generation);

  // A version loaded on one server is loaded on every one.
  a->models().async_load("iris", "2", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*b, "iris", "2") == rebound::VersionState::ready; }));

  // A route set on one is the fleet's: the others follow with its generation, and a write on a
  // generation another server replaced is refused there too.
  const std::uint64_t before = a->models().find("iris")->generation;
  rebound::ModelInfo set;
  REQUIRE_FALSE(a->models().set_route("iris", {"1", {{"2", 10}}}, before, &set));
  CHECK(eventually([&] {
    const auto info = b->models().find("iris");
    return info->generation == set.generation && info->route.split.size() == 1;
  }));
  CHECK(b->models().set_route("iris", {"2", {}}, before) == rebound::errc::route_changed);
  // Two servers writing on the same generation: one of them wins.
  std::uint64_t now = b->models().find("iris")->generation;
  const auto from_b = b->models().set_route("iris", {"2", {}}, now);
  const auto from_a = a->models().set_route("iris", {"1", {}}, now);
  CHECK((!from_b && from_a == rebound::errc::route_changed));
  CHECK(eventually([&] { return a->models().find("iris")->route.default_version == "2"; }));

  // Jobs on either server follow the route; each runs on the version its server chose.
  for (auto* q : {a.get(), b.get()}) {
    const auto r =
        q->async_submit(job_for("promoted-" + std::to_string(q == a.get()), {"iris", ""}),
                        boost::asio::use_future)
            .get();
    CHECK(r.status == JobStatus::succeeded);
    CHECK(r.job.model == ModelRef{"iris", "2"});
  }

  // A version unloaded on one is unloaded on every one; a failed load here is this server's own.
  b->models().async_unload("iris", "1", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*a, "iris", "1") == rebound::VersionState::unloaded; }));
  std::promise<boost::system::error_code> failed;
  a->models().async_load(
      "iris", "9", [&](boost::system::error_code ec, rebound::ModelInfo) { failed.set_value(ec); });
  CHECK(failed.get_future().get() == rebound::errc::load_failed);

  // A model new to the fleet, from any server; retired from any other.
  b->models().async_load("fresh", "3", boost::asio::use_future).get();
  CHECK(eventually([&] {
    const auto info = a->models().find("fresh");
    return info && info->route.default_version == "3" &&
           state_of(*a, "fresh", "3") == rebound::VersionState::ready;
  }));
  a->models().async_unload_model("fresh", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*b, "fresh", "3") == rebound::VersionState::unloaded; }));
  // The same version unloaded through two servers at once, then loaded again through one: every
  // server serves it again, and keeps it (no stale unload of either undoes the load).
  a->models().async_load("iris", "4", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*b, "iris", "4") == rebound::VersionState::ready; }));
  auto unload_a = a->models().async_unload("iris", "4", boost::asio::use_future);
  auto unload_b = b->models().async_unload("iris", "4", boost::asio::use_future);
  unload_a.get();
  unload_b.get();
  a->models().async_load("iris", "4", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*b, "iris", "4") == rebound::VersionState::ready; }));
  std::this_thread::sleep_for(1500ms);  // three passes of each server's sync
  CHECK(state_of(*a, "iris", "4") == rebound::VersionState::ready);
  CHECK(state_of(*b, "iris", "4") == rebound::VersionState::ready);

  // Unloaded through one server and loaded again at once through another that has not read the
  // unload yet: the last action stands, on every server.
  a->models().async_unload("iris", "4", boost::asio::use_future).get();
  b->models().async_load("iris", "4", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*a, "iris", "4") == rebound::VersionState::ready; }));
  std::this_thread::sleep_for(1500ms);
  CHECK(state_of(*a, "iris", "4") == rebound::VersionState::ready);
  CHECK(state_of(*b, "iris", "4") == rebound::VersionState::ready);
  // A route set through one server names a version: another that has not read it yet refuses to
  // unload that version all the same.
  now = a->models().find("iris")->generation;
  REQUIRE_FALSE(a->models().set_route("iris", {"2", {{"4", 10}}}, now));
  std::promise<boost::system::error_code> routed;
  b->models().async_unload(
      "iris", "4", [&](boost::system::error_code ec, rebound::ModelInfo) { routed.set_value(ec); });
  CHECK(routed.get_future().get() == rebound::errc::version_in_route);
  CHECK(state_of(*b, "iris", "4") == rebound::VersionState::ready);

  // A server that starts later takes the fleet's route as it stands.
  auto c = fleet_server(store, ledger, "c");
  CHECK(eventually([&] {
    return c->models().find("iris")->route.default_version == "2" &&
           state_of(*c, "iris", "2") == rebound::VersionState::ready;
  }));
}

TEST_CASE("ServedModels on a shared store: an unload with reroute sends the fleet's jobs on too") {
  auto ledger = std::make_shared<Ledger>();
  auto store = std::make_shared<rebound::MemoryJobStore>();
  auto a = fleet_server(store, ledger, "a");
  auto b = fleet_server(store, ledger, "b");
  a->models().async_load("iris", "2", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*b, "iris", "2") == rebound::VersionState::ready; }));
  REQUIRE_FALSE(a->models().set_route("iris", {"2", {}}));
  CHECK(eventually([&] { return b->models().find("iris")->route.default_version == "2"; }));

  // Unloaded through A with its jobs sent to the route: B drains it the same way, and the store's
  // config says so.
  a->models()
      .async_unload("iris", "1", rebound::QueuedJobs::reroute, boost::asio::use_future)
      .get();
  CHECK(eventually([&] { return state_of(*b, "iris", "1") == rebound::VersionState::unloaded; }));
  const auto config_of_iris = [&] {
    const std::vector<rebound::ModelConfig> configs = store->model_configs().value();
    for (const rebound::ModelConfig& c : configs)
      if (c.name == "iris") return c.config;
    return std::string();
  };
  CHECK(config_of_iris().find("\"rerouted\":[\"1\"]") != std::string::npos);

  // With A gone, a job still stored for version 1 is B's alone to claim: it runs on version 2
  // (at once: no minute's grace for another server's drain), and is recorded so.
  a.reset();
  rebound::Job left = job_for("left", {"iris", "1"});
  left.created_at = std::chrono::system_clock::now();
  REQUIRE(store->put(left, std::nullopt) == rebound::PutOutcome::created);
  auto waited = b->async_wait({"left"}, boost::asio::use_future);
  REQUIRE(waited.wait_for(10s) == std::future_status::ready);  // (a minute's grace would fail)
  const rebound::JobRecord r = waited.get();
  CHECK(r.status == JobStatus::succeeded);
  CHECK(r.outcome.result == nlohmann::json{{"by", "b:iris/2"}});
  CHECK(store->get("left")->job.model == ModelRef{"iris", "2"});

  // Loaded again, version 1 runs its own jobs, and is no longer rerouted in the fleet's config.
  b->models().async_load("iris", "1", boost::asio::use_future).get();
  rebound::Job pinned = job_for("pinned", {"iris", "1"});
  CHECK(b->async_submit(pinned, boost::asio::use_future).get().outcome.result ==
        nlohmann::json{{"by", "b:iris/1"}});
  CHECK(eventually([&] {
    const std::string config = config_of_iris();
    return !config.empty() && config.find("rerouted") == std::string::npos;
  }));
}

TEST_CASE(
    "ServedModels on a shared store: a version evicted everywhere is loaded when its jobs wait") {
  // Two servers, each with room for two versions of ten bytes; version 1 is the route's.
  auto ledger = std::make_shared<Ledger>();
  auto store = std::make_shared<rebound::MemoryJobStore>();
  auto a = fleet_server(store, ledger, "a", 25);
  auto b = fleet_server(store, ledger, "b", 25);
  a->models().async_load("iris", "2", boost::asio::use_future).get();
  CHECK(eventually([&] { return state_of(*b, "iris", "2") == rebound::VersionState::ready; }));
  // Version 3 makes every server evict the idle 2 (the fleet still serves it: evictions are each
  // server's own).
  a->models().async_load("iris", "3", boost::asio::use_future).get();
  CHECK(eventually([&] {
    return state_of(*b, "iris", "3") == rebound::VersionState::ready &&
           state_of(*a, "iris", "2") == rebound::VersionState::unloaded &&
           state_of(*b, "iris", "2") == rebound::VersionState::unloaded;
  }));
  // With no job of it, nobody loads it back.
  std::this_thread::sleep_for(1500ms);
  CHECK(state_of(*a, "iris", "2") == rebound::VersionState::unloaded);
  CHECK(state_of(*b, "iris", "2") == rebound::VersionState::unloaded);

  // A job pinned to version 2 waits in the store (accepted by a server that had it, say): within
  // seconds a server loads 2 back, in the room of the least recently used 3, and runs it.
  rebound::Job pinned = job_for("pinned-2", {"iris", "2"});
  pinned.created_at = std::chrono::system_clock::now();
  REQUIRE(store->put(pinned, std::nullopt) == rebound::PutOutcome::created);
  auto waited = a->async_wait({"pinned-2"}, boost::asio::use_future);
  REQUIRE(waited.wait_for(15s) == std::future_status::ready);  // (not a minute's retry)
  const rebound::JobRecord r = waited.get();
  CHECK(r.status == JobStatus::succeeded);
  const std::string by = r.outcome.result.value("by", "");
  CHECK((by == "a:iris/2" || by == "b:iris/2"));
  rebound::JobQueue& ran = by == "a:iris/2" ? *a : *b;
  CHECK(state_of(ran, "iris", "2") == rebound::VersionState::ready);
  CHECK(state_of(ran, "iris", "3") == rebound::VersionState::unloaded);  // (the budget held)
  CHECK(state_of(ran, "iris", "1") == rebound::VersionState::ready);     // (the route's)

  // A route that names a version a server evicted is followed there at once, jobs or not. (The
  // other server may have loaded 2 as well, evicting 3: it is loaded there first, as a route may
  // name only versions ready where it is set.)
  rebound::JobQueue& other = &ran == a.get() ? *b : *a;
  other.models().async_load("iris", "3", boost::asio::use_future).get();
  const std::uint64_t generation = other.models().find("iris")->generation;
  REQUIRE_FALSE(other.models().set_route("iris", {"3", {}}, generation));
  CHECK(eventually([&] { return state_of(ran, "iris", "3") == rebound::VersionState::ready; }));
  CHECK(eventually([&] { return state_of(other, "iris", "3") == rebound::VersionState::ready; }));
}

namespace {

// A version that says what it holds in memory.
class Weighing final : public rebound::Model {
 public:
  Weighing(std::string name, std::size_t bytes) : name_(std::move(name)), bytes_(bytes) {}
  std::string name() const override { return name_; }
  std::size_t memory_bytes() const override { return bytes_; }
  rebound::Prediction predict(const nlohmann::json&) override {
    return rebound::Prediction::success({{"ok", true}});
  }

 private:
  std::string name_;
  std::size_t bytes_;
};

}  // namespace

TEST_CASE(
    "ServedModels: a memory budget unloads the least recently used - never a routed version") {
  rebound::ModelRepository models;
  models.add(std::make_unique<Weighing>("iris", 10), "1");
  models.set_loader([](const ModelRef& ref) -> std::unique_ptr<rebound::Model> {
    return std::make_unique<Weighing>(ref.name, 10);
  });
  models.set_memory_budget(35);
  rebound::JobQueueOptions options;
  options.max_queue_delay = 0ms;
  rebound::JobQueue queue(std::move(models), nullptr, options);
  auto& served = queue.models();
  served.async_load("iris", "2", boost::asio::use_future).get();
  const rebound::ModelInfo three = served.async_load("iris", "3", boost::asio::use_future).get();
  CHECK(version_of(three, "3")->memory_bytes == 10);
  // Version 2 used after 3: 3 is the least recently used, and goes for 4.
  CHECK(queue.async_submit(job_for("to-2", {"iris", "2"}), boost::asio::use_future).get().status ==
        JobStatus::succeeded);
  served.async_load("iris", "4", boost::asio::use_future).get();
  CHECK(
      eventually([&] { return state_of(queue, "iris", "3") == rebound::VersionState::unloaded; }));
  CHECK(state_of(queue, "iris", "2") == rebound::VersionState::ready);
  CHECK(state_of(queue, "iris", "1") == rebound::VersionState::ready);  // the route's default

  // The route moves to 4 and 2: version 1 is the one that may go now.
  REQUIRE_FALSE(served.set_route("iris", {"4", {{"2", 10}}}));
  served.async_load("iris", "5", boost::asio::use_future).get();
  CHECK(
      eventually([&] { return state_of(queue, "iris", "1") == rebound::VersionState::unloaded; }));

  // Every version loaded is routed: no room, and the load fails saying why.
  REQUIRE_FALSE(served.set_route("iris", {"5", {{"4", 10}, {"2", 10}}}));
  std::promise<std::pair<boost::system::error_code, rebound::ModelInfo>> refused;
  served.async_load("iris", "6", [&](boost::system::error_code ec, rebound::ModelInfo m) {
    refused.set_value({ec, std::move(m)});
  });
  const auto [ec, info] = refused.get_future().get();
  CHECK(ec == rebound::errc::load_failed);
  const auto* six = version_of(info, "6");
  REQUIRE(six);
  CHECK(six->state == rebound::VersionState::failed);
  REQUIRE(six->error);
  CHECK(six->error->code == "insufficient_memory");
  CHECK(six->error->message.find("budget") != std::string::npos);
  for (const char* v : {"2", "4", "5"})
    CHECK(state_of(queue, "iris", v) == rebound::VersionState::ready);
  CHECK(queue.telemetry().render_metrics().find("rebound_model_memory_budget_bytes 35") !=
        std::string::npos);
}

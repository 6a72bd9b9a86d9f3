// A model swapped while the queue runs: version 2 loaded beside version 1, canaried at 10 %,
// promoted, and version 1 unloaded once its jobs ran; every job says which version answered.
// Then a memory budget of two versions: loading a fourth unloads the idle third, never the
// routed one.
// Usage: rebound-model-swap   (prints what each step did; exits 0 when every job succeeded)
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <rebound/rebound.hpp>

// Version N of "scaler" multiplies by N: a stand-in for weights retrained every week.
struct Scaler final : rebound::Model {
  explicit Scaler(int factor) : factor_(factor) {}
  std::string name() const override { return "scaler"; }
  rebound::Prediction predict(const nlohmann::json& x) override {
    if (!x.is_number_integer()) return rebound::Prediction::failure("invalid_input", "not an int");
    return rebound::Prediction::success(x.get<int>() * factor_);
  }
  // What a version holds (its weights, say): what the memory budget counts.
  std::size_t memory_bytes() const override { return std::size_t{1} << 20; }

 private:
  int factor_;
};

int main() {
  rebound::ModelRepository repository;
  repository.add(std::make_unique<Scaler>(1), "1");
  // What a live load builds (rebound::make_model_repository's loader reads DIR/<name>/<version>/).
  repository.set_loader([](const rebound::ModelRef& v) -> std::unique_ptr<rebound::Model> {
    return std::make_unique<Scaler>(std::stoi(v.version));
  });
  // Two versions' worth (1 MiB each): a load beyond it first unloads the least recently used
  // versions that no route names and no job holds (else it fails, insufficient_memory).
  repository.set_memory_budget(std::size_t{2} << 20);
  rebound::JobQueue queue(std::move(repository));
  rebound::ServedModels& models = queue.models();

  // Load version 2 on the queue's own loading thread; jobs keep running on version 1 meanwhile.
  const rebound::ModelInfo loaded = models.async_load("scaler", "2", boost::asio::use_future).get();
  std::cout << "loaded: scaler/2 " << rebound::to_string(loaded.versions.back().state) << "\n";

  // A 10 % canary: the job's tenant and id pick its version (the same job, the same version).
  const auto run = [&](const std::string& id) {
    return queue.async_submit(rebound::make_job(id, 10), boost::asio::use_future).get();
  };
  if (models.set_route("scaler", {"1", {{"2", 10}}})) return 1;
  std::map<std::string, int> by_version;
  bool all_ok = true;
  for (int i = 0; i < 200; ++i) {
    const rebound::JobRecord r = run("canary-" + std::to_string(i));
    ++by_version[r.job.model.version];
    all_ok = all_ok && r.status == rebound::JobStatus::succeeded;
  }
  std::cout << "canary: " << by_version["1"] << " on scaler/1, " << by_version["2"]
            << " on scaler/2\n";

  // Promote version 2 (the generation guards against a change made meanwhile), then unload
  // version 1: it takes no new job and drains, its jobs not started yet going to the route's
  // choice (version 2) instead of running on it (QueuedJobs::reroute; without it, `finish`: they
  // run on version 1 first); then its Model is released.
  const std::uint64_t generation = models.find("scaler")->generation;
  if (models.set_route("scaler", {"2", {}}, generation)) return 1;
  const rebound::ModelInfo after =
      models.async_unload("scaler", "1", rebound::QueuedJobs::reroute, boost::asio::use_future)
          .get();
  std::cout << "unloaded: scaler/1 " << rebound::to_string(after.versions.front().state) << "\n";

  const rebound::JobRecord last = run("after");
  std::cout << "after: scaler/" << last.job.model.version << " -> " << last.outcome.result << "\n";
  all_ok = all_ok && last.outcome.result == 20 && by_version["2"] > 0 && by_version["1"] > 0;

  // Version 3 fits beside 2; version 4 does not, so the idle, unrouted 3 makes room (2 is routed).
  models.async_load("scaler", "3", boost::asio::use_future).get();
  const rebound::ModelInfo budget = models.async_load("scaler", "4", boost::asio::use_future).get();
  std::string states;
  for (const rebound::ModelVersionInfo& v : budget.versions)
    states += " " + v.version + ":" + rebound::to_string(v.state);
  std::cout << "with a budget of two:" << states << "\n";
  const auto state_of = [&](const std::string& version) {
    for (const rebound::ModelVersionInfo& v : budget.versions)
      if (v.version == version) return v.state;
    return rebound::VersionState::unloaded;
  };
  all_ok = all_ok && state_of("2") == rebound::VersionState::ready &&
           state_of("3") == rebound::VersionState::unloaded &&
           state_of("4") == rebound::VersionState::ready;
  std::cout << (all_ok ? "every job succeeded" : "a job failed") << std::endl;
  return all_ok ? 0 : 1;
}

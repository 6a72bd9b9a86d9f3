// ModelRepository: the models a JobQueue serves, each by name in one or more versions.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rebound/error.hpp"
#include "rebound/job.hpp"
#include "rebound/model.hpp"

namespace rebound {

namespace detail {
class ModelTable;
}

/// Builds one version of one model for a live load (ServedModels::async_load), on the queue's
/// loading thread: returns the Model (never null) or throws an exception whose what() says why
/// it cannot (the version is then `failed`, with that message).
using ModelLoader = std::function<std::unique_ptr<Model>(const ModelRef& version)>;

/// The models one JobQueue serves: each by its name (is_valid_model_name) in one or more versions
/// (is_valid_model_version: "1", "2", ... ordered as numbers), each version a Model of its own.
/// A model's highest version is its default: a job that names the model and no version runs on
/// it. One model is the repository's default: a job that names no model goes to it.
///
/// A job is pinned to the version chosen when it was accepted (`Job::model`, kept by the store),
/// and runs on exactly that version; batches never mix models or versions. A job taken over from
/// a store (an earlier run, another server) whose version this queue does not serve fails with
/// `model_not_found` or `version_unavailable`, except in a repository made of one Model by its
/// one-Model constructor (what a JobQueue built on one Model serves), which runs every job it
/// takes, as a queue of one model always did (runs_every_job).
///
/// Example (two models, the second in two versions; examples/embedded/main.cpp serves two
/// versions of one model):
///   rebound::ModelRepository models;
///   models.add(rebound::make_model("echo"))                // echo, version 1
///       .add(std::make_unique<Iris>(v1), "1")              // iris, version 1
///       .add(std::make_unique<Iris>(v2), "2")              // iris, version 2: its default
///       .set_default_model("iris");
///   rebound::JobQueue queue(std::move(models));
///
/// rebound-server builds one from a directory (`--model-repository DIR`, make_model_repository),
/// whose loader (set_loader) reads further versions from the same directory while the queue runs
/// (ServedModels::async_load). This is what the queue starts with; `queue.models()` is what it
/// serves now.
///
/// Thread-safety: build it on one thread; the JobQueue it is moved into takes its models.
class ModelRepository {
 public:
  ModelRepository() = default;
  /// A repository of one model, version "1" of `model->name()`: what a JobQueue built on one
  /// Model serves. (Its name is not checked here: such a model serves whatever it is called, and
  /// only a submission that names it needs a model name.)
  explicit ModelRepository(std::unique_ptr<Model> model) {
    if (!model) throw Error("ModelRepository: a model is required");
    default_model_ = model->name();
    models_[default_model_].emplace("1", std::move(model));
    runs_every_job_ = true;
  }
  ModelRepository(ModelRepository&&) noexcept = default;
  ModelRepository& operator=(ModelRepository&&) noexcept = default;
  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  /// Adds `model` as `version` of the model named `model->name()` (read once, here). Throws
  /// rebound::Error for a null model, a name or version that is not one, or a version added
  /// already. The first model added is the default model until set_default_model says otherwise.
  ModelRepository& add(std::unique_ptr<Model> model, std::string version = "1") {
    if (!model) throw Error("ModelRepository: a model is required");
    std::string name = model->name();
    return add(std::move(name), std::move(version), std::move(model));
  }

  /// Adds `model` as `version` of the model `name`, whatever its own `name()` says (a model
  /// repository's directory names it: make_model_repository). Throws as the other `add`.
  ModelRepository& add(std::string name, std::string version, std::unique_ptr<Model> model) {
    if (!model) throw Error("ModelRepository: a model is required");
    if (runs_every_job_ && !is_valid_model_name(default_model_)) {
      throw Error("ModelRepository: the first model's name '" + default_model_ +
                  "' is not a model name: it can only be served alone");
    }
    if (!is_valid_model_name(name)) {
      throw Error("ModelRepository: '" + name +
                  "' is not a model name (1 to 64 of a-z 0-9 . _ -, the first a letter or a "
                  "digit)");
    }
    if (!is_valid_model_version(version)) {
      throw Error("ModelRepository: version '" + version + "' of '" + name +
                  "' is not a version (a positive integer, no leading zero)");
    }
    auto& versions = models_[name];
    if (!versions.emplace(version, std::move(model)).second) {
      throw Error("ModelRepository: version " + version + " of '" + name + "' is added twice");
    }
    if (default_model_.empty()) default_model_ = std::move(name);
    runs_every_job_ = false;
    return *this;
  }

  /// The model a job that names none goes to. Throws rebound::Error when no model of that name
  /// has been added.
  ModelRepository& set_default_model(const std::string& name) {
    if (!models_.count(name)) {
      throw Error("ModelRepository: the default model '" + name + "' is not in the repository");
    }
    default_model_ = name;
    return *this;
  }

  /// What ServedModels::async_load calls to build a version while the queue runs (it may add a
  /// model too). Without one, live loads are refused (errc::no_loader). Ignored by a repository
  /// that runs_every_job. A repository with a loader may start empty: its queue serves no model
  /// until one is loaded (rebound-server's SageMaker multi-model mode).
  ModelRepository& set_loader(ModelLoader loader) {
    loader_ = std::move(loader);
    return *this;
  }
  const ModelLoader& loader() const { return loader_; }

  /// What a version loaded live is called in listings (ModelVersionInfo::digest), asked on the
  /// loading thread once it loaded (rebound-server's: "sha256:<hex>" of its files). A throw
  /// leaves it empty.
  ModelRepository& set_digester(std::function<std::string(const ModelRef&)> digester) {
    digester_ = std::move(digester);
    return *this;
  }

  /// A bound on the memory the versions loaded hold together, in bytes (0, the default: none).
  /// Before a live load, versions that no route names, no job holds and none is queued for are
  /// unloaded, least recently used first, until the new version fits (as set_sizer estimates it);
  /// when they cannot make room the load fails with `insufficient_memory` (errc::load_failed).
  /// A version counts for Model::memory_bytes() once loaded, else for the estimate. Versions
  /// given at construction count too, but are never refused.
  ModelRepository& set_memory_budget(std::size_t bytes) {
    memory_budget_ = bytes;
    return *this;
  }
  std::size_t memory_budget() const noexcept { return memory_budget_; }

  /// Whether a queue on a store that servers share keeps these models in the store's fleet
  /// configuration and follows the other servers' changes (true, the default; ServedModels). False
  /// keeps them this queue's own on any store: SageMaker's multi-model endpoints, which place
  /// models on each instance themselves.
  ModelRepository& share_models(bool shared) {
    shares_ = shared;
    return *this;
  }

  /// What a version will hold in memory, estimated before it loads (make_model_repository's: the
  /// size of its files). A throw, or no sizer: 0.
  ModelRepository& set_sizer(std::function<std::size_t(const ModelRef&)> sizer) {
    sizer_ = std::move(sizer);
    return *this;
  }

  /// True for a repository made by the one-Model constructor, with nothing added since: its
  /// queue runs every job it takes on that model, whatever model and version the job names (as
  /// a JobQueue built on one Model always did; such a model may even have a name that is no
  /// model name). Otherwise a job runs only on the version it names.
  bool runs_every_job() const noexcept { return runs_every_job_; }

  /// The default model's name; empty while the repository is empty.
  const std::string& default_model() const { return default_model_; }
  bool empty() const { return models_.empty(); }
  /// Versions in all, over all models.
  std::size_t size() const {
    std::size_t n = 0;
    for (const auto& [name, versions] : models_)
      n += versions.size();
    return n;
  }

  /// `name`'s default version (its highest); empty when there is no such model.
  std::string default_version(const std::string& name) const {
    const auto it = models_.find(name);
    return it == models_.end() ? std::string() : it->second.rbegin()->first;
  }

  /// The version `ref` names (an empty name: the default model; an empty version: the model's
  /// default version); nullptr when there is none.
  Model* find(const ModelRef& ref) const {
    const auto it = models_.find(ref.name.empty() ? default_model_ : ref.name);
    if (it == models_.end()) return nullptr;
    if (ref.version.empty()) return it->second.rbegin()->second.get();
    const auto v = it->second.find(ref.version);
    return v == it->second.end() ? nullptr : v->second.get();
  }

  /// Every version, by model name, then version (as numbers).
  std::vector<ModelRef> list() const {
    std::vector<ModelRef> out;
    for (const auto& [name, versions] : models_)
      for (const auto& [version, model] : versions)
        out.push_back({name, version});
    return out;
  }

 private:
  friend class detail::ModelTable;
  // Versions in numeric order: a longer decimal text (no leading zeros) is the larger number.
  struct ByNumber {
    bool operator()(const std::string& a, const std::string& b) const {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    }
  };
  std::map<std::string, std::map<std::string, std::unique_ptr<Model>, ByNumber>> models_;
  std::string default_model_;
  bool runs_every_job_ = false;
  ModelLoader loader_;
  std::function<std::string(const ModelRef&)> digester_;
  std::function<std::size_t(const ModelRef&)> sizer_;
  std::size_t memory_budget_ = 0;
  bool shares_ = true;
};

}  // namespace rebound

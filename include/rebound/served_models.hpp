// ServedModels: the models a running JobQueue serves, changed live: versions loaded and unloaded,
// routes (a default version and canary splits) set, while jobs run.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>

#include "rebound/detail/completion.hpp"
#include "rebound/errc.hpp"
#include "rebound/job.hpp"

namespace rebound {

namespace detail {
class ModelTable;
}

/// Where one version of a model stands.
enum class VersionState {
  loading,   ///< its ModelLoader runs (on the queue's loading thread), then its warm-up
  ready,     ///< it takes new jobs
  failed,    ///< its load failed (ModelVersionInfo::error says why); nothing runs on it
  draining,  ///< being unloaded: new jobs naming it are refused, its queued jobs still run on it
  unloaded,  ///< its Model is released (its metrics are kept)
};

/// "loading", "ready", "failed", "draining", "unloaded".
inline const char* to_string(VersionState s) noexcept {
  switch (s) {
    case VersionState::loading:
      return "loading";
    case VersionState::ready:
      return "ready";
    case VersionState::failed:
      return "failed";
    case VersionState::draining:
      return "draining";
    case VersionState::unloaded:
      return "unloaded";
  }
  return "unknown";
}

/// A share of a model's new jobs sent to one version (a canary): `percent` of 1 to 100.
struct ModelSplit {
  std::string version;
  int percent = 0;
};

/// Where a model's new jobs go when they name no version: `split` versions take their percent
/// (chosen by a hash of the job's tenant and id, so one job always lands on the same version),
/// the default version takes the rest.
struct ModelRoute {
  std::string default_version;
  std::vector<ModelSplit> split;
};

/// One version of a model as the queue holds it now.
struct ModelVersionInfo {
  std::string version;
  VersionState state = VersionState::loading;
  std::chrono::system_clock::time_point loaded_at{};  ///< when it became ready (epoch: never)
  /// What the repository's digester said of a version loaded live (ModelRepository::
  /// set_digester); empty otherwise.
  std::string digest;
  std::size_t queued = 0;   ///< jobs pinned to it waiting in this queue's memory
  std::size_t running = 0;  ///< jobs running on it now in this queue
  /// What it holds in memory while loaded (Model::memory_bytes, else the repository's estimate:
  /// ModelRepository::set_sizer); 0 when neither says, or when not loaded.
  std::size_t memory_bytes = 0;
  std::optional<ErrorInfo> error;  ///< why it failed to load (state failed)
};

/// What an unload does with the jobs pinned to the version that have not run yet (accepted here,
/// or waiting in the store).
enum class QueuedJobs {
  finish,   ///< they run on it: the drain waits for them
  reroute,  ///< they go to the model's route (as a new job would), and are recorded with the
            ///< version that ran them; the drain ends once they were sent on (not run)
};

/// One model: its route, the route's generation (raised by each change: ModelRoute,
/// `set_route`'s `if_generation`) and its versions, ordered as numbers.
struct ModelInfo {
  std::string name;
  ModelRoute route;
  std::uint64_t generation = 0;
  std::vector<ModelVersionInfo> versions;
};

/// The live face of a JobQueue's models (`queue.models()`): what it serves now, and the changes
/// an operator makes while it runs. Built from the ModelRepository the queue was given: each
/// version `ready`, each model's route all to its highest version.
///
/// - `async_load(name, version, token)` loads a version through the repository's ModelLoader
///   (make_model_repository's reads `DIR/<name>/<version>/`) on a thread of the queue's own,
///   never an inference, io or caller's thread: other versions keep running meanwhile. The
///   version is `loading`, then (after Model::warm_up) `ready`, or `failed` with why
///   (errc::load_failed; what the version was serving before keeps serving). A version loaded
///   into a model that has no ready version yet becomes its default. Loading a `ready` version
///   completes at once; a `draining` one stops draining and is `ready` again.
/// - `async_unload(name, version, token)`: the version drains (new jobs naming it are refused
///   with errc::version_unavailable, its queued jobs run on it), then its Model is released and
///   it is `unloaded`; the handler runs then. errc::version_in_route while the model's route names
///   it (change the route first). `async_unload(name, version, QueuedJobs::reroute, token)` sends
///   its jobs that have not started to the model's route instead, here and (on a shared store)
///   on every server, those still waiting in the store included, whenever they are claimed:
///   each runs on the version the route chooses for it, and its record, status and callback
///   name that version (JobOutcome::ran_on_version). An unload under way with its jobs
///   finishing may be asked again with reroute.
/// - `set_route(name, route, if_generation)` changes where a model's new jobs go: every version
///   named must be `ready`; percentages 1 to 100 add up to at most 100.
/// Completion signature of each: `void(boost::system::error_code, ModelInfo)` (the model after
/// the change, or as it stands when refused). Besides the errors above: model_not_found (no such
/// model; for a load, a name that is not a model name), version_unavailable (a load: a version
/// that is not one, or a model being retired; an unload: no such version, or one loading),
/// no_loader, shutting_down (the queue stopped first); an unload whose drain a load stopped
/// completes with boost::asio::error::operation_aborted.
///
/// Jobs accepted before a change keep the version they were pinned to: a job, from its
/// acceptance until it ran, holds its version, and so does a batch. A drain also waits for every
/// job this queue parked in the store (JobQueueOptions::prefetch), and for each holder of the
/// version's Model (`JobQueue::model()`'s answer too: hold it briefly).
///
/// On a store that servers share (FleetStore::model_configs answers: RedisJobStore, and the
/// MemoryJobStore between the queues built on it), the models are the fleet's, unless the
/// repository says otherwise (ModelRepository::share_models). A queue that can load (a loader)
/// reads the store's model configs twice a second on its pump's thread and follows them: versions
/// loaded or unloaded through any queue are loaded or drained here, a route set anywhere is applied
/// here with its generation, a model retired anywhere is retired here. `set_route` writes the store
/// first (a compare-and-set on the config last read: a route changed elsewhere since
/// `if_generation` is errc::route_changed, a store that fails errc::store_unavailable; the call
/// makes that round trip on the caller's thread), then applies it; loads, unloads and retirements
/// are written at the next pass after they take effect here. At its start a queue takes the fleet's
/// config as it stands (its own versions the fleet does not serve are unloaded; models the fleet
/// lacks are added). Its claims leave the jobs of the fleet's versions it has not ready to the
/// others (JobLeaseStore::claim_jobs_except), and a route naming a version not ready here sends
/// that share to the route's default until it is. A fleet's version this queue unloaded for its
/// memory budget (or had no room for) is loaded back when the store has its jobs waiting a second
/// unclaimed (FleetStore::waiting_versions), room made as for any load. A job of a version no
/// server serves, claimed from the store, ends `version_unavailable`.
///
/// A queue built on one Model (ModelRepository::runs_every_job) serves
/// that model only: it has no loader. A load runs to its end (a ModelLoader is not
/// interrupted): the queue's destructor waits for one under way.
///
/// Thread-safety: every member may be called from any thread.
///
/// Example (a new version canaried at 10 %, then promoted, then the old one unloaded):
///   auto& models = queue.models();
///   models.async_load("iris", "2", boost::asio::use_future).get();  // throws if it failed
///   (void)models.set_route("iris", {"1", {{"2", 10}}});
///   ...
///   (void)models.set_route("iris", {"2", {}});
///   models.async_unload("iris", "1", boost::asio::use_future).get();  // after v1's jobs ran
class ServedModels {
 public:
  ServedModels(const ServedModels&) = delete;
  ServedModels& operator=(const ServedModels&) = delete;

  /// Every model, by name.
  std::vector<ModelInfo> list() const;
  /// One model; nullopt when it is not served.
  std::optional<ModelInfo> find(const std::string& name) const;
  /// The model a job that names none goes to.
  std::string default_model() const;
  /// Whether versions can be loaded live: the repository has a ModelLoader (and is not a
  /// single Model's, which serves that Model alone).
  bool loads() const;

  template <typename CompletionToken>
  auto async_load(std::string name, std::string version, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, ModelInfo)>(
        [this](auto handler, std::string n, std::string v) {
          start_load(std::move(n), std::move(v),
                     detail::Completion<ModelInfo>(std::move(handler), executor_, live_));
        },
        token, std::move(name), std::move(version));
  }

  template <typename CompletionToken>
  auto async_unload(std::string name, std::string version, CompletionToken&& token) {
    return async_unload(std::move(name), std::move(version), QueuedJobs::finish,
                        std::forward<CompletionToken>(token));
  }

  template <typename CompletionToken>
  auto async_unload(std::string name, std::string version, QueuedJobs queued,
                    CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, ModelInfo)>(
        [this, queued](auto handler, std::string n, std::string v) {
          start_unload(std::move(n), std::move(v), queued,
                       detail::Completion<ModelInfo>(std::move(handler), executor_, live_));
        },
        token, std::move(name), std::move(version));
  }

  /// Retires the model `name`: its route is emptied (a job that names it and no version is refused
  /// with errc::version_unavailable), every version drains as async_unload's, and the handler
  /// runs once none is left (a later async_load brings it back). Refused with
  /// errc::model_not_found, or errc::version_unavailable while a version of it is loading.
  template <typename CompletionToken>
  auto async_unload_model(std::string name, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, ModelInfo)>(
        [this](auto handler, std::string n) {
          start_unload_model(std::move(n),
                             detail::Completion<ModelInfo>(std::move(handler), executor_, live_));
        },
        token, std::move(name));
  }

  /// Sets `name`'s route. `if_generation` (0: any) must be the model's generation now, else
  /// errc::route_changed (another change came first). Otherwise errc::model_not_found,
  /// errc::version_unavailable (a version named is not ready), errc::invalid_route. `out`, when
  /// given, receives the model as it stands after the call.
  [[nodiscard]] boost::system::error_code set_route(const std::string& name, ModelRoute route,
                                                    std::uint64_t if_generation = 0,
                                                    ModelInfo* out = nullptr);

 private:
  friend class JobQueue;
  ServedModels(detail::ModelTable& table, boost::asio::any_io_executor executor,
               detail::LiveCount live)
      : table_(table), executor_(std::move(executor)), live_(std::move(live)) {}
  void start_load(std::string name, std::string version, detail::Completion<ModelInfo> done);
  void start_unload(std::string name, std::string version, QueuedJobs queued,
                    detail::Completion<ModelInfo> done);
  void start_unload_model(std::string name, detail::Completion<ModelInfo> done);

  detail::ModelTable& table_;
  boost::asio::any_io_executor executor_;
  detail::LiveCount live_;
};

}  // namespace rebound

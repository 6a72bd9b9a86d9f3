// The ModelTable: the versions a JobQueue serves now, their states and each model's route, changed
// live (ServedModels is its public face). Every submission asks it which version a job runs on,
// every batch which Model runs it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "rebound/detail/completion.hpp"
#include "rebound/errc.hpp"
#include "rebound/log.hpp"
#include "rebound/model.hpp"
#include "rebound/model_repository.hpp"
#include "rebound/served_models.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound::detail {

/// What one version ran, kept for as long as the queue (its metrics outlive an unload), and the
/// jobs of it taken from the work queue and not yet through the batch runner.
struct VersionStats {
  ModelRef ref;
  std::atomic<std::uint64_t> succeeded{0}, failed{0}, inference_us{0};
  std::atomic<std::size_t> taken{0};
};

/// Thread-safe. Lock order: a caller may hold the work queue's lock when it calls `key_of` or
/// `note_taken` (they take this table's lock); the table never calls the work queue
/// (`queued_for`) under its own lock.
class ModelTable {
 public:
  ModelTable(ModelRepository repository, Logger logger,
             std::function<std::chrono::system_clock::time_point()> clock);
  ~ModelTable();
  ModelTable(const ModelTable&) = delete;
  ModelTable& operator=(const ModelTable&) = delete;

  /// Set once, before the queue runs: `queued` counts the jobs waiting in the work queue by
  /// batch key (key_of), `parked` the jobs this queue parked in the store.
  void set_queued(std::function<std::vector<std::size_t>(const std::vector<const void*>&)> queued,
                  std::function<std::size_t()> parked) {
    queued_ = std::move(queued);
    parked_ = std::move(parked);
  }

  /// The store whose model configs this table follows (FleetStore::model_configs), set once
  /// before the queue runs. Followed only by a table that can load (loads()), and only when the
  /// store shares them (its first answer says).
  void set_fleet(FleetStore* fleet) { fleet_ = fleet; }

  /// On the pump's thread, at most twice a second (and once before the first claim): what
  /// another server of the store changed is followed here (versions loaded or drained, the
  /// route), and what changed here is written for the others (versions loaded or unloaded, a
  /// model retired, a new model's first route). A store that fails is asked again at the next
  /// pass. Without a shared store, nothing.
  void sync_fleet();
  /// True once the store answered that it shares model configs (and this table follows them).
  bool follows_fleet() const noexcept { return fleet_mode_ == FleetMode::shared; }

  /// The versions the fleet serves that this table has not ready (loading or failed here): the
  /// store's claims leave their jobs to the servers that have them (claim_jobs_except).
  std::vector<ModelRef> not_served() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return not_served_;
  }

  /// ModelRepository::runs_every_job of the repository it was built from: then it never changes
  /// (no loader, one version that its route names).
  bool runs_every_job() const noexcept { return runs_every_job_; }
  /// The model a job that names none goes to (fixed when built).
  const std::string& default_model() const noexcept { return default_model_; }
  /// The versions it was built with (ModelReadiness warms them up).
  std::vector<std::pair<ModelRef, std::weak_ptr<Model>>> first_versions() const;

  /// A submission's version: `ref` filled in (an empty name: the default model; an empty
  /// version: its route's choice for `tenant` and `id`; no id, an invocation: in turn). The
  /// version must be ready. On a refusal `model` is null and `error`, `reason` and `field` say
  /// why.
  struct Choice {
    std::shared_ptr<Model> model;
    errc error{};
    ErrorInfo reason;
    const char* field = "model";
  };
  Choice choose(ModelRef& ref, std::string_view tenant, std::string_view id);

  /// The Model of a version that runs jobs (ready, or draining), with its stats; empty otherwise.
  struct Lease {
    std::shared_ptr<Model> model;
    std::shared_ptr<VersionStats> stats;
  };
  Lease acquire(const ModelRef& ref) const;
  /// The Model of `name`'s route's default version (empty name: the default model), when ready.
  std::shared_ptr<Model> default_of(const std::string& name) const;
  /// True when the model `name` is served (in any state).
  bool has_model(const std::string& name) const;

  /// True while some version is unloaded with its jobs sent to the route (QueuedJobs::reroute),
  /// here or by the fleet (made false again at the next sync or eviction once none is): only then
  /// does the batch runner ask `rerouted`. A hint, read without the lock.
  bool rerouting() const noexcept { return rerouting_.load(std::memory_order_relaxed); }
  /// Whether the jobs of `ref` go to its model's route instead (it was unloaded, or is draining,
  /// with QueuedJobs::reroute, here or by the fleet; a version ready here again runs its own).
  bool rerouted(const ModelRef& ref) const;
  /// A job of a rerouted version: `ref` becomes the version its model's route chooses for
  /// `tenant` and `id` (as `choose` does for a new job), with that version's Model; nothing (and
  /// `ref` unchanged) when no version is ready.
  Lease reroute(ModelRef& ref, std::string_view tenant, std::string_view id);

  /// The batch key of a version: its Model while loaded (what a WorkItem holding it gives), else
  /// null.
  const void* key_of(const ModelRef& ref) const;
  /// Whether live loads can be made (a loader, a queue that does not run every job on one Model).
  bool loads() const noexcept { return static_cast<bool>(loader_); }
  /// A version's stats (null for one never known).
  std::shared_ptr<VersionStats> stats_of(const ModelRef& ref) const;

  // ServedModels.
  std::vector<ModelInfo> list() const;
  std::optional<ModelInfo> find(const std::string& name) const;
  void load(const std::string& name, const std::string& version, Completion<ModelInfo> done);
  /// `reroute`: the version's jobs not yet run (here, and those waiting in the store, whoever
  /// claims them) go to the model's route instead of running on it (QueuedJobs::reroute).
  void unload(const std::string& name, const std::string& version, bool reroute,
              Completion<ModelInfo> done);
  /// Every version of `name` drains and is unloaded, and its route is emptied (new jobs for it
  /// are refused); `done` once none is left.
  void unload_model(const std::string& name, Completion<ModelInfo> done);
  boost::system::error_code set_route(const std::string& name, ModelRoute route,
                                      std::uint64_t if_generation, ModelInfo* out);

  /// Ends the drains that have nothing left: their versions' Models are released. Called by the
  /// pump at each pass, and after an unload.
  void settle_drains();

  /// The per-version metrics as Prometheus text (rebound_model_jobs_completed_total,
  /// rebound_model_inference_seconds_total, rebound_model_versions).
  std::string metrics_text() const;

  /// No load starts from now on; a load under way is waited for; loads waiting end
  /// errc::shutting_down, as do drains not finished.
  void stop();

 private:
  // Log lines made under the lock, written once it is released (a sink may call the queue).
  using Lines = std::vector<std::pair<const char*, nlohmann::json>>;
  struct Version {
    std::shared_ptr<Model> model;
    VersionState state = VersionState::loading;
    std::chrono::system_clock::time_point loaded_at{};
    std::optional<ErrorInfo> error;
    std::string digest;
    std::shared_ptr<VersionStats> stats = std::make_shared<VersionStats>();
    std::vector<Completion<ModelInfo>> loads, unloads;  // waiting for the load, the drain
    // With a shared store: whether the fleet's config lists it (as last read or written), and a
    // change made here that the fleet is still to be told of.
    bool shared = false;
    enum class Pending { none, add, remove } pending = Pending::none;
    std::chrono::system_clock::time_point unloaded_at{};  // when it last became `unloaded`
    std::size_t bytes = 0;                                // what it holds, for the budget
    bool fleet_load = false;  // its load was the fleet's (sync_fleet), not asked of this queue
    std::chrono::system_clock::time_point retry_at{};  // a fleet's version failed or evicted here
    mutable std::uint64_t last_used = 0;               // tick_ when a job last chose it
    // Loaded back only when the store has its jobs waiting (load_on_demand), not once a minute:
    // evicted here for the memory budget, or its load found no room in it.
    bool on_demand = false;
    // Unloaded with QueuedJobs::reroute (here, or by the fleet): its jobs not yet run go to the
    // route. Cleared when it is ready again.
    bool reroute = false;
  };
  // Versions in numeric order: a longer decimal text (no leading zeros) is the larger number.
  struct ByNumber {
    bool operator()(const std::string& a, const std::string& b) const {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    }
  };
  struct Entry {
    std::map<std::string, Version, ByNumber> versions;
    ModelRoute route;
    std::uint64_t generation = 1;
    std::vector<Completion<ModelInfo>> unloads;  // unload_model's, once no version is left
    // With a shared store: the fleet's config as last read or written (the store's generation of
    // it, its versions, its route and the route's own generation: `generation` above follows
    // the route's, so that a load elsewhere does not fail an operator's If-Match), and changes made
    // here to write: the route this table chose itself (a new model's first version), a retirement.
    std::uint64_t fleet_generation = 0, fleet_route_generation = 0;
    std::set<std::string, ByNumber> fleet_versions;
    std::set<std::string, ByNumber> fleet_rerouted;  // the fleet's versions unloaded with reroute
    ModelRoute fleet_route;
    bool route_pending = false, retire_pending = false;
    bool unreadable = false;  // the fleet's config of it could not be read: never written over
  };

  // The most versions a model's config lists as rerouted (the newest are kept).
  static constexpr std::size_t max_rerouted = 100;

  const Version* version_locked(const ModelRef& ref) const;
  ModelInfo info_locked(const std::string& name, const Entry& entry) const;
  const std::string& pick_locked(const Entry& entry, std::string_view tenant, std::string_view id);
  boost::system::error_code check_route_locked(const Entry& entry, const ModelRoute& route,
                                               std::uint64_t if_generation) const;
  void route_set_locked(const std::string& name, Entry& entry, ModelRoute route, Lines& lines);
  void run_loads();  // the loading thread
  void finish_load(const ModelRef& ref, std::unique_ptr<Model> model,
                   std::optional<ErrorInfo> error, std::string digest, std::size_t bytes);
  // The memory budget: what a version weighs (its Model's word, else the sizer's estimate), and
  // room made for `need` more bytes by unloading versions nobody uses, least recently used first;
  // why not when it cannot be made.
  std::size_t weigh(const ModelRef& ref, const Model* model) const;
  std::optional<ErrorInfo> make_room(const ModelRef& ref, std::size_t need);

  // A shared store's config: written, read (false: not one of ours to follow).
  static std::string config_text(const ModelRoute& route, std::uint64_t generation,
                                 const std::set<std::string, ByNumber>& versions,
                                 const std::set<std::string, ByNumber>& rerouted);
  static bool read_config(const std::string& text, ModelRoute& route, std::uint64_t& generation,
                          std::set<std::string, ByNumber>& versions,
                          std::set<std::string, ByNumber>& rerouted);
  bool rerouted_locked(const Entry& entry, const std::string& version) const;
  // One read of the fleet's configs, followed, and this table's changes written; true when a
  // write found the store changed (sync_now then reads and writes again).
  bool sync_once();
  bool publish_fleet();
  // An operator's change (a load that ended, an unload, a retirement) written at once, on the
  // caller's thread, so that the store has the changes in the order they were made.
  void sync_now();
  // The fleet's versions this server lacks for its budget (Version::on_demand) whose jobs wait in
  // the store with nobody to claim them: loaded, as the budget allows. On the pump's thread.
  void load_on_demand();
  // Whether `version` of `entry` is to be loaded when its jobs wait (load_on_demand), now.
  bool demanded_locked(const Entry& entry, const std::string& version,
                       std::chrono::system_clock::time_point now) const;
  void note_not_served_locked();

  const Logger logger_;
  const std::function<std::chrono::system_clock::time_point()> clock_;
  std::function<std::vector<std::size_t>(const std::vector<const void*>&)> queued_;
  std::function<std::size_t()> parked_;
  void write(Lines& lines, LogLevel level = LogLevel::info) const {
    for (auto& [event, fields] : lines)
      logger_.log(level, event, fields);
  }
  // Queued counts for `keys`, outside the lock.
  std::vector<std::size_t> queued_for(const std::vector<const void*>& keys) const {
    return queued_ ? queued_(keys) : std::vector<std::size_t>(keys.size(), 0);
  }
  const bool runs_every_job_;
  const std::string default_model_;
  const ModelLoader loader_;
  const std::function<std::string(const ModelRef&)> digester_;
  const std::function<std::size_t(const ModelRef&)> sizer_;
  const std::size_t budget_;  // bytes; 0: none
  std::vector<std::pair<ModelRef, std::weak_ptr<Model>>> first_;

  mutable std::mutex mutex_;
  std::map<std::string, Entry> models_;
  std::atomic<std::uint64_t> turn_{0};  // invocations' route choices
  mutable std::uint64_t tick_ = 0;      // under mutex_: orders versions by their last use
  std::atomic<bool> draining_{false};   // a hint: some version drains
  std::atomic<bool> rerouting_{false};  // a hint: some version is rerouted

  // The loading thread and what it is to load, started at the first load.
  std::deque<ModelRef> to_load_;  // under mutex_
  std::condition_variable load_wake_;
  std::thread loading_;
  bool stopped_ = false;  // under mutex_

  // Following a shared store: unknown until its first answer, then whether it shares configs.
  FleetStore* fleet_ = nullptr;
  enum class FleetMode { unknown, shared, own };
  std::atomic<FleetMode> fleet_mode_{FleetMode::unknown};
  std::mutex sync_mutex_;  // one sync at a time (taken before mutex_, never under it)
  std::chrono::system_clock::time_point last_sync_{};  // under sync_mutex_
  std::vector<ModelRef> not_served_;                   // under mutex_
  std::map<std::string, std::uint64_t> unreadable_;    // (logged once a generation)
  const bool shares_;                                  // ModelRepository::share_models
  std::chrono::milliseconds demand_wait_{1000};        // how long jobs wait before a load on demand
};

}  // namespace rebound::detail

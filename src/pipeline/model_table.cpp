#include "model_table.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <random>
#include <set>

#include "common/job_rules.hpp"
#include "rebound/error.hpp"

namespace rebound::detail {

namespace {

// A job's place on its model's route: 0 to 99, the same for the same tenant and id (FNV-1a over
// both, then a 64-bit finaliser so that the low digits are spread evenly).
int route_bucket(std::string_view tenant, std::string_view id) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  const auto mix = [&h](std::string_view s) {
    for (const unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
  };
  mix(tenant);
  mix(std::string_view("\x1f", 1));
  mix(id);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return static_cast<int>(h % 100);
}

// A label value as the Prometheus text format writes it (a model named by its Model::name(),
// served alone, may hold anything).
std::string label_value(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

bool same_route(const ModelRoute& a, const ModelRoute& b) {
  return a.default_version == b.default_version &&
         std::equal(a.split.begin(), a.split.end(), b.split.begin(), b.split.end(),
                    [](const ModelSplit& x, const ModelSplit& y) {
                      return x.version == y.version && x.percent == y.percent;
                    });
}

bool in_route(const ModelRoute& route, const std::string& version) {
  if (route.default_version == version) return true;
  for (const ModelSplit& s : route.split)
    if (s.version == version) return true;
  return false;
}

}  // namespace

ModelTable::ModelTable(ModelRepository repository, Logger logger,
                       std::function<std::chrono::system_clock::time_point()> clock)
    : logger_(std::move(logger)),
      clock_(std::move(clock)),
      runs_every_job_(repository.runs_every_job()),
      default_model_(repository.default_model()),
      loader_(repository.runs_every_job() ? ModelLoader() : repository.loader()),
      digester_(repository.digester_),
      sizer_(repository.sizer_),
      budget_(repository.memory_budget_),
      shares_(repository.shares_) {
  std::random_device seed;
  demand_wait_ = std::chrono::milliseconds(1000 + seed() % 2000);
  if (repository.empty() && !repository.loader()) {
    throw Error("JobQueue: the model repository is empty, and has no loader to load one");
  }
  const auto now = clock_();
  for (auto& [name, versions] : repository.models_) {
    Entry& entry = models_[name];
    for (auto& [version, model] : versions) {
      Version& v = entry.versions[version];
      v.model = std::shared_ptr<Model>(std::move(model));
      v.state = VersionState::ready;
      v.loaded_at = now;
      v.stats->ref = {name, version};
      v.bytes = weigh({name, version}, v.model.get());
      first_.push_back({{name, version}, v.model});
    }
    entry.route.default_version = entry.versions.rbegin()->first;
  }
}

ModelTable::~ModelTable() {
  stop();
}

std::vector<std::pair<ModelRef, std::weak_ptr<Model>>> ModelTable::first_versions() const {
  return first_;
}

const ModelTable::Version* ModelTable::version_locked(const ModelRef& ref) const {
  const auto m = models_.find(ref.name);
  if (m == models_.end()) return nullptr;
  const auto v = m->second.versions.find(ref.version);
  return v == m->second.versions.end() ? nullptr : &v->second;
}

const std::string& ModelTable::pick_locked(const Entry& entry, std::string_view tenant,
                                           std::string_view id) {
  const ModelRoute& route = entry.route;
  if (route.split.empty()) return route.default_version;
  int bucket = id.empty() ? static_cast<int>(turn_.fetch_add(1, std::memory_order_relaxed) % 100)
                          : route_bucket(tenant, id);
  for (const ModelSplit& s : route.split) {
    if (bucket < s.percent) return s.version;
    bucket -= s.percent;
  }
  return route.default_version;
}

ModelTable::Choice ModelTable::choose(ModelRef& ref, std::string_view tenant, std::string_view id) {
  Choice c;
  if (ref.name.empty()) ref.name = default_model_;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto m = models_.find(ref.name);
  if (m == models_.end()) {
    c.error = errc::model_not_found;
    c.reason = {"model_not_found", "No model named '" + ref.name + "'."};
    return c;
  }
  const Entry& entry = m->second;
  const bool routed = ref.version.empty();
  if (routed) ref.version = pick_locked(entry, tenant, id);
  const auto v = entry.versions.find(ref.version);
  if (v != entry.versions.end() && v->second.state == VersionState::ready) {
    c.model = v->second.model;
    v->second.last_used = ++tick_;
    return c;
  }
  if (routed) {
    // A route that names a version not ready here (a fleet's route, followed before this server
    // has loaded what it names): its share goes to the route's default, else to a version of
    // the split, else to the highest version ready, until it is.
    const auto ready_here = [&](const std::string& version) {
      const auto it = entry.versions.find(version);
      return it != entry.versions.end() && it->second.state == VersionState::ready ? &it->second
                                                                                   : nullptr;
    };
    const Version* instead = ready_here(entry.route.default_version);
    const std::string* named = &entry.route.default_version;
    for (auto s = entry.route.split.begin(); !instead && s != entry.route.split.end(); ++s) {
      instead = ready_here(s->version);
      named = &s->version;
    }
    for (auto it = entry.versions.rbegin(); !instead && it != entry.versions.rend(); ++it) {
      if (it->second.state == VersionState::ready) {
        instead = &it->second;
        named = &it->first;
      }
    }
    if (instead) {
      ref.version = *named;
      c.model = instead->model;
      instead->last_used = ++tick_;
      return c;
    }
  }
  std::string served;
  std::size_t ready = 0;
  for (const auto& [version, info] : entry.versions) {
    if (info.state != VersionState::ready) continue;
    served += (served.empty() ? "'" : ", '") + version + "'";
    ++ready;
  }
  c.error = errc::version_unavailable;
  c.field = "version";
  if (routed) {
    c.reason = {"version_unavailable", "The model '" + ref.name + "' has no version ready yet."};
  } else {
    const char* state = v == entry.versions.end() ? "not served" : to_string(v->second.state);
    c.reason = {
        "version_unavailable",
        "Version '" + ref.version + "' of the model '" + ref.name + "' is " + state +
            (ready == 0 ? std::string("; no version is ready.") : "; ready: " + served + ".")};
  }
  return c;
}

bool ModelTable::rerouted_locked(const Entry& entry, const std::string& version) const {
  const auto v = entry.versions.find(version);
  if (v != entry.versions.end() && v->second.state == VersionState::ready) return false;
  return (v != entry.versions.end() && v->second.reroute) ||
         entry.fleet_rerouted.count(version) > 0;
}

bool ModelTable::rerouted(const ModelRef& ref) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto m = models_.find(ref.name);
  return m != models_.end() && rerouted_locked(m->second, ref.version);
}

ModelTable::Lease ModelTable::reroute(ModelRef& ref, std::string_view tenant, std::string_view id) {
  ModelRef to{ref.name, ""};
  Choice c = choose(to, tenant, id);  // the route's version for it, as a new job's
  if (!c.model || to.version == ref.version) return {};
  ref = to;
  return {std::move(c.model), stats_of(to)};
}

ModelTable::Lease ModelTable::acquire(const ModelRef& ref) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Version* v = version_locked(ref);
  if (!v || !v->model || (v->state != VersionState::ready && v->state != VersionState::draining)) {
    return {};
  }
  v->last_used = ++tick_;
  return {v->model, v->stats};
}

std::shared_ptr<Model> ModelTable::default_of(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto m = models_.find(name.empty() ? default_model_ : name);
  if (m == models_.end()) return nullptr;
  const Version* v = version_locked({m->first, m->second.route.default_version});
  return v && v->state == VersionState::ready ? v->model : nullptr;
}

bool ModelTable::has_model(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return models_.count(name) > 0;
}

const void* ModelTable::key_of(const ModelRef& ref) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Version* v = version_locked(ref);
  return v ? v->model.get() : nullptr;
}

std::shared_ptr<VersionStats> ModelTable::stats_of(const ModelRef& ref) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Version* v = version_locked(ref);
  return v ? v->stats : nullptr;
}

ModelInfo ModelTable::info_locked(const std::string& name, const Entry& entry) const {
  ModelInfo info;
  info.name = name;
  info.route = entry.route;
  info.generation = entry.generation;
  for (const auto& [version, v] : entry.versions) {
    ModelVersionInfo out;
    out.version = version;
    out.state = v.state;
    out.loaded_at = v.loaded_at;
    out.error = v.error;
    out.digest = v.digest;
    out.running = v.stats->taken.load(std::memory_order_relaxed);
    if (v.state == VersionState::ready || v.state == VersionState::draining)
      out.memory_bytes = v.bytes;
    info.versions.push_back(std::move(out));
  }
  return info;
}

std::vector<ModelInfo> ModelTable::list() const {
  std::vector<ModelInfo> out;
  std::vector<const void*> keys;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, entry] : models_) {
      out.push_back(info_locked(name, entry));
      for (const auto& [version, v] : entry.versions)
        keys.push_back(v.model.get());
    }
  }
  // Queued counts from the work queue, in one walk, outside this table's lock (the lock order).
  const std::vector<std::size_t> queued = queued_for(keys);
  std::size_t k = 0;
  for (ModelInfo& m : out) {
    for (ModelVersionInfo& v : m.versions) {
      v.queued = keys[k] ? queued[k] : 0;
      ++k;
    }
  }
  return out;
}

std::optional<ModelInfo> ModelTable::find(const std::string& name) const {
  std::optional<ModelInfo> out;
  std::vector<const void*> keys;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto m = models_.find(name);
    if (m == models_.end()) return std::nullopt;
    out = info_locked(name, m->second);
    for (const auto& [version, v] : m->second.versions)
      keys.push_back(v.model.get());
  }
  const std::vector<std::size_t> queued = queued_for(keys);
  for (std::size_t k = 0; k < keys.size(); ++k)
    out->versions[k].queued = keys[k] ? queued[k] : 0;
  return out;
}

void ModelTable::load(const std::string& name, const std::string& version,
                      Completion<ModelInfo> done) {
  ModelInfo info;
  boost::system::error_code ec;
  Lines lines;
  std::vector<Completion<ModelInfo>> stopped_drain;
  const bool from_fleet = !done;  // (sync_fleet's loads wait for nothing)
  // An operator's load, on a queue that may follow a fleet (its store's first answer may not
  // have come yet): the fleet is to serve the version, whatever this queue last read of it.
  const bool tell = !from_fleet && loader_ && shares_ && fleet_ && fleet_mode_ != FleetMode::own;
  bool tell_now = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto m = models_.find(name);
    if (m != models_.end()) info = info_locked(name, m->second);
    if (!loader_) {
      ec = errc::no_loader;
    } else if (stopped_) {
      ec = errc::shutting_down;
    } else if (!is_valid_model_name(name)) {
      ec = errc::model_not_found;
    } else if (!is_valid_model_version(version)) {
      ec = errc::version_unavailable;
    } else if (const auto retiring = models_.find(name);
               retiring != models_.end() && !retiring->second.unloads.empty()) {
      ec = errc::version_unavailable;  // being retired (unload_model): load it once it is gone
    } else {
      Entry& entry = models_[name];
      Version& v = entry.versions[version];
      v.stats->ref = {name, version};
      if (tell) {
        v.pending = Version::Pending::add;  // written once ready (at once, when it is)
        v.fleet_load = false;
      }
      switch (v.state) {
        case VersionState::ready:
          tell_now = tell;
          break;  // answered at once
        case VersionState::loading:
          // A version new to the table (it starts `loading`, no load queued for it yet), or one
          // whose load is under way: the handler waits for that load.
          if (v.loads.empty()) {
            to_load_.push_back({name, version});
            v.fleet_load = from_fleet && !tell;
            lines.push_back({"model_loading", {{"model", name}, {"version", version}}});
          }
          v.loads.push_back(std::move(done));
          break;
        case VersionState::draining:
          v.state = VersionState::ready;  // a load stops the drain: it serves again
          v.reroute = false;
          tell_now = tell;
          stopped_drain = std::move(v.unloads);
          v.unloads.clear();
          lines.push_back({"model_drain_stopped", {{"model", name}, {"version", version}}});
          break;
        case VersionState::failed:
        case VersionState::unloaded:
          v.state = VersionState::loading;
          v.reroute = false;  // (served again: its jobs are its own, whether the load succeeds)
          v.error.reset();
          v.fleet_load = from_fleet;
          to_load_.push_back({name, version});
          v.loads.push_back(std::move(done));
          lines.push_back({"model_loading", {{"model", name}, {"version", version}}});
          break;
      }
      info = info_locked(name, entry);
      if (!done && !loading_.joinable()) loading_ = std::thread([this] { run_loads(); });
      load_wake_.notify_one();
    }
  }
  write(lines);
  if (tell_now) {
    sync_now();  // the fleet has it before the caller hears of it
    if (const auto now = find(name)) info = *now;
  }
  for (auto& u : stopped_drain)
    u(boost::asio::error::operation_aborted, info);
  if (done) done(ec, std::move(info));  // (else it waits for the load)
}

void ModelTable::run_loads() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    load_wake_.wait(lock, [this] { return stopped_ || !to_load_.empty(); });
    if (stopped_) return;
    const ModelRef ref = to_load_.front();
    to_load_.pop_front();
    lock.unlock();
    std::unique_ptr<Model> model;
    std::optional<ErrorInfo> error;
    const auto began = std::chrono::steady_clock::now();
    const std::size_t estimate = weigh(ref, nullptr);  // (a directory walk, on this thread)
    try {
      if (budget_ > 0) error = make_room(ref, estimate);
      if (error) throw std::runtime_error(error->message);
      model = loader_(ref);
      if (!model) throw Error("the model loader returned no model");
      // A backend that loads in the background: waited for here, on this thread.
      while (!model->ready()) {
        {
          std::lock_guard<std::mutex> check(mutex_);
          if (stopped_) throw Error("the queue stopped while the model was loading");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const std::bad_alloc&) {
      error = ErrorInfo{"insufficient_memory", "There is not enough memory to load the model."};
      model.reset();
    } catch (const std::exception& e) {
      if (!error) error = ErrorInfo{"load_failed", e.what()};
      model.reset();
    } catch (...) {
      error = ErrorInfo{"load_failed", "the model loader failed"};
      model.reset();
    }
    nlohmann::json fields = {{"model", ref.name}, {"version", ref.version}};
    if (model) {
      try {
        model->warm_up();
      } catch (const std::exception& e) {
        fields["warm_up_error"] = e.what();  // warming is an optimisation: it serves all the same
      } catch (...) {
        fields["warm_up_error"] = "unknown error";
      }
    }
    fields["ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now() - began)
                       .count();
    std::string digest;
    if (model && digester_) {
      try {
        digest = digester_(ref);
      } catch (...) {
        // Left out of listings.
      }
    }
    // (For a load that failed, what it was thought to weigh: finish_load's retry time.)
    const std::size_t bytes = model && model->memory_bytes() > 0 ? model->memory_bytes() : estimate;
    if (model && budget_ > 0 && bytes > estimate) {
      // It holds more than was estimated (a Model that says what it holds): room for that, else
      // it goes again.
      error = make_room(ref, bytes);
      if (error) model.reset();
    }
    if (model && budget_ > 0) fields["bytes"] = bytes;
    if (error) {
      fields["error"] = error->message;
      logger_.log(LogLevel::error, "model_load_failed", fields);
    } else {
      if (!digest.empty()) fields["digest"] = digest;
      logger_.log(LogLevel::info, "model_loaded", fields);
    }
    finish_load(ref, std::move(model), std::move(error), std::move(digest), bytes);
    lock.lock();
  }
}

void ModelTable::finish_load(const ModelRef& ref, std::unique_ptr<Model> model,
                             std::optional<ErrorInfo> error, std::string digest,
                             std::size_t bytes) {
  std::vector<Completion<ModelInfo>> waiting;
  ModelInfo info;
  bool tell_fleet = false;
  const boost::system::error_code ec =
      model ? boost::system::error_code() : make_error_code(errc::load_failed);
  const auto now = clock_();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& entry = models_[ref.name];
    Version& v = entry.versions[ref.version];
    if (model) {
      const bool shared = fleet_mode_ == FleetMode::shared;
      v.model = std::shared_ptr<Model>(std::move(model));
      v.state = VersionState::ready;
      v.reroute = false;
      v.loaded_at = now;
      v.error.reset();
      v.digest = std::move(digest);
      v.bytes = bytes;
      v.last_used = ++tick_;  // (not the first to go for the next load)
      v.on_demand = false;
      if (shared && v.fleet_load) {
        if (entry.fleet_generation > 0 && entry.fleet_versions.count(ref.version) == 0) {
          // The fleet unloaded it (or retired the model) while it loaded here: it goes again.
          v.state = VersionState::draining;
          draining_.store(true, std::memory_order_relaxed);
        }
      } else {
        const bool follows = fleet_mode_ != FleetMode::own && shares_ && fleet_;
        if (entry.route.default_version.empty()) {
          // A new model: its first version serves it.
          entry.route.default_version = ref.version;
          ++entry.generation;
          entry.route_pending = follows;
        }
        if (follows && !v.shared) v.pending = Version::Pending::add;  // the fleet serves it too
      }
    } else {
      v.state = VersionState::failed;
      // A fleet's version with no room in the budget waits for its jobs, and then for room (ten
      // seconds between tries; five minutes for one larger than the whole budget); any other
      // failure is tried again in a minute (on demand still, when it was).
      const bool no_room = error && error->code == "insufficient_memory";
      v.on_demand = v.on_demand || no_room;
      v.retry_at = now + (!no_room                         ? std::chrono::seconds(60)
                          : budget_ > 0 && bytes > budget_ ? std::chrono::seconds(300)
                                                           : std::chrono::seconds(10));
      v.error = std::move(error);
      if (v.pending == Version::Pending::add) v.pending = Version::Pending::none;
    }
    tell_fleet = v.pending == Version::Pending::add || entry.route_pending;
    waiting = std::move(v.loads);
    v.loads.clear();
    info = info_locked(ref.name, entry);
  }
  if (tell_fleet) sync_now();  // the fleet has it before the caller hears of it
  for (auto& w : waiting)
    w(ec, info);
}

void ModelTable::unload(const std::string& name, const std::string& version, bool reroute,
                        Completion<ModelInfo> done) {
  // An operator's unload decides on the fleet as it stands (a route set through another server
  // a moment ago names the version, say).
  if (done) sync_now();
  ModelInfo info;
  boost::system::error_code ec;
  bool settle = false;
  const bool asked = static_cast<bool>(done);  // (sync_fleet's own unloads wait for nothing)
  Lines lines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto m = models_.find(name);
    if (m == models_.end()) {
      ec = errc::model_not_found;
    } else {
      Entry& entry = m->second;
      const auto it = entry.versions.find(version);
      if (stopped_) {
        ec = errc::shutting_down;
      } else if (it == entry.versions.end() || it->second.state == VersionState::loading) {
        ec = errc::version_unavailable;
      } else if (in_route(entry.route, version)) {
        ec = errc::version_in_route;
      } else if (!asked && it->second.pending == Version::Pending::add) {
        // The fleet's unload, read before an operator here loaded it again: the load stands.
      } else {
        Version& v = it->second;
        v.on_demand = false;  // (unloaded for good: not loaded back for its jobs)
        if (reroute && !v.reroute) {
          // (A drain under way with its jobs finishing on it sends the rest to the route now.)
          v.reroute = true;
          rerouting_.store(true, std::memory_order_relaxed);
          if (v.state == VersionState::draining)
            lines.push_back({"model_rerouting", {{"model", name}, {"version", version}}});
        }
        switch (v.state) {
          case VersionState::ready:
            v.state = VersionState::draining;
            draining_.store(true, std::memory_order_relaxed);
            lines.push_back({"model_draining",
                             {{"model", name},
                              {"version", version},
                              {"queued", v.reroute ? "reroute" : "finish"}}});
            [[fallthrough]];
          case VersionState::draining:
            v.unloads.push_back(std::move(done));
            settle = true;
            break;
          case VersionState::failed:
            v.state = VersionState::unloaded;
            v.error.reset();
            break;
          case VersionState::unloaded:
          case VersionState::loading:
            break;
        }
        // The fleet unloads it too (a version this server evicted, or failed to load, included);
        // one the fleet was not told of yet stays untold.
        if (v.shared) {
          v.pending = Version::Pending::remove;
        } else if (v.pending == Version::Pending::add) {
          v.pending = Version::Pending::none;
        }
      }
      info = info_locked(name, entry);
    }
  }
  write(lines);
  if (!ec && asked) sync_now();  // the fleet has it before the caller hears of it
  if (settle) return settle_drains();
  done(ec, std::move(info));
}

void ModelTable::unload_model(const std::string& name, Completion<ModelInfo> done) {
  if (done) sync_now();  // decided on the fleet as it stands
  ModelInfo info;
  boost::system::error_code ec;
  Lines lines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto m = models_.find(name);
    if (stopped_) {
      ec = errc::shutting_down;
    } else if (m == models_.end()) {
      ec = errc::model_not_found;
    } else if (runs_every_job_) {
      ec = errc::version_in_route;  // a queue built on one Model serves it for as long as it lives
    } else {
      Entry& entry = m->second;
      for (const auto& [version, v] : entry.versions)
        if (v.state == VersionState::loading) ec = errc::version_unavailable;
      if (!ec) {
        entry.route = ModelRoute{};
        ++entry.generation;
        entry.retire_pending = entry.fleet_generation > 0;  // the fleet retires it too
        for (auto& [version, v] : entry.versions) {
          v.reroute = false;  // (a retired model has no route to send jobs to)
          if (v.state == VersionState::ready) {
            v.state = VersionState::draining;
            lines.push_back({"model_draining", {{"model", name}, {"version", version}}});
          } else if (v.state == VersionState::failed) {
            v.state = VersionState::unloaded;
            v.error.reset();
          }
        }
        entry.unloads.push_back(std::move(done));
        draining_.store(true, std::memory_order_relaxed);
      }
      info = info_locked(name, entry);
    }
  }
  write(lines);
  if (!done) {
    sync_now();  // the fleet retires it too
    return settle_drains();
  }
  done(ec, std::move(info));
}

void ModelTable::settle_drains() {
  if (!draining_.load(std::memory_order_relaxed)) return;
  std::vector<ModelRef> draining;
  std::vector<const void*> keys;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bool models_waiting = false;
    for (const auto& [name, entry] : models_) {
      models_waiting = models_waiting || !entry.unloads.empty();
      for (const auto& [version, v] : entry.versions) {
        if (v.state != VersionState::draining) continue;
        draining.push_back({name, version});
        keys.push_back(v.model.get());
      }
    }
    if (draining.empty() && !models_waiting) {
      draining_.store(false, std::memory_order_relaxed);
      return;
    }
  }
  // Counted outside the lock (the lock order). What holds a draining version: a job accepted for
  // it and not yet run (its WorkItem holds the Model: use_count), a batch of it (the same, or
  // `taken` for jobs claimed from the store), a job claimed from the store and waiting (queued),
  // and any job this queue parked in the store (which may be one of it).
  const std::vector<std::size_t> queued = queued_for(keys);
  const std::size_t parked = parked_ ? parked_() : 0;
  std::vector<std::shared_ptr<Model>> released;  // destroyed outside the lock
  std::vector<std::pair<std::vector<Completion<ModelInfo>>, ModelInfo>> done;
  Lines lines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 0; i < draining.size(); ++i) {
      const ModelRef& ref = draining[i];
      Entry& entry = models_[ref.name];
      Version& v = entry.versions[ref.version];
      if (v.state != VersionState::draining || v.model.get() != keys[i] || queued[i] > 0 ||
          parked > 0 || v.stats->taken.load(std::memory_order_acquire) > 0 ||
          v.model.use_count() > 1) {
        continue;
      }
      released.push_back(std::move(v.model));
      v.model.reset();
      v.state = VersionState::unloaded;
      v.unloaded_at = clock_();
      done.emplace_back(std::move(v.unloads), info_locked(ref.name, entry));
      v.unloads.clear();
      lines.push_back({"model_unloaded", {{"model", ref.name}, {"version", ref.version}}});
    }
    // Whole models unloaded (unload_model): once none of their versions is left.
    for (auto& [name, entry] : models_) {
      if (entry.unloads.empty()) continue;
      const bool left = std::any_of(entry.versions.begin(), entry.versions.end(), [](auto& v) {
        return v.second.state != VersionState::unloaded && v.second.state != VersionState::failed;
      });
      if (left) continue;
      done.emplace_back(std::move(entry.unloads), info_locked(name, entry));
      entry.unloads.clear();
    }
  }
  released.clear();
  write(lines);
  for (auto& [waiting, info] : done)
    for (auto& w : waiting)
      w({}, info);
}

boost::system::error_code ModelTable::check_route_locked(const Entry& entry,
                                                         const ModelRoute& route,
                                                         std::uint64_t if_generation) const {
  if (if_generation != 0 && if_generation != entry.generation) return errc::route_changed;
  if (!is_valid_model_version(route.default_version)) return errc::invalid_route;
  std::set<std::string> named{route.default_version};
  int total = 0;
  for (const ModelSplit& s : route.split) {
    if (!is_valid_model_version(s.version) || s.percent < 1 || s.percent > 100 ||
        !named.insert(s.version).second) {
      return errc::invalid_route;
    }
    total += s.percent;
  }
  if (total > 100) return errc::invalid_route;
  for (const std::string& version : named) {
    const auto v = entry.versions.find(version);
    if (v == entry.versions.end() || v->second.state != VersionState::ready) {
      return errc::version_unavailable;
    }
  }
  return {};
}

void ModelTable::route_set_locked(const std::string& name, Entry& entry, ModelRoute route,
                                  Lines& lines) {
  entry.route = std::move(route);
  nlohmann::json split = nlohmann::json::array();
  for (const ModelSplit& s : entry.route.split)
    split.push_back({{"version", s.version}, {"percent", s.percent}});
  lines.push_back({"model_route_set",
                   {{"model", name},
                    {"default_version", entry.route.default_version},
                    {"split", std::move(split)},
                    {"generation", entry.generation}}});
}

boost::system::error_code ModelTable::set_route(const std::string& name, ModelRoute route,
                                                std::uint64_t if_generation, ModelInfo* out) {
  Lines lines;
  boost::system::error_code ec;
  std::uint64_t checked = 0, expected = 0;
  std::set<std::string, ByNumber> versions, rerouted;
  const bool shared = fleet_mode_ == FleetMode::shared;
  // No sync reads the store while this writes it (it would apply what it read before, over this).
  std::unique_lock<std::mutex> syncing(sync_mutex_, std::defer_lock);
  if (shared) syncing.lock();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto m = models_.find(name);
    if (m == models_.end()) return errc::model_not_found;
    Entry& entry = m->second;
    ec = check_route_locked(entry, route, if_generation);
    if (!ec && !shared) {
      ++entry.generation;
      route_set_locked(name, entry, std::move(route), lines);
    } else if (!ec && entry.unreadable) {
      ec = errc::store_unavailable;  // the fleet's record of it is not one this server writes
    } else if (!ec) {
      checked = entry.generation;
      versions = entry.fleet_versions;
      rerouted = entry.fleet_rerouted;
      expected = entry.fleet_generation;
    }
    if (out && (ec || !shared)) *out = info_locked(name, entry);
  }
  if (ec || !shared) {
    write(lines);
    return ec;
  }
  // A fleet's route: written to the store first, on the config this table last read, then applied
  // here; the others follow within a second. Another server's write in between: a route changed
  // since the caller's generation is route_changed (as an If-Match that no longer holds is; with
  // none, the newest route is the one replaced); versions loaded or unloaded meanwhile are kept.
  std::optional<std::uint64_t> written;
  bool retried = false;  // the store held a config this table has not followed yet
  try {
    for (int attempt = 0; !written && attempt < 8; ++attempt) {
      written = fleet_->put_model_config(name, config_text(route, checked + 1, versions, rerouted),
                                         expected);
      if (written) break;
      const auto configs = fleet_->model_configs();
      const ModelConfig* now = nullptr;
      if (configs) {
        for (const ModelConfig& c : *configs)
          if (c.name == name) now = &c;  // (points into `configs`, alive for this iteration)
      }
      ModelRoute their_route;
      std::uint64_t their_generation = 0;
      if (!now || !read_config(now->config, their_route, their_generation, versions, rerouted) ||
          (if_generation != 0 && their_generation != checked)) {
        ec = errc::route_changed;
        break;
      }
      // A version unloaded through another server meanwhile cannot be routed to.
      if (!versions.count(route.default_version) ||
          std::any_of(route.split.begin(), route.split.end(),
                      [&](const ModelSplit& x) { return versions.count(x.version) == 0; })) {
        ec = errc::version_unavailable;
        break;
      }
      checked = their_generation;
      expected = now->generation;
      retried = true;
    }
    if (!written && !ec) ec = errc::route_changed;
  } catch (...) {
    ec = errc::store_unavailable;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& entry = models_[name];
    if (!ec) {
      entry.generation = entry.fleet_route_generation = checked + 1;
      // After a retry the next sync reads the config again, to follow the versions another
      // server changed meanwhile; else it is this table's already.
      if (!retried) entry.fleet_generation = *written;
      entry.fleet_versions = std::move(versions);
      entry.fleet_rerouted = std::move(rerouted);
      if (!entry.fleet_rerouted.empty()) rerouting_.store(true, std::memory_order_relaxed);
      entry.fleet_route = route;
      entry.route_pending = false;
      route_set_locked(name, entry, std::move(route), lines);
    }
    if (out) *out = info_locked(name, entry);
  }
  write(lines);
  return ec;
}

std::size_t ModelTable::weigh(const ModelRef& ref, const Model* model) const {
  if (model && model->memory_bytes() > 0) return model->memory_bytes();
  if (!sizer_) return 0;
  try {
    return sizer_(ref);
  } catch (...) {
    return 0;
  }
}

std::optional<ErrorInfo> ModelTable::make_room(const ModelRef& ref, std::size_t need) {
  struct Candidate {
    ModelRef ref;
    const void* key;
    std::size_t bytes;
    std::uint64_t last_used;
  };
  std::vector<Candidate> candidates;
  std::vector<const void*> keys;
  std::size_t resident = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, entry] : models_) {
      for (const auto& [version, v] : entry.versions) {
        if (v.state != VersionState::ready && v.state != VersionState::draining) continue;
        resident += v.bytes;
        // What may go: ready, named by no route, held by no job or caller, none of it taken.
        if (v.state != VersionState::ready || in_route(entry.route, version) ||
            ModelRef{name, version} == ref || v.model.use_count() > 1 ||
            v.stats->taken.load(std::memory_order_acquire) > 0) {
          continue;
        }
        candidates.push_back({{name, version}, v.model.get(), v.bytes, v.last_used});
        keys.push_back(v.model.get());
      }
    }
  }
  if (resident + need <= budget_) return std::nullopt;
  const std::vector<std::size_t> queued = queued_for(keys);  // (outside the lock)
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (queued[i] > 0) candidates[i].bytes = 0;  // jobs wait for it: it stays
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.last_used < b.last_used; });
  std::vector<ModelRef> evict;
  for (const Candidate& c : candidates) {
    if (resident + need <= budget_) break;
    if (c.bytes == 0) continue;
    evict.push_back(c.ref);
    resident -= c.bytes;
  }
  const auto mib = [](std::size_t b) { return std::to_string((b + (1u << 20) - 1) >> 20); };
  if (resident + need > budget_) {
    return ErrorInfo{"insufficient_memory",
                     "The model memory budget of " + mib(budget_) + " MiB cannot hold '" +
                         ref.name + "/" + ref.version + "' (" + mib(need) +
                         " MiB): " + mib(resident) +
                         " MiB are versions that a route names, a job holds or jobs wait for."};
  }
  Lines lines;
  std::vector<std::shared_ptr<Model>> released;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = clock_();
    for (const ModelRef& e : evict) {
      Entry& entry = models_[e.name];
      const auto v = entry.versions.find(e.version);
      // Checked again under the lock: nothing took it since (a job pinned to it holds its
      // Model; one claimed from the store counts in `taken`).
      if (v == entry.versions.end() || v->second.state != VersionState::ready ||
          in_route(entry.route, e.version) || v->second.model.use_count() > 1 ||
          v->second.stats->taken.load(std::memory_order_acquire) > 0) {
        continue;
      }
      // Released now, since nothing holds it. This server's own: the fleet still serves it (its
      // jobs go to the others meanwhile).
      lines.push_back({"model_evicted",
                       {{"model", e.name},
                        {"version", e.version},
                        {"bytes", v->second.bytes},
                        {"for", ref.name + "/" + ref.version}}});
      released.push_back(std::move(v->second.model));
      v->second.model.reset();
      v->second.state = VersionState::unloaded;
      v->second.unloaded_at = now;
      v->second.on_demand = true;  // (the fleet's: loaded back when its jobs wait)
    }
    note_not_served_locked();
  }
  released.clear();
  write(lines);
  return std::nullopt;
}

std::string ModelTable::config_text(const ModelRoute& route, std::uint64_t generation,
                                    const std::set<std::string, ByNumber>& versions,
                                    const std::set<std::string, ByNumber>& rerouted) {
  nlohmann::json split = nlohmann::json::array();
  for (const ModelSplit& s : route.split)
    split.push_back({{"version", s.version}, {"percent", s.percent}});
  nlohmann::json config = {
      {"route",
       {{"default_version", route.default_version}, {"split", split}, {"generation", generation}}},
      {"versions", versions}};
  if (!rerouted.empty()) config["rerouted"] = rerouted;  // (a config without it: none)
  return config.dump();
}

bool ModelTable::read_config(const std::string& text, ModelRoute& route, std::uint64_t& generation,
                             std::set<std::string, ByNumber>& versions,
                             std::set<std::string, ByNumber>& rerouted) {
  // Written by another server of the store, or by anything else that can write to it: every
  // name and number checked as an operator's own request would be.
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("route") || !j["route"].is_object() ||
      !j.contains("versions") || !j["versions"].is_array() || j["versions"].size() > 1000) {
    return false;
  }
  const nlohmann::json& r = j["route"];
  const auto d = r.find("default_version");
  if (d == r.end() || !d->is_string()) return false;
  const auto g = r.find("generation");
  if (g == r.end() || !g->is_number_unsigned()) return false;
  generation = g->get<std::uint64_t>();
  route = ModelRoute{};
  route.default_version = d->get<std::string>();
  if (!route.default_version.empty() && !is_valid_model_version(route.default_version))
    return false;
  const auto split = r.find("split");
  if (split != r.end()) {
    if (!split->is_array() || split->size() > 100) return false;
    int total = 0;
    for (const nlohmann::json& e : *split) {
      if (!e.is_object() || !e.contains("version") || !e["version"].is_string() ||
          !e.contains("percent") || !e["percent"].is_number_integer()) {
        return false;
      }
      ModelSplit one{e["version"].get<std::string>(), e["percent"].get<int>()};
      if (!is_valid_model_version(one.version) || one.percent < 1 || one.percent > 100)
        return false;
      total += one.percent;
      route.split.push_back(std::move(one));
    }
    if (total > 100 || (route.default_version.empty() && !route.split.empty())) return false;
  }
  versions.clear();
  for (const nlohmann::json& v : j["versions"]) {
    if (!v.is_string() || !is_valid_model_version(v.get<std::string>())) return false;
    versions.insert(v.get<std::string>());
  }
  // The versions unloaded with their jobs sent to the route (QueuedJobs::reroute).
  rerouted.clear();
  if (const auto r = j.find("rerouted"); r != j.end()) {
    if (!r->is_array() || r->size() > 10000) return false;
    for (const nlohmann::json& v : *r) {
      if (!v.is_string() || !is_valid_model_version(v.get<std::string>())) return false;
      if (versions.count(v.get<std::string>()) == 0) rerouted.insert(v.get<std::string>());
    }
    while (rerouted.size() > max_rerouted)  // (the newest are kept, as this server writes them)
      rerouted.erase(rerouted.begin());
  }
  return true;
}

void ModelTable::note_not_served_locked() {
  not_served_.clear();
  const auto now = clock_();
  // The batch runner's hint, made true again only while some version is rerouted (here or by
  // the fleet): set under this lock wherever a mark is set, so never false while one is.
  bool rerouting = false;
  for (const auto& [name, entry] : models_) {
    rerouting = rerouting || !entry.fleet_rerouted.empty();
    for (const auto& [version, v] : entry.versions)
      rerouting = rerouting || v.reroute;
  }
  rerouting_.store(rerouting, std::memory_order_relaxed);
  for (const auto& [name, entry] : models_) {
    for (const std::string& version : entry.fleet_versions) {
      const auto v = entry.versions.find(version);
      if (v == entry.versions.end() ||
          (v->second.state != VersionState::ready && v->second.state != VersionState::draining)) {
        not_served_.push_back({name, version});
      }
    }
    // A version the fleet unloaded, for a minute after this server's drain of it ended: another
    // server may still be draining it, and runs what is left of it.
    for (const auto& [version, v] : entry.versions) {
      if (v.state == VersionState::unloaded && entry.fleet_versions.count(version) == 0 &&
          !rerouted_locked(entry, version) && now - v.unloaded_at < std::chrono::minutes(1)) {
        not_served_.push_back({name, version});
      }
    }
  }
}

void ModelTable::sync_fleet() {
  if (!fleet_ || !loader_ || !shares_ || fleet_mode_ == FleetMode::own) return;
  // An operator's change being written now (sync_now) reads the store too: this pass can go.
  std::unique_lock<std::mutex> syncing(sync_mutex_, std::try_to_lock);
  if (!syncing) return;
  const auto now = clock_();
  if (last_sync_ != std::chrono::system_clock::time_point{} && now >= last_sync_ &&
      now - last_sync_ < std::chrono::milliseconds(500)) {
    return;
  }
  last_sync_ = now;
  sync_once();
  load_on_demand();
}

bool ModelTable::demanded_locked(const Entry& entry, const std::string& version,
                                 std::chrono::system_clock::time_point now) const {
  if (entry.unreadable || !entry.unloads.empty() || entry.retire_pending ||
      entry.fleet_versions.count(version) == 0 || rerouted_locked(entry, version)) {
    return false;
  }
  const auto v = entry.versions.find(version);
  return v != entry.versions.end() && v->second.on_demand &&
         (v->second.state == VersionState::failed || v->second.state == VersionState::unloaded) &&
         v->second.pending != Version::Pending::remove && now >= v->second.retry_at;
}

void ModelTable::load_on_demand() {
  std::vector<ModelRef> candidates;
  const auto now = clock_();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_ || fleet_mode_ != FleetMode::shared) return;
    for (const auto& [name, entry] : models_) {
      for (const std::string& version : entry.fleet_versions)
        if (demanded_locked(entry, version, now)) candidates.push_back({name, version});
    }
  }
  if (candidates.empty()) return;
  // Jobs that waited unclaimed for this table's wait (one to three seconds, drawn at its start, so
  // that the servers lacking a version do not all load it at once): no server that has their
  // version is there to run them (a claim takes what is due every poll, a tenth of a second by
  // default), or those there are behind.
  std::vector<ModelRef> waiting;
  try {
    waiting = fleet_->waiting_versions(candidates, now - demand_wait_);
  } catch (...) {
    return;  // asked again at the next pass
  }
  std::vector<ModelRef> to_load;
  Lines lines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ModelRef& ref : waiting) {
      // (Only what was asked, in the state it was asked in: the store's answer is not trusted
      // further.)
      if (std::find(candidates.begin(), candidates.end(), ref) == candidates.end() ||
          std::find(to_load.begin(), to_load.end(), ref) != to_load.end()) {
        continue;
      }
      // (Checked again: an operator's unload, say, may have come in between.)
      const auto m = models_.find(ref.name);
      if (m == models_.end() || !demanded_locked(m->second, ref.version, now)) continue;
      m->second.versions.find(ref.version)->second.retry_at = now + std::chrono::seconds(10);
      to_load.push_back(ref);
      lines.push_back({"model_demanded", {{"model", ref.name}, {"version", ref.version}}});
    }
  }
  write(lines);
  for (const ModelRef& ref : to_load)
    load(ref.name, ref.version, {});
}

void ModelTable::sync_now() {
  if (fleet_mode_ != FleetMode::shared) return;
  std::lock_guard<std::mutex> syncing(sync_mutex_);
  // A write another server made in between is read, then ours is written on it.
  for (int attempt = 0; attempt < 4 && sync_once(); ++attempt) {
  }
}

bool ModelTable::sync_once() {
  std::optional<std::vector<ModelConfig>> configs;
  try {
    configs = fleet_->model_configs();
  } catch (...) {
    return false;  // asked again at the next pass (the same pass's claims log the trouble)
  }
  if (!configs) {
    fleet_mode_ = FleetMode::own;  // a store of one server: models are this table's own
    return false;
  }
  // At the first answer, the fleet's config is taken as it stands: a version this server loaded
  // at its start that the fleet does not serve is unloaded (load it through any server to add it
  // to all), and the fleet's route replaces the one it started with. Models the fleet never had
  // are added to it.
  const bool first = fleet_mode_ == FleetMode::unknown;
  fleet_mode_ = FleetMode::shared;

  // What the others changed: followed outside the lock (loads and drains take it).
  std::vector<ModelRef> to_load, to_unload, to_reroute;
  Lines lines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::set<std::string> stored;
    for (const ModelConfig& c : *configs) {
      stored.insert(c.name);
      ModelRoute route;
      std::uint64_t route_generation = 0;
      std::set<std::string, ByNumber> versions, rerouted;
      const auto known = models_.find(c.name);
      if (!is_valid_model_name(c.name) ||
          !read_config(c.config, route, route_generation, versions, rerouted)) {
        // Written by something else (or a newer version): left alone, and never written over.
        const auto said = unreadable_.find(c.name);
        if (said == unreadable_.end() || said->second != c.generation) {
          if (unreadable_.size() < 10000 || said != unreadable_.end()) {
            unreadable_[c.name] = c.generation;
          }
          lines.push_back(
              {"model_config_unreadable", {{"model", c.name}, {"generation", c.generation}}});
        }
        if (known != models_.end()) {
          known->second.unreadable = true;
          known->second.fleet_generation = c.generation;
        }
        continue;
      }
      unreadable_.erase(c.name);
      auto m = known;
      if (m == models_.end()) {
        if (versions.empty()) continue;  // retired before this server knew it
        m = models_.emplace(c.name, Entry{}).first;
      }
      Entry& entry = m->second;
      entry.unreadable = false;
      if (c.generation == entry.fleet_generation) continue;
      entry.fleet_generation = c.generation;
      // A version the fleet no longer reroutes (loaded and unloaded again elsewhere, or past the
      // newest 100) is not rerouted here either, unless this server's reroute is still unwritten.
      for (const std::string& version : entry.fleet_rerouted) {
        const auto v = entry.versions.find(version);
        if (v != entry.versions.end() && rerouted.count(version) == 0 &&
            v->second.pending != Version::Pending::remove) {
          v->second.reroute = false;
        }
      }
      entry.fleet_versions = versions;
      entry.fleet_rerouted = rerouted;
      if (!rerouted.empty()) rerouting_.store(true, std::memory_order_relaxed);
      entry.fleet_route = route;
      entry.fleet_route_generation = route_generation;
      for (const std::string& version : versions) {
        const auto v = entry.versions.find(version);
        if (v == entry.versions.end()) {
          to_load.push_back({c.name, version});
          continue;
        }
        // The fleet serves it again (unless this server's reroute of it is still to be written).
        if (v->second.pending != Version::Pending::remove) v->second.reroute = false;
        v->second.shared = true;
        if (v->second.pending == Version::Pending::add) v->second.pending = Version::Pending::none;
        if (v->second.pending != Version::Pending::remove &&
            (v->second.state == VersionState::draining ||
             ((!v->second.on_demand || in_route(route, version)) &&
              (v->second.state == VersionState::failed ||
               v->second.state == VersionState::unloaded)))) {
          to_load.push_back({c.name, version});  // (a drain here stops: the fleet serves it)
        }
      }
      const bool retired = versions.empty() && route.default_version.empty();
      for (auto& [version, v] : entry.versions) {
        if (first && versions.count(version) == 0 && v.state == VersionState::ready) {
          v.shared = true;  // as if the fleet had unloaded it
        }
        if (versions.count(version) > 0) continue;
        v.on_demand = false;  // (not the fleet's now: if it comes back, it loads as any version)
        if (v.pending == Version::Pending::remove) {
          v.pending = Version::Pending::none;  // the fleet removed it already
          v.shared = false;
          continue;
        }
        if (rerouted.count(version) > 0 && !v.reroute && v.pending != Version::Pending::add &&
            (v.state == VersionState::ready || v.state == VersionState::draining)) {
          to_reroute.push_back({c.name, version});  // (its drain here sends its jobs on too)
        }
        if (!v.shared || v.pending == Version::Pending::add) continue;
        v.shared = false;  // the fleet unloaded it
        if (v.state == VersionState::loading) {
          v.fleet_load = true;  // it goes again once loaded (finish_load)
        } else if (v.state == VersionState::ready && (retired || !in_route(route, version))) {
          if (rerouted.count(version) == 0) to_unload.push_back({c.name, version});
        }
      }
      if (retired) {
        // Every version drains (the route first, so that the unloads are allowed); a version
        // loading here goes once loaded.
        entry.retire_pending = false;
        entry.route_pending = false;
        entry.route = ModelRoute{};
        entry.generation = route_generation;
      } else if (!route.default_version.empty() && !entry.route_pending && !entry.retire_pending) {
        const bool changed = !same_route(route, entry.route);
        entry.generation = route_generation;
        if (changed) {
          route_set_locked(c.name, entry, route, lines);
          lines.back().second["from"] = "fleet";
        }
      }
    }
    // The fleet's versions this server lacks although its config did not change: a load refused
    // (the model was being retired here) or failed here. Tried again, each at most once a minute;
    // those the budget left out, when their jobs wait (load_on_demand).
    const auto now = clock_();
    for (auto& [name, entry] : models_) {
      if (entry.unreadable || stored.count(name) == 0 || !entry.unloads.empty() ||
          entry.retire_pending) {
        continue;
      }
      for (const std::string& version : entry.fleet_versions) {
        const auto v = entry.versions.find(version);
        if (v == entry.versions.end()) {
          to_load.push_back({name, version});
        } else if ((v->second.state == VersionState::failed ||
                    v->second.state == VersionState::unloaded) &&
                   (!v->second.on_demand || in_route(entry.route, version)) &&
                   v->second.pending != Version::Pending::remove && now >= v->second.retry_at &&
                   std::find(to_load.begin(), to_load.end(), ModelRef{name, version}) ==
                       to_load.end()) {
          v->second.retry_at = now + std::chrono::minutes(1);
          to_load.push_back({name, version});
        }
      }
    }
    // Models the store does not know yet (this server's own, at its start or loaded since): the
    // fleet is told of them.
    for (auto& [name, entry] : models_) {
      if (stored.count(name) > 0) continue;
      entry.fleet_generation = entry.fleet_route_generation = 0;
      entry.fleet_versions.clear();
      entry.fleet_route = ModelRoute{};
      entry.retire_pending = false;
      entry.unreadable = false;
      for (auto& [version, v] : entry.versions) {
        v.shared = false;
        if (v.state == VersionState::ready) {
          v.pending = Version::Pending::add;
        } else if (v.pending != Version::Pending::add) {
          v.pending = Version::Pending::none;  // (an operator's load under way keeps its add)
        }
      }
      entry.route_pending = !entry.route.default_version.empty();
    }
  }
  write(lines);
  for (const ModelRef& ref : to_load)
    load(ref.name, ref.version, {});
  for (const ModelRef& ref : to_unload)
    unload(ref.name, ref.version, false, {});
  for (const ModelRef& ref : to_reroute)
    unload(ref.name, ref.version, true, {});
  {
    // Loads started for the fleet's versions: theirs already (a load refused, say for a model
    // being retired here, left nothing to mark).
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ModelRef& ref : to_load) {
      const auto m = models_.find(ref.name);
      if (m == models_.end()) continue;
      const auto v = m->second.versions.find(ref.version);
      if (v == m->second.versions.end()) continue;
      v->second.shared = true;
      if (v->second.pending == Version::Pending::add) v->second.pending = Version::Pending::none;
    }
  }
  const bool conflict = publish_fleet();
  std::lock_guard<std::mutex> lock(mutex_);
  note_not_served_locked();
  return conflict;
}

bool ModelTable::publish_fleet() {
  struct Write {
    std::string name;
    std::uint64_t expected;
    ModelRoute route;
    std::uint64_t route_generation;
    std::set<std::string, ByNumber> versions, rerouted;
  };
  std::vector<Write> writes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [name, entry] : models_) {
      if (entry.unreadable) continue;
      Write w{name,
              entry.fleet_generation,
              entry.fleet_route,
              entry.fleet_route_generation,
              entry.fleet_versions,
              entry.fleet_rerouted};
      if (entry.retire_pending) {
        w.route = ModelRoute{};
        w.route_generation = entry.generation;
        w.versions.clear();
        w.rerouted.clear();  // (a retired model has no route to send jobs to)
      } else {
        for (auto& [version, v] : entry.versions) {
          if (v.pending == Version::Pending::add && v.state == VersionState::ready) {
            w.versions.insert(version);
          } else if (v.pending == Version::Pending::remove) {
            if (in_route(w.route, version)) {
              // The fleet's route names it now (set through another server meanwhile): it stays
              // the fleet's; this server's drain goes on, and its jobs go to the others.
              v.pending = Version::Pending::none;
              continue;
            }
            w.versions.erase(version);
          }
        }
        // Versions unloaded here with their jobs sent on: the fleet's too (but one the fleet
        // serves again is no longer rerouted; nor are a retired model's). The newest 100 are
        // kept: a job of an older one still waiting ends version_unavailable.
        if (!entry.route.default_version.empty()) {
          for (const auto& [version, v] : entry.versions)
            if (v.reroute && v.state != VersionState::ready) w.rerouted.insert(version);
        }
        for (const std::string& version : w.versions)
          w.rerouted.erase(version);
        while (w.rerouted.size() > max_rerouted)
          w.rerouted.erase(w.rerouted.begin());
        if (entry.route_pending) {
          // A route this table chose itself (a new model's first version): the fleet's, when it
          // has one, stands, here too.
          if (entry.fleet_route.default_version.empty()) {
            w.route = entry.route;
            w.route_generation = entry.generation;
          } else {
            entry.route_pending = false;
            entry.route = entry.fleet_route;
            entry.generation = entry.fleet_route_generation;
          }
        }
      }
      if (!entry.retire_pending && w.versions == entry.fleet_versions &&
          w.rerouted == entry.fleet_rerouted && same_route(w.route, entry.fleet_route) &&
          w.route_generation == entry.fleet_route_generation && entry.fleet_generation > 0) {
        // Nothing the fleet does not know: what was pending is settled.
        for (auto& [version, v] : entry.versions) {
          if (v.pending == Version::Pending::add && w.versions.count(version) > 0) {
            v.pending = Version::Pending::none;
            v.shared = true;
          }
        }
        entry.route_pending = false;
        continue;
      }
      if (entry.fleet_generation == 0 && w.versions.empty()) continue;  // nothing to tell yet
      writes.push_back(std::move(w));
    }
  }
  bool conflict = false;
  for (Write& w : writes) {
    std::optional<std::uint64_t> written;
    try {
      written = fleet_->put_model_config(
          w.name, config_text(w.route, w.route_generation, w.versions, w.rerouted), w.expected);
    } catch (...) {
      return false;  // written at the next pass
    }
    if (!written) {
      conflict = true;  // another server wrote it first: read it, then write again
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& entry = models_[w.name];
    if (entry.fleet_generation != w.expected) continue;  // (read meanwhile: the next pass)
    entry.fleet_generation = *written;
    entry.fleet_route = w.route;
    entry.fleet_route_generation = w.route_generation;
    entry.fleet_versions = w.versions;
    entry.fleet_rerouted = w.rerouted;
    if (!entry.fleet_rerouted.empty()) rerouting_.store(true, std::memory_order_relaxed);
    entry.route_pending = false;
    entry.retire_pending = false;
    for (auto& [version, v] : entry.versions) {
      v.shared = w.versions.count(version) > 0;
      if ((v.pending == Version::Pending::add && v.shared) ||
          (v.pending == Version::Pending::remove && !v.shared)) {
        v.pending = Version::Pending::none;
      }
    }
  }
  return conflict;
}

std::string ModelTable::metrics_text() const {
  std::string jobs =
      "# HELP rebound_model_jobs_completed_total Jobs that ran on a model version to a final "
      "status, by status.\n# TYPE rebound_model_jobs_completed_total counter\n";
  std::string seconds =
      "# HELP rebound_model_inference_seconds_total Time in a model version's predict and "
      "predict_batch calls.\n# TYPE rebound_model_inference_seconds_total counter\n";
  std::string states =
      "# HELP rebound_model_versions Model versions by state (1 for the state each is in).\n"
      "# TYPE rebound_model_versions gauge\n";
  std::string memory =
      "# HELP rebound_model_memory_bytes What a loaded model version holds (its own word, else "
      "its files' size).\n# TYPE rebound_model_memory_bytes gauge\n";
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, entry] : models_) {
    for (const auto& [version, v] : entry.versions) {
      const std::string labels =
          "model=\"" + label_value(name) + "\",version=\"" + label_value(version) + "\"";
      jobs += "rebound_model_jobs_completed_total{" + labels + ",status=\"succeeded\"} " +
              std::to_string(v.stats->succeeded.load()) + "\n";
      jobs += "rebound_model_jobs_completed_total{" + labels + ",status=\"failed\"} " +
              std::to_string(v.stats->failed.load()) + "\n";
      char text[32];
      std::snprintf(text, sizeof text, "%.6f",
                    static_cast<double>(v.stats->inference_us.load()) / 1e6);
      seconds += "rebound_model_inference_seconds_total{" + labels + "} " + text + "\n";
      for (const VersionState state :
           {VersionState::loading, VersionState::ready, VersionState::failed,
            VersionState::draining, VersionState::unloaded}) {
        states += "rebound_model_versions{" + labels + ",state=\"" + to_string(state) + "\"} " +
                  (state == v.state ? "1\n" : "0\n");
      }
      const bool loaded = v.state == VersionState::ready || v.state == VersionState::draining;
      memory += "rebound_model_memory_bytes{" + labels + "} " +
                std::to_string(loaded ? v.bytes : 0) + "\n";
    }
  }
  if (budget_ > 0) {
    memory +=
        "# HELP rebound_model_memory_budget_bytes The bound on what loaded versions hold "
        "together.\n# TYPE rebound_model_memory_budget_bytes gauge\n"
        "rebound_model_memory_budget_bytes " +
        std::to_string(budget_) + "\n";
  }
  return jobs + seconds + states + memory;
}

void ModelTable::stop() {
  std::vector<std::pair<std::vector<Completion<ModelInfo>>, ModelInfo>> ended;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_ && !loading_.joinable()) return;
    stopped_ = true;
    load_wake_.notify_all();
  }
  if (loading_.joinable() && loading_.get_id() != std::this_thread::get_id()) loading_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  to_load_.clear();
  for (auto& [name, entry] : models_) {
    if (!entry.unloads.empty()) {
      ended.emplace_back(std::move(entry.unloads), info_locked(name, entry));
      entry.unloads.clear();
    }
    for (auto& [version, v] : entry.versions) {
      if (v.loads.empty() && v.unloads.empty()) continue;
      if (v.state == VersionState::loading) {
        v.state = VersionState::failed;
        v.error = ErrorInfo{"shutting_down", "The queue stopped before the version loaded."};
      }
      std::vector<Completion<ModelInfo>> all = std::move(v.loads);
      for (auto& u : v.unloads)
        all.push_back(std::move(u));
      v.loads.clear();
      v.unloads.clear();
      ended.emplace_back(std::move(all), info_locked(name, entry));
    }
  }
  for (auto& [waiting, info] : ended)
    for (auto& w : waiting)
      w(errc::shutting_down, info);  // (they only post)
}

}  // namespace rebound::detail

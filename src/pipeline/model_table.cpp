#include "model_table.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
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
      digester_(repository.digester_) {
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
    return c;
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

ModelTable::Lease ModelTable::acquire(const ModelRef& ref) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Version* v = version_locked(ref);
  if (!v || !v->model || (v->state != VersionState::ready && v->state != VersionState::draining)) {
    return {};
  }
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
      switch (v.state) {
        case VersionState::ready:
          break;  // answered at once
        case VersionState::loading:
          // A version new to the table (it starts `loading`, no load queued for it yet), or one
          // whose load is under way: the handler waits for that load.
          if (v.loads.empty()) {
            to_load_.push_back({name, version});
            lines.push_back({"model_loading", {{"model", name}, {"version", version}}});
          }
          v.loads.push_back(std::move(done));
          break;
        case VersionState::draining:
          v.state = VersionState::ready;  // a load stops the drain: it serves again
          stopped_drain = std::move(v.unloads);
          v.unloads.clear();
          lines.push_back({"model_drain_stopped", {{"model", name}, {"version", version}}});
          break;
        case VersionState::failed:
        case VersionState::unloaded:
          v.state = VersionState::loading;
          v.error.reset();
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
    try {
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
      error = ErrorInfo{"load_failed", e.what()};
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
    if (error) {
      fields["error"] = error->message;
      logger_.log(LogLevel::error, "model_load_failed", fields);
    } else {
      if (!digest.empty()) fields["digest"] = digest;
      logger_.log(LogLevel::info, "model_loaded", fields);
    }
    finish_load(ref, std::move(model), std::move(error), std::move(digest));
    lock.lock();
  }
}

void ModelTable::finish_load(const ModelRef& ref, std::unique_ptr<Model> model,
                             std::optional<ErrorInfo> error, std::string digest) {
  std::vector<Completion<ModelInfo>> waiting;
  ModelInfo info;
  const boost::system::error_code ec =
      model ? boost::system::error_code() : make_error_code(errc::load_failed);
  const auto now = clock_();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& entry = models_[ref.name];
    Version& v = entry.versions[ref.version];
    if (model) {
      v.model = std::shared_ptr<Model>(std::move(model));
      v.state = VersionState::ready;
      v.loaded_at = now;
      v.error.reset();
      v.digest = std::move(digest);
      if (entry.route.default_version.empty()) {  // a new model: its first version serves it
        entry.route.default_version = ref.version;
        ++entry.generation;
      }
    } else {
      v.state = VersionState::failed;
      v.error = std::move(error);
    }
    waiting = std::move(v.loads);
    v.loads.clear();
    info = info_locked(ref.name, entry);
  }
  for (auto& w : waiting)
    w(ec, info);
}

void ModelTable::unload(const std::string& name, const std::string& version,
                        Completion<ModelInfo> done) {
  ModelInfo info;
  boost::system::error_code ec;
  bool settle = false;
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
      } else {
        Version& v = it->second;
        switch (v.state) {
          case VersionState::ready:
            v.state = VersionState::draining;
            draining_.store(true, std::memory_order_relaxed);
            lines.push_back({"model_draining", {{"model", name}, {"version", version}}});
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
      }
      info = info_locked(name, entry);
    }
  }
  write(lines);
  if (settle) return settle_drains();
  done(ec, std::move(info));
}

void ModelTable::unload_model(const std::string& name, Completion<ModelInfo> done) {
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
        for (auto& [version, v] : entry.versions) {
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
  if (!done) return settle_drains();
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

boost::system::error_code ModelTable::set_route(const std::string& name, ModelRoute route,
                                                std::uint64_t if_generation, ModelInfo* out) {
  Lines lines;
  const boost::system::error_code ec =
      set_route_locked(name, std::move(route), if_generation, out, lines);
  write(lines);
  return ec;
}

boost::system::error_code ModelTable::set_route_locked(const std::string& name, ModelRoute route,
                                                       std::uint64_t if_generation, ModelInfo* out,
                                                       Lines& lines) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto m = models_.find(name);
  if (m == models_.end()) return errc::model_not_found;
  Entry& entry = m->second;
  const auto answer = [&](boost::system::error_code ec) {
    if (out) *out = info_locked(name, entry);
    return ec;
  };
  if (if_generation != 0 && if_generation != entry.generation) return answer(errc::route_changed);
  if (!is_valid_model_version(route.default_version)) return answer(errc::invalid_route);
  std::set<std::string> named{route.default_version};
  int total = 0;
  for (const ModelSplit& s : route.split) {
    if (!is_valid_model_version(s.version) || s.percent < 1 || s.percent > 100 ||
        !named.insert(s.version).second) {
      return answer(errc::invalid_route);
    }
    total += s.percent;
  }
  if (total > 100) return answer(errc::invalid_route);
  for (const std::string& version : named) {
    const auto v = entry.versions.find(version);
    if (v == entry.versions.end() || v->second.state != VersionState::ready) {
      return answer(errc::version_unavailable);
    }
  }
  entry.route = std::move(route);
  ++entry.generation;
  nlohmann::json split = nlohmann::json::array();
  for (const ModelSplit& s : entry.route.split)
    split.push_back({{"version", s.version}, {"percent", s.percent}});
  lines.push_back({"model_route_set",
                   {{"model", name},
                    {"default_version", entry.route.default_version},
                    {"split", std::move(split)},
                    {"generation", entry.generation}}});
  return answer({});
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
    }
  }
  return jobs + seconds + states;
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

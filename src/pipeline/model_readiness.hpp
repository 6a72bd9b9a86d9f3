// Whether the queue's models can take work: each says it is ready (Model::ready) and its warm-up
// (Model::warm_up) has returned. Gates submissions (Admission) and the jobs the pump claims.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "model_table.hpp"
#include "rebound/log.hpp"
#include "rebound/model.hpp"

namespace rebound::detail {

/// The models are the versions the queue was built with (ModelTable::first_versions; a version
/// loaded later is warmed up by its load, and one unloaded since no longer counts); "the model"
/// below is all of them: ready when each is, warmed up when each one's warm-up has returned (in
/// turn, in the repository's order).
/// Model::warm_up runs once: in `start` when the model is ready then (on the caller's thread, the
/// JobQueue's constructor), else on a thread of its own as soon as `ready` first finds the model
/// ready (a model that loads in the background); `warmed` is called when that one returns. A
/// warm-up that throws is logged (`model_warm_up_failed`) and the model serves all the same:
/// warming is an optimisation. After `stop` (the queue stops) no warm-up starts.
/// Thread-safety: `ready` may be called from any thread; `start` once, before it; `stop` once
/// the queue stops.
class ModelReadiness {
 public:
  ModelReadiness(const ModelTable& models, Logger logger, std::function<void()> warmed)
      : logger_(std::move(logger)), warmed_(std::move(warmed)) {
    // A table that runs every job never releases its one Model: read without a lock (the hot
    // path asks at every submission).
    for (auto& [ref, model] : models.first_versions())
      models_.push_back({ref, model, models.runs_every_job() ? model.lock().get() : nullptr});
  }
  ModelReadiness(const ModelReadiness&) = delete;
  ModelReadiness& operator=(const ModelReadiness&) = delete;
  ~ModelReadiness() { stop(); }

  /// Warms the model up now when it is ready now.
  void start() {
    if (models_ready() && claim()) warm();
  }

  /// No warm-up starts from now on; waits for one under way on its own thread (as the queue
  /// waits for a running batch), `warmed` included.
  void stop() {
    closed_.store(true, std::memory_order_release);
    std::lock_guard<std::mutex> lock(thread_mutex_);
    if (thread_.joinable()) thread_.join();
  }

  /// `ready` without starting anything.
  bool warmed() const { return state_.load(std::memory_order_acquire) == warm_ && models_ready(); }

  /// True once the model is ready and warmed up. Cheap (the model's own `ready`, an atomic). The
  /// first call that finds the model ready starts its warm-up elsewhere, and answers false.
  bool ready() const {
    const int state = state_.load(std::memory_order_acquire);
    if (state == warm_) return models_ready();
    if (state == cold_ && !closed_.load(std::memory_order_acquire) && models_ready() && claim()) {
      std::lock_guard<std::mutex> lock(thread_mutex_);
      try {
        thread_ = std::thread([this] {
          warm();
          if (warmed_) warmed_();
        });
      } catch (const std::system_error&) {
        // No thread to be had now: the next look tries again (never warmed on a caller's thread,
        // which may be an HTTP thread or the one that renews leases).
        state_.store(cold_, std::memory_order_release);
      }
    }
    return false;
  }

 private:
  static constexpr int cold_ = 0, warming_ = 1, warm_ = 2;

  // True for the one caller that moves the state from cold to warming.
  bool claim() const {
    int expected = cold_;
    return state_.compare_exchange_strong(expected, warming_, std::memory_order_acq_rel);
  }

  bool models_ready() const {
    for (const auto& m : models_) {
      if (m.pinned) {
        if (!m.pinned->ready()) return false;
        continue;
      }
      const std::shared_ptr<Model> model = m.model.lock();
      if (model && !model->ready()) return false;
    }
    return true;
  }

  void warm() const {
    for (const auto& m : models_) {
      const std::shared_ptr<Model> model = m.model.lock();
      if (!model) continue;  // unloaded already
      nlohmann::json named = {{"model", m.ref.name}, {"version", m.ref.version}};
      const auto began = std::chrono::steady_clock::now();
      try {
        model->warm_up();
        const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - began);
        named["ms"] = took.count();
        logger_.log(LogLevel::info, "model_warmed_up", named);
      } catch (const std::exception& e) {
        named["error"] = e.what();
        logger_.log(LogLevel::warn, "model_warm_up_failed", named);
      } catch (...) {
        named["error"] = "unknown error";
        logger_.log(LogLevel::warn, "model_warm_up_failed", named);
      }
    }
    state_.store(warm_, std::memory_order_release);
  }

  struct Served {
    ModelRef ref;
    std::weak_ptr<Model> model;  // null once unloaded
    Model* pinned;               // for a table that never releases it
  };
  std::vector<Served> models_;
  const Logger logger_;
  const std::function<void()> warmed_;
  std::atomic<bool> closed_{false};
  mutable std::atomic<int> state_{cold_};
  mutable std::mutex thread_mutex_;
  mutable std::thread thread_;  // the warm-up of a model that got ready after the start
};

}  // namespace rebound::detail

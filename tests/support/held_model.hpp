// HeldModel: a Model whose predictions wait until the test opens it, to hold work in flight on
// purpose. It keeps the inputs in the order they reached it, answers {"echo": input} (or what the
// test's `answer` says), and a held input "cooperative" gives up when its job is cancelled
// (rebound::cancellation_requested), as a model that polls the flag does. Its state (`Held`) may
// be shared by the models of several queues, one after another: a test that restarts a queue on
// the same store sees one order across both. `set_ready(false)` makes it report not ready
// (`/ping` answers 503).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rebound/model.hpp"

namespace rebound::test {

class Held {
 public:
  /// Notes `input`, then waits until opened: false when a "cooperative" input gave up first.
  bool hold(const nlohmann::json& input) {
    std::unique_lock<std::mutex> lock(m_);
    ++started_;
    order_.push_back(input.is_string() ? input.get<std::string>() : input.dump());
    changed_.notify_all();
    while (!open_) {
      if (input == "cooperative" && rebound::cancellation_requested()) {
        ++stopped_early_;
        changed_.notify_all();
        return false;
      }
      changed_.wait_for(lock, std::chrono::milliseconds(10));
    }
    return true;
  }
  /// Lets every prediction, waiting or to come, answer.
  void open() {
    std::lock_guard<std::mutex> lock(m_);
    open_ = true;
    changed_.notify_all();
  }
  /// Holds predictions again from now on (those answered already stay answered).
  void close() {
    std::lock_guard<std::mutex> lock(m_);
    open_ = false;
  }
  /// Predictions started so far (held, answered or given up).
  int started() {
    std::lock_guard<std::mutex> lock(m_);
    return started_;
  }
  /// Waits (up to 10 s) until `n` predictions have started.
  bool wait_started(int n) {
    std::unique_lock<std::mutex> lock(m_);
    return changed_.wait_for(lock, std::chrono::seconds(10), [&] { return started_ >= n; });
  }
  /// The inputs in the order they reached the model (strings as they are, others as JSON text).
  std::vector<std::string> order() {
    std::lock_guard<std::mutex> lock(m_);
    return order_;
  }
  /// Held "cooperative" inputs that gave up on their cancellation.
  int stopped_early() {
    std::lock_guard<std::mutex> lock(m_);
    return stopped_early_;
  }

 private:
  std::mutex m_;
  std::condition_variable changed_;
  bool open_ = false;
  int started_ = 0;
  int stopped_early_ = 0;
  std::vector<std::string> order_;
};

class HeldModel final : public rebound::Model {
 public:
  using Answer = std::function<rebound::Prediction(const nlohmann::json&)>;
  explicit HeldModel(Answer answer = nullptr)
      : HeldModel(std::make_shared<Held>(), std::move(answer)) {}
  explicit HeldModel(std::shared_ptr<Held> held, Answer answer = nullptr)
      : held_(std::move(held)), answer_(std::move(answer)) {}

  std::string name() const override { return "held"; }
  bool ready() const override { return ready_; }
  rebound::Prediction predict(const nlohmann::json& input) override {
    if (!held_->hold(input)) return rebound::Prediction::failure("stopped", "cancelled");
    return answer_ ? answer_(input) : rebound::Prediction::success({{"echo", input}});
  }
  void open() { held_->open(); }
  void close() { held_->close(); }
  int started() { return held_->started(); }
  void set_ready(bool ready) { ready_ = ready; }
  bool wait_started(int n) { return held_->wait_started(n); }
  std::vector<std::string> order() { return held_->order(); }
  int stopped_early() { return held_->stopped_early(); }

 private:
  std::shared_ptr<Held> held_;
  Answer answer_;
  std::atomic<bool> ready_{true};
};

/// A model whose validation waits until the test opens it (so a request stays on its thread,
/// its body parsed, meanwhile); its predictions answer {"echo": input} at once.
class HeldValidationModel final : public rebound::Model {
 public:
  std::string name() const override { return "held-validation"; }
  std::optional<rebound::ErrorInfo> validate(const nlohmann::json& input) const override {
    held_->hold(input);
    return std::nullopt;
  }
  rebound::Prediction predict(const nlohmann::json& input) override {
    return rebound::Prediction::success({{"echo", input}});
  }
  void open() { held_->open(); }
  /// Waits (up to 10 s) until `n` validations have started.
  bool wait_started(int n) { return held_->wait_started(n); }

 private:
  std::shared_ptr<Held> held_ = std::make_shared<Held>();
};

}  // namespace rebound::test

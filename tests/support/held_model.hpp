// HeldModel: a Model whose predictions wait until the test opens it, to hold work in flight on
// purpose; it answers {"echo": input}.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "rebound/model.hpp"

namespace rebound::test {

class HeldModel final : public rebound::Model {
 public:
  std::string name() const override { return "held"; }
  rebound::Prediction predict(const nlohmann::json& input) override {
    std::unique_lock<std::mutex> lock(m_);
    ++started_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
    return rebound::Prediction::success({{"echo", input}});
  }
  /// Lets every prediction, waiting or to come, answer.
  void open() {
    std::lock_guard<std::mutex> lock(m_);
    open_ = true;
    changed_.notify_all();
  }
  /// Waits (up to 10 s) until `n` predictions have started.
  bool wait_started(int n) {
    std::unique_lock<std::mutex> lock(m_);
    return changed_.wait_for(lock, std::chrono::seconds(10), [&] { return started_ >= n; });
  }

 private:
  std::mutex m_;
  std::condition_variable changed_;
  bool open_ = false;
  int started_ = 0;
};

}  // namespace rebound::test

// Internal: a point in the library's code where a test may run a function of its own. Not part
// of the library's interface; the stores' *_testing.hpp headers name their hooks.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <utility>

namespace rebound::detail {

/// The function a test set for one point, or none. While none is set a call costs one atomic
/// load. The function runs on the caller's thread, from a copy taken under the hook's lock (a
/// test may clear or replace it meanwhile), and a throw from it is swallowed: a test's hook never
/// makes the code it watches fail (a caller may take a throw for a write not made).
template <class... Args>
class TestHook {
 public:
  void set(std::function<void(Args...)> hook) {
    std::lock_guard<std::mutex> lock(mutex_);
    hook_ = std::move(hook);
    set_.store(static_cast<bool>(hook_), std::memory_order_release);
  }

  void operator()(Args... args) const noexcept {
    if (!set_.load(std::memory_order_acquire)) return;
    try {
      std::function<void(Args...)> hook;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        hook = hook_;
      }
      if (hook) hook(args...);
    } catch (...) {
    }
  }

 private:
  mutable std::mutex mutex_;
  std::function<void(Args...)> hook_;
  std::atomic<bool> set_{false};
};

}  // namespace rebound::detail

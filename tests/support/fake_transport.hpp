// FakeTransport: the tests' one CallbackTransport fake. It records every request and answers each
// at once: first from a script of statuses, in order, then by a rule per request (a status, or
// nothing: the request is held unanswered until `release`), else 200. Its state is shared, so
// that a test reads it after the transport moved into a queue.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "rebound/delivery/callback_transport.hpp"

namespace rebound::test {

class FakeTransport final : public CallbackTransport {
 public:
  struct Shared {
    std::mutex m;
    std::deque<int> script;  ///< statuses answered first, in order
    /// After the script: a status for the request, or nullopt to hold it until `release` (null
    /// rule: 200). Set before the transport sends; called outside `m`.
    std::function<std::optional<int>(const CallbackRequest&)> rule;
    std::vector<CallbackRequest> sent;  ///< every request, in order
    std::vector<CallbackResponseHandler> held;
    bool released = false;  ///< from `release` on, what the rule would hold is answered 200

    std::size_t count() {
      std::lock_guard<std::mutex> lock(m);
      return sent.size();
    }
    /// Requests whose URL holds `part` ("//down"), or (`holds` false) does not.
    std::size_t count_to(std::string_view part, bool holds = true) {
      std::lock_guard<std::mutex> lock(m);
      std::size_t n = 0;
      for (const auto& r : sent)
        n += (r.url.find(part) != std::string::npos) == holds ? 1 : 0;
      return n;
    }
    /// Answers what is held with `status`, on the calling thread; from now on nothing is held.
    void release(int status = 200) {
      std::vector<CallbackResponseHandler> all;
      {
        std::lock_guard<std::mutex> lock(m);
        released = true;
        all.swap(held);
      }
      for (auto& done : all)
        done(response(status));
    }
  };

  explicit FakeTransport(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  // What is still held when it is destroyed is dropped unanswered (its handlers belong to parts
  // being destroyed with it): a test that holds requests releases them first.

  void send(CallbackRequest request, CallbackResponseHandler done) override {
    std::optional<int> status = 200;
    std::function<std::optional<int>(const CallbackRequest&)> rule;
    {
      std::lock_guard<std::mutex> lock(shared_->m);
      if (!shared_->script.empty()) {
        status = shared_->script.front();
        shared_->script.pop_front();
      } else {
        rule = shared_->rule;  // called outside the lock: a rule may read the counts
      }
    }
    if (rule) status = rule(request);
    {
      std::lock_guard<std::mutex> lock(shared_->m);
      if (!status && shared_->released) status = 200;
      shared_->sent.push_back(std::move(request));
      if (!status) {
        shared_->held.push_back(std::move(done));
        return;
      }
    }
    done(response(*status));
  }

  static CallbackResponse response(int status) {
    CallbackResponse r;
    r.status = status;
    return r;
  }

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace rebound::test

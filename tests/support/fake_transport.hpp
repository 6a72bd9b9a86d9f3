// FakeTransport: the tests' one CallbackTransport fake. It records every request and answers it:
// first from a script of responses, in order, then by a rule per request (a status, or nothing:
// the request is held until the test answers it with `answer_oldest` or `release`), else 200.
// Its state is shared, so that a test reads it after the transport moved into a sender, a gate
// or a queue.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rebound/delivery/callback_transport.hpp"

namespace rebound::test {

/// A response with `status` and no transport error.
inline CallbackResponse response(int status) {
  CallbackResponse r;
  r.status = status;
  return r;
}

class FakeTransport final : public CallbackTransport {
 public:
  /// A request the rule held, with the handler that answers it.
  struct Held {
    CallbackRequest request;
    CallbackResponseHandler done;
  };

  struct Shared {
    std::mutex m;
    std::deque<CallbackResponse> script;  ///< responses answered first, in order
    /// After the script: a status for the request, or nullopt to hold it (null rule: 200). Set
    /// before the transport sends; called outside `m`.
    std::function<std::optional<int>(const CallbackRequest&)> rule;
    std::vector<CallbackRequest> sent;  ///< every request, in order
    std::deque<Held> held;              ///< oldest first
    bool released = false;  ///< from `release` on, what the rule would hold is answered 200

    /// Scripts these statuses, in order, after what is scripted already.
    void script_statuses(const std::vector<int>& statuses) {
      std::lock_guard<std::mutex> lock(m);
      for (int s : statuses)
        script.push_back(response(s));
    }
    /// Holds every request that the script does not answer.
    void hold_all() {
      std::lock_guard<std::mutex> lock(m);
      rule = [](const CallbackRequest&) { return std::optional<int>(); };
    }
    std::size_t count() {
      std::lock_guard<std::mutex> lock(m);
      return sent.size();
    }
    std::size_t held_count() {
      std::lock_guard<std::mutex> lock(m);
      return held.size();
    }
    /// A copy of every request sent so far.
    std::vector<CallbackRequest> requests() {
      std::lock_guard<std::mutex> lock(m);
      return sent;
    }
    /// Requests whose URL holds `part` ("//down"), or (`holds` false) does not.
    std::size_t count_to(std::string_view part, bool holds = true) {
      std::lock_guard<std::mutex> lock(m);
      std::size_t n = 0;
      for (const auto& r : sent)
        n += (r.url.find(part) != std::string::npos) == holds ? 1 : 0;
      return n;
    }
    /// Answers the oldest held request with `r`, on the calling thread, and returns that
    /// request; nullopt when nothing is held.
    std::optional<CallbackRequest> answer_oldest(const CallbackResponse& r) {
      return answer_oldest_if(r, [](const CallbackRequest&) { return true; });
    }
    /// The same for the oldest held request of `tenant` (CallbackRequest::tenant).
    std::optional<CallbackRequest> answer_oldest_of(const std::string& tenant,
                                                    const CallbackResponse& r) {
      return answer_oldest_if(r, [&](const CallbackRequest& q) { return q.tenant == tenant; });
    }
    /// Tenants of the requests held now, oldest first.
    std::vector<std::string> held_tenants() {
      std::lock_guard<std::mutex> lock(m);
      std::vector<std::string> out;
      for (const auto& h : held)
        out.push_back(h.request.tenant);
      return out;
    }
    template <typename Pick>
    std::optional<CallbackRequest> answer_oldest_if(const CallbackResponse& r, Pick pick) {
      Held h;
      {
        std::lock_guard<std::mutex> lock(m);
        auto it =
            std::find_if(held.begin(), held.end(), [&](const Held& x) { return pick(x.request); });
        if (it == held.end()) return std::nullopt;
        h = std::move(*it);
        held.erase(it);
      }
      h.done(r);
      return std::move(h.request);
    }
    /// Answers what is held with `status`, on the calling thread; from now on nothing is held.
    void release(int status = 200) {
      std::deque<Held> all;
      {
        std::lock_guard<std::mutex> lock(m);
        released = true;
        all.swap(held);
      }
      for (auto& h : all)
        h.done(response(status));
    }
  };

  explicit FakeTransport(std::shared_ptr<Shared> shared = std::make_shared<Shared>())
      : shared_(std::move(shared)) {}

  const std::shared_ptr<Shared>& shared() const { return shared_; }

  // What is still held when it is destroyed is dropped unanswered (its handlers belong to parts
  // being destroyed with it): a test that holds requests answers them first.

  void send(CallbackRequest request, CallbackResponseHandler done) override {
    std::optional<CallbackResponse> answer = response(200);
    std::function<std::optional<int>(const CallbackRequest&)> rule;
    {
      std::lock_guard<std::mutex> lock(shared_->m);
      if (!shared_->script.empty()) {
        answer = shared_->script.front();
        shared_->script.pop_front();
      } else {
        rule = shared_->rule;  // called outside the lock: a rule may read the counts
      }
    }
    if (rule) {
      const std::optional<int> status = rule(request);
      answer = status ? std::optional<CallbackResponse>(response(*status)) : std::nullopt;
    }
    {
      std::lock_guard<std::mutex> lock(shared_->m);
      if (!answer && shared_->released) answer = response(200);
      shared_->sent.push_back(request);
      if (!answer) {
        shared_->held.push_back({std::move(request), std::move(done)});
        return;
      }
    }
    done(*answer);
  }

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace rebound::test

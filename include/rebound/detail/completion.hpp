// Completion: the type-erased, move-only, call-once form of an Asio completion handler, bound to
// the handler's associated executor with a work guard, so the compiled queue can hold it.
#pragma once

#include <atomic>
#include <memory>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/system/error_code.hpp>

namespace rebound::detail {

/// Counts the handlers of one JobQueue not yet run (or dropped): its destructor waits for them.
using LiveCount = std::shared_ptr<std::atomic<long>>;

/// Calls a handler once with `(error_code, T)`. Calling it posts the handler to its executor: it
/// never runs inline in the caller (which may hold a lock). Destroying an uncalled Completion
/// drops the handler without calling it; the JobQueue never does that (every path calls it).
/// `live` counts it from construction until its handler has run or was dropped.
/// Not thread-safe itself: one owner at a time.
template <typename T>
class Completion {
 public:
  Completion() = default;

  template <typename Handler>
  Completion(Handler handler, const boost::asio::any_io_executor& fallback, LiveCount live = {})
      : impl_(std::make_unique<Bound<Handler>>(std::move(handler), fallback, std::move(live))) {}

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  /// Posts the handler with these arguments; afterwards this Completion is empty.
  void operator()(boost::system::error_code ec, T value) {
    std::unique_ptr<Base> impl = std::move(impl_);
    if (impl) impl->post(ec, std::move(value));
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void post(boost::system::error_code ec, T value) = 0;
  };

  // One count in `live` while held; moves with the handler into the posted function.
  struct Token {
    explicit Token(LiveCount c) : count(std::move(c)) {
      if (count) ++*count;
    }
    Token(Token&& other) noexcept = default;
    Token& operator=(Token&&) = delete;
    ~Token() {
      if (count) --*count;
    }
    LiveCount count;
  };

  template <typename Handler>
  struct Bound final : Base {
    using Executor = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;
    Bound(Handler h, const boost::asio::any_io_executor& fallback, LiveCount live)
        : work(boost::asio::get_associated_executor(h, fallback)),
          handler(std::move(h)),
          token(std::move(live)) {}
    void post(boost::system::error_code ec, T value) override {
      // The handler's executor runs it, with its allocator; the guard kept that executor's
      // context from running out of work until now.
      Executor executor = work.get_executor();
      boost::asio::post(executor, [h = std::move(handler), t = std::move(token), ec,
                                   v = std::move(value)]() mutable {
        std::move(h)(ec, std::move(v));
        Token done = std::move(t);  // counted down once the handler returned
      });
      work.reset();
    }
    boost::asio::executor_work_guard<Executor> work;
    Handler handler;
    Token token;
  };

  std::unique_ptr<Base> impl_;
};

}  // namespace rebound::detail

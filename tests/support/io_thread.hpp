// An io_context on a thread of its own for the duration of a test.
#pragma once

#include <chrono>
#include <future>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace rebound::test {

struct IoThread {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::promise<void> ran_out_;
  std::future<void> ran_out_future_ = ran_out_.get_future();
  std::thread thread{[this] {
    io.run();
    ran_out_.set_value();
  }};

  /// Lets the context run out of work: true once io.run() has returned within `limit`, that is
  /// once every handler that was ever going to run has run and no operation is left pending.
  /// What a test asserts after it is final: nothing can happen on this context any more.
  bool run_out(std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
    work.reset();
    return ran_out_future_.wait_for(limit) == std::future_status::ready;
  }

  ~IoThread() {
    work.reset();
    io.stop();
    thread.join();
  }
};

}  // namespace rebound::test

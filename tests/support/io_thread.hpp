// An io_context on a thread of its own for the duration of a test.
#pragma once

#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace rebound::test {

struct IoThread {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::thread thread{[this] { io.run(); }};
  ~IoThread() {
    work.reset();
    io.stop();
    thread.join();
  }
};

}  // namespace rebound::test

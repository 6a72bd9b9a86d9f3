// libFuzzer target: arbitrary bytes as one client connection (request lines, methods, path bytes,
// headers, bodies, pipelined requests) through the server's own connection handling (the Beast
// front's session, over a local socket pair), routing and handlers, on a real JobQueue (echo model,
// memory store; a transport that delivers at once). Never a crash, never a 500, and every answer
// starts with a status line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "rebound/http/server.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/model.hpp"
#include "rebound/store/memory_job_store.hpp"

namespace {

class DeliveredAtOnce final : public rebound::CallbackTransport {
 public:
  void send(rebound::CallbackRequest, rebound::CallbackResponseHandler on_done) override {
    rebound::CallbackResponse response;
    response.status = 200;
    on_done(std::move(response));
  }
};

struct World {
  boost::asio::thread_pool inference{2};
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::thread io_thread{[this] { io.run(); }};
  std::unique_ptr<rebound::JobQueue> service;
  std::unique_ptr<rebound::Server> server;

  World() {
    rebound::JobQueueOptions options;
    options.workers = 2;
    service = std::make_unique<rebound::JobQueue>(
        inference.get_executor(), io.get_executor(), rebound::make_builtin_model("echo"),
        std::make_unique<rebound::MemoryJobStore>(), std::make_unique<DeliveredAtOnce>(), options);
    rebound::ServerOptions server_options;
    server_options.api_keys = {};
    server = std::make_unique<rebound::Server>(*service, server_options);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static World* world = new World();  // lives for the whole run: threads must not be torn down
  const std::string out =
      world->server->serve_connection_bytes(std::string(reinterpret_cast<const char*>(data), size));
  // An HTTP/1.0 request is answered in HTTP/1.0.
  if (!out.empty() && out.compare(0, 9, "HTTP/1.1 ") != 0 && out.compare(0, 9, "HTTP/1.0 ") != 0)
    std::abort();
  if (out.find("HTTP/1.1 500") != std::string::npos ||
      out.find("HTTP/1.0 500") != std::string::npos)
    std::abort();
  return 0;
}

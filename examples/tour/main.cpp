// rebound in one file: your model behind the HTTP API, jobs kept in SQLite, signed callbacks
// retried with the default policy, and a clean stop on Ctrl-C or SIGTERM.
// Usage: rebound-tour [PORT]   (8080 by default; the README shows two curl lines to try)
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <future>
#include <iostream>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>
#include <rebound/http/curl_transport.hpp>
#include <rebound/http/server.hpp>
#include <rebound/store/sqlite_job_store.hpp>

// Your model: derive from rebound::Model (docs/models.md has more, batching included).
class Sentiment final : public rebound::Model {
 public:
  std::string name() const override { return "sentiment"; }
  rebound::Prediction predict(const nlohmann::json& input) override {
    if (!input.is_string()) return rebound::Prediction::failure("invalid_input", "need a string");
    const bool good = input.get<std::string>().find("good") != std::string::npos;
    return rebound::Prediction::success({{"label", good ? "pos" : "neg"}});
  }
};

int main(int argc, char** argv) {
  boost::asio::thread_pool inference(4);  // model work runs here
  boost::asio::io_context io;             // callback requests and their timers run here
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });

  rebound::ServiceOptions options;
  options.workers = 4;
  options.max_batch_size = 16;  // a model with predict_batch gets up to 16 inputs at once
  // Callbacks are signed (Standard Webhooks) with this secret; receivers verify with it. It is
  // the spec's example: make your own with `echo whsec_$(openssl rand -base64 32)`. Retries
  // follow the default policy: exponential from 1 s with jitter, Retry-After honoured, 5 tries.
  options.delivery.signing_secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};

  rebound::ServerOptions http;
  http.host = "127.0.0.1";  // "0.0.0.0" to serve other machines
  http.port = argc > 1 ? std::atoi(argv[1]) : 8080;
  int status = 0;
  try {
    rebound::Service service(inference.get_executor(), io.get_executor(),
                             std::make_unique<Sentiment>(),
                             std::make_unique<rebound::SqliteJobStore>("tour.db"),  // durable
                             std::make_unique<rebound::CurlTransport>(io.get_executor()), options);
    rebound::Server server(service, http);
    std::cout << "rebound-tour listening on " << http.host << ":" << server.bind() << std::endl;

    // Ctrl-C or SIGTERM: stop taking jobs, finish those in flight (up to 25 s), then stop HTTP.
    // A second one ends the program at once.
    std::promise<void> stop;
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int) {
      if (ec) return;
      stop.set_value();
      signals.async_wait([](const boost::system::error_code& again, int) {
        if (!again) std::_Exit(130);
      });
    });
    std::thread http_thread([&server] { server.run(); });
    stop.get_future().wait();
    const bool drained = service.shutdown(std::chrono::seconds(25));
    server.stop();
    http_thread.join();
    std::cout << (drained ? "stopped" : "stopped, with jobs left in tour.db for next time")
              << std::endl;
  } catch (const rebound::Error& e) {  // a port in use, a store it cannot open, ...
    std::cerr << "rebound-tour: " << e.what() << std::endl;
    status = 1;
  }  // the service and its transport end here, while the io loop still runs
  inference.join();
  work.reset();
  io_thread.join();
  return status;
}

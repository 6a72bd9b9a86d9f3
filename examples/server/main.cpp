// rebound-server: the library wired into a runnable server (DESIGN.md's command line).
#include <csignal>
#include <future>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>

#include "rebound/error.hpp"
#include "rebound/http_transport.hpp"
#include "rebound/memory_job_store.hpp"
#include "rebound/model.hpp"
#include "rebound/server.hpp"
#include "rebound/service.hpp"
#include "rebound/version.hpp"
#include "rebound/webhook_signature.hpp"

namespace {

int default_port() {
  if (const char* env = std::getenv("SAGEMAKER_BIND_TO_PORT")) {
    try {
      const int port = std::stoi(env);
      if (port > 0 && port < 65536) return port;
    } catch (const std::exception&) {
    }
    std::cerr << "rebound-server: ignoring SAGEMAKER_BIND_TO_PORT='" << env << "'\n";
  }
  return 8080;
}

std::unique_ptr<rebound::JobStore> make_store(const std::string& uri) {
  if (uri == "memory") return std::make_unique<rebound::MemoryJobStore>();
  throw rebound::Error("unsupported --store '" + uri + "': this build supports memory");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rebound-server: asynchronous inference with callback delivery"};
  app.set_version_flag("--version", std::string("rebound ") + rebound::version);
  std::string host = "0.0.0.0";
  int port = default_port();
  std::string model_spec = "echo";
  std::string store_uri = "memory";
  std::size_t workers = std::max(2u, std::thread::hardware_concurrency());
  std::size_t queue_capacity = 10000;
  int max_tries = 5;
  std::string signing_secret;
  bool allow_private = false;
  std::size_t http_threads = 64;

  // `serve` is what SageMaker passes (docker run image serve); options may follow it.
  app.add_subcommand("serve", "Run the server (how SageMaker starts a container); the default")
      ->fallthrough();
  app.require_subcommand(0, 1);
  app.add_option("--host", host, "Address to listen on")->capture_default_str();
  app.add_option("--port", port, "Port to listen on (default: $SAGEMAKER_BIND_TO_PORT, else 8080)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--model", model_spec, "Model: echo, or sleep:<seconds> (answers \"OK\")")
      ->capture_default_str();
  app.add_option("--store", store_uri, "Job store: memory")->capture_default_str();
  app.add_option("--workers", workers, "Inferences run at once")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}))
      ->capture_default_str();
  app.add_option("--queue-capacity", queue_capacity,
                 "Jobs in flight at once (accepted, not yet delivered); beyond it 503 queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000000}))
      ->capture_default_str();
  app.add_option("--max-tries", max_tries, "Callback attempts per job before giving up")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--signing-secret", signing_secret,
                 "Sign callbacks (Standard Webhooks) with this whsec_... secret");
  app.add_flag("--allow-private-callbacks", allow_private,
               "Allow callbacks to loopback and private addresses (development and tests)");
  app.add_option("--http-threads", http_threads, "HTTP connections served at once")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    if (!signing_secret.empty() && !rebound::is_valid_webhook_secret(signing_secret)) {
      throw rebound::Error("--signing-secret must look like whsec_<base64>");
    }
    auto model = rebound::make_builtin_model(model_spec);
    const std::string model_name = model->name();

    boost::asio::thread_pool inference(workers);
    boost::asio::io_context io;
    auto io_work = boost::asio::make_work_guard(io);
    std::thread io_thread([&io] { io.run(); });

    rebound::AddressGuard guard(allow_private);
    rebound::ServiceOptions service_options;
    service_options.workers = workers;
    service_options.queue_capacity = queue_capacity;
    service_options.delivery.backoff = rebound::backoff::default_policy(max_tries);
    service_options.delivery.signing_secret = signing_secret;
    rebound::HttpTransportOptions transport_options;
    transport_options.guard = guard;
    rebound::Service service(inference.get_executor(), io.get_executor(), std::move(model),
                             make_store(store_uri),
                             std::make_unique<rebound::HttpTransport>(transport_options),
                             service_options);

    rebound::ServerOptions server_options;
    server_options.host = host;
    server_options.port = port;
    server_options.http_threads = http_threads;
    server_options.guard = guard;
    rebound::Server server(service, server_options);
    const int bound = server.bind();

    // SIGTERM/SIGINT: stop taking work (submissions and /ping get 503) while still answering
    // polls, finish what is in flight up to a deadline inside SageMaker's 30 s, then stop HTTP.
    std::promise<void> stop_requested;
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&stop_requested](const boost::system::error_code& ec, int) {
      if (!ec) stop_requested.set_value();
    });

    std::cout << "rebound-server " << rebound::version << " listening on " << host << ":" << bound
              << " (model " << model_name << ", store " << store_uri << ", workers " << workers
              << ")" << std::endl;
    std::thread http_thread([&server] { server.run(); });
    stop_requested.get_future().wait();

    std::cout << "rebound-server: stopping, finishing jobs in flight" << std::endl;
    if (!service.shutdown(std::chrono::seconds(25))) {
      std::cerr << "rebound-server: jobs still in flight at the deadline; with the memory store "
                   "they are lost\n";
    }
    server.stop();
    http_thread.join();
    inference.join();  // only inferences already running remain
    io_work.reset();
    io.stop();
    io_thread.join();
    return 0;
  } catch (const rebound::Error& e) {
    std::cerr << "rebound-server: " << e.what() << "\n";
    return 2;
  }
}

// rebound in one file: your model behind the HTTP API, jobs kept in SQLite, signed callbacks
// retried with the default policy, and a clean stop on Ctrl-C or SIGTERM.
// Usage: rebound-tour [PORT]   (8080 by default; the README shows two curl lines to try)
#include <cstdlib>
#include <iostream>

#include <rebound/rebound.hpp>

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

int main(int argc, char** argv) try {
  rebound::JobQueueOptions options;
  options.max_batch_size = 16;  // a model with predict_batch gets up to 16 inputs at once
  // Callbacks are signed (Standard Webhooks) with the spec's example secret: make your own with
  // `echo whsec_$(openssl rand -base64 32)`. Retries: exponential with jitter, 5 tries.
  options.delivery.signing_secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  rebound::JobQueue queue(std::make_unique<Sentiment>(), rebound::make_store("sqlite:tour.db"),
                          options);  // 4 inference threads and an io thread, owned by the queue
  rebound::Server server(queue, {"127.0.0.1", argc > 1 ? std::atoi(argv[1]) : 8080});
  std::cout << "rebound-tour listening on 127.0.0.1:" << server.bind() << std::endl;
  // Ctrl-C or SIGTERM: stop taking jobs, finish those in flight (up to 25 s), stop HTTP. A second
  // signal ends the wait at once; jobs not run stay in tour.db for the next start.
  const bool drained = server.run_until_signal() == 0;
  std::cout << (drained ? "stopped" : "stopped, with jobs left in tour.db") << std::endl;
  return 0;
} catch (const rebound::Error& e) {  // a port in use, a store it cannot open, ...
  std::cerr << "rebound-tour: " << e.what() << std::endl;
  return 1;
}

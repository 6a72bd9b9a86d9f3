// A custom Model served by rebound: derive from rebound::Model, hand it to a JobQueue, serve it.
// Run: rebound-custom-model [port], then POST {"id":"a","input":{"text":"hello world"}}.
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "rebound/http/server.hpp"
#include "rebound/job_queue.hpp"

// Counts the words of {"text": "..."}. Stateless, so thread-safe as Model requires.
class WordCountModel final : public rebound::Model {
 public:
  std::string name() const override { return "word-count"; }
  rebound::Prediction predict(const nlohmann::json& input) override {
    if (!input.is_object() || !input.contains("text") || !input["text"].is_string()) {
      return rebound::Prediction::failure("invalid_input", "input must be {\"text\": string}");
    }
    std::istringstream words(input["text"].get<std::string>());
    std::size_t count = 0;
    for (std::string word; words >> word;)
      ++count;
    return rebound::Prediction::success({{"words", count}});
  }
};

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 8080;
  rebound::JobQueueOptions options;
  options.workers = 2;
  rebound::JobQueue queue(std::make_unique<WordCountModel>(), nullptr, options);  // memory store
  rebound::Server server(queue, {"127.0.0.1", port});
  std::cout << "word-count model on 127.0.0.1:" << server.bind() << std::endl;
  return server.run_until_signal();  // Ctrl-C or SIGTERM: drain, then stop
}

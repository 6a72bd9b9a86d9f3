// A custom Model served by rebound: derive from rebound::Model, hand it to a JobQueue, serve it.
// Run: rebound-custom-model [port], then POST {"id":"a","input":{"text":"hello world"}}.
#include <iostream>
#include <sstream>
#include <string>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "rebound/http/curl_transport.hpp"
#include "rebound/http/server.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/store/memory_job_store.hpp"

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
  boost::asio::thread_pool inference(2);
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread([&io] { io.run(); });

  rebound::JobQueue service(inference.get_executor(), io.get_executor(),
                           std::make_unique<WordCountModel>(),
                           std::make_unique<rebound::MemoryJobStore>(),
                           std::make_unique<rebound::CurlTransport>(io.get_executor()));
  rebound::Server server(service, {"127.0.0.1", port});
  std::cout << "word-count model on 127.0.0.1:" << server.bind() << std::endl;
  server.run();  // until the process is stopped

  work.reset();
  io_thread.join();
  return 0;
}

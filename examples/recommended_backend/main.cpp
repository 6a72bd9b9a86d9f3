// The recommended shape of a model backend: loads in the background (ready() gates /ping and
// submissions), warms up once loaded (warm_up: the queue is ready only after it), validates input
// before it is queued, prefers a batch size, and does real work per batch in predict_batch,
// checking between inputs whether its jobs were cancelled. Serves it with rebound until SIGINT or
// SIGTERM.
// Run: rebound-recommended-backend [port]
//      curl -d '{"text": "good service, great food"}' http://127.0.0.1:8080/invocations
#include <atomic>
#include <cctype>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rebound/http/server.hpp"
#include "rebound/job_queue.hpp"

// Scores text by a word list. The list is loaded once, then only read: predictions are
// thread-safe without a lock, as the Model contract asks.
class LexiconSentimentModel final : public rebound::Model {
 public:
  LexiconSentimentModel() {
    // A real backend reads its weights here; the server answers /ping 503 until this is done.
    loader_ = std::thread([this] {
      lexicon_ = {{"good", 1}, {"great", 2}, {"excellent", 3}, {"bad", -1}, {"awful", -3}};
      loaded_ = true;
    });
  }
  ~LexiconSentimentModel() override { loader_.join(); }

  std::string name() const override { return "lexicon-sentiment"; }
  bool ready() const override { return loaded_; }

  // Called once by the queue when ready() first says true (on a thread of the queue's own when
  // the model is still loading as the queue is built, else in its constructor), before any job
  // runs: a real backend runs a batch or two here so that the first requests do not pay for lazy
  // initialisation. /ping answers 503 until it returns; what it throws is logged, and the model
  // serves all the same.
  void warm_up() override {
    const std::vector<nlohmann::json> sample{nlohmann::json{{"text", "good"}}};
    const auto answers = predict_batch(sample);
    if (!answers.front().ok() || answers.front().output()["score"] != 1) {
      throw std::runtime_error("the warm-up sentence was not scored as it should be");
    }
  }

  // Runs on the HTTP thread: a bad request gets its 422 before it takes a queue slot.
  std::optional<rebound::ErrorInfo> validate(const nlohmann::json& input) const override {
    if (!input.is_object() || !input.contains("text") || !input["text"].is_string()) {
      return rebound::ErrorInfo{"invalid_input", "must be {\"text\": string}"};
    }
    if (input["text"].get_ref<const std::string&>().size() > 100000) {
      return rebound::ErrorInfo{"invalid_input", "text is longer than 100,000 characters"};
    }
    return std::nullopt;
  }

  // Ask for batches of up to 64, waiting at most 2 ms for one to fill.
  rebound::BatchingPreference batching() const override {
    return {64, std::chrono::milliseconds(2)};
  }

  rebound::Prediction predict(const nlohmann::json& input) override {
    return std::move(predict_batch({input}).front());
  }

  // One prediction per input, in order; bad inputs fail alone, the rest of the batch goes on.
  std::vector<rebound::Prediction> predict_batch(
      const std::vector<nlohmann::json>& inputs) override {
    std::vector<rebound::Prediction> out;
    out.reserve(inputs.size());
    for (const auto& input : inputs) {
      // DELETE /v1/inferences/{id} on every job of this batch: their results will be thrown away,
      // so stop spending time on them. (A long model would check this inside its loops too.)
      if (rebound::cancellation_requested()) {
        out.resize(inputs.size(), rebound::Prediction::failure("cancelled", "not computed"));
        return out;
      }
      if (auto invalid = validate(input)) {
        out.push_back(rebound::Prediction::failure(invalid->code, invalid->message));
        continue;
      }
      std::istringstream words(input["text"].get<std::string>());
      int score = 0;
      for (std::string word; words >> word;) {
        while (!word.empty() && std::ispunct(static_cast<unsigned char>(word.back())))
          word.pop_back();
        for (auto& c : word)
          c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (auto it = lexicon_.find(word); it != lexicon_.end()) score += it->second;
      }
      const char* label = score > 0 ? "positive" : score < 0 ? "negative" : "neutral";
      out.push_back(rebound::Prediction::success({{"label", label}, {"score", score}}));
    }
    return out;
  }

 private:
  std::unordered_map<std::string, int> lexicon_;
  std::atomic<bool> loaded_{false};
  std::thread loader_;
};

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 8080;
  rebound::JobQueueOptions options;
  options.workers = 2;
  rebound::JobQueue queue(std::make_unique<LexiconSentimentModel>(), nullptr, options);
  rebound::Server server(queue, {"127.0.0.1", port});
  std::cout << "lexicon-sentiment on 127.0.0.1:" << server.bind() << std::endl;
  // SIGTERM or Ctrl-C: stop taking work, finish what is in flight (up to 25 s), then stop.
  server.run_until_signal();
  return 0;
}

// LogLines: the log lines a test hands its server a Logger for, kept to look at by event.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rebound/log.hpp"

namespace rebound::test {

/// Thread-safe: the server logs from any thread.
class LogLines {
 public:
  /// A logger at `level` whose lines this keeps (parsed) and as written.
  rebound::Logger logger(rebound::LogLevel level = rebound::LogLevel::info) {
    return rebound::Logger(level, [this](rebound::LogLevel, const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(line);
    });
  }
  /// The lines of one event, parsed.
  std::vector<nlohmann::json> of(const std::string& event) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<nlohmann::json> out;
    for (const auto& line : lines_) {
      nlohmann::json parsed = nlohmann::json::parse(line);
      if (parsed["event"] == event) out.push_back(std::move(parsed));
    }
    return out;
  }
  /// Whether any line holds `text` as written.
  bool mention(const std::string& text) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& line : lines_)
      if (line.find(text) != std::string::npos) return true;
    return false;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

}  // namespace rebound::test

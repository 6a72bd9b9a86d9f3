// ServersSeen: the servers that reported to a store kept in one process (memory, SQLite).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "rebound/store/job_store.hpp"

namespace rebound::detail {

/// Who reported (JobStore::report_server) in the last hour, at most 256 servers; the oldest
/// are forgotten first. Not thread-safe: its store locks around it.
class ServersSeen {
 public:
  void note(const std::string& id, std::size_t leases, std::chrono::system_clock::time_point now) {
    forget_before(now - std::chrono::hours(1));
    if (seen_.size() >= 256 && seen_.find(id) == seen_.end()) {
      auto oldest = std::min_element(seen_.begin(), seen_.end(), [](const auto& a, const auto& b) {
        return a.second.last_seen < b.second.last_seen;
      });
      seen_.erase(oldest);
    }
    seen_[id] = ServerSeen{id, now, leases};
  }

  std::vector<ServerSeen> list(std::chrono::system_clock::time_point now) const {
    std::vector<ServerSeen> out;
    for (const auto& [id, s] : seen_)
      if (s.last_seen >= now - std::chrono::hours(1)) out.push_back(s);
    std::sort(out.begin(), out.end(),
              [](const ServerSeen& a, const ServerSeen& b) { return a.last_seen > b.last_seen; });
    return out;
  }

 private:
  void forget_before(std::chrono::system_clock::time_point t) {
    for (auto it = seen_.begin(); it != seen_.end();)
      it = it->second.last_seen < t ? seen_.erase(it) : std::next(it);
  }
  std::map<std::string, ServerSeen> seen_;
};

}  // namespace rebound::detail

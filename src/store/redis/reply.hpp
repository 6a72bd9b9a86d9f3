// hiredis's replies and connections as owned values, and the two ways a command fails. Shared by
// the Redis store's client, codec and adapter (src/store/redis); not installed.
#pragma once

#include <hiredis.h>

#include <sys/time.h>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rebound::detail::redis {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

// A connection-level failure (I/O, timeout, protocol): the connection is given up.
struct ConnectionLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An error reply from Redis; the connection is fine.
struct ErrorReply : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

// A string, status or error reply's text; empty for anything else.
inline std::string_view text(const redisReply* r) {
  if (!r || !r->str) return {};
  return std::string_view(r->str, r->len);
}

// The leading decimal number of `s` (digits up to the first other character; 0 for none).
inline std::int64_t number(std::string_view s) {
  std::int64_t out = 0;
  const bool negative = !s.empty() && s.front() == '-';
  if (negative) s.remove_prefix(1);
  for (const char c : s) {
    if (c < '0' || c > '9') break;
    out = out * 10 + (c - '0');
  }
  return negative ? -out : out;
}

}  // namespace rebound::detail::redis

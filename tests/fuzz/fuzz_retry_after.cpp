// libFuzzer target: Retry-After parsing never crashes and never yields a negative delay.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/retry_after.hpp"
#include "rebound/delivery/callback_transport.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  const auto now = std::chrono::system_clock::from_time_t(1700000000);
  const auto delay = rebound::detail::parse_retry_after(value, now);
  if (delay && delay->count() < 0) std::abort();
  return 0;
}

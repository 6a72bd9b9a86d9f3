// The library's version, as macros and as a string for User-Agent headers.
#pragma once

#define REBOUND_VERSION_MAJOR 0
#define REBOUND_VERSION_MINOR 1
#define REBOUND_VERSION_PATCH 0
#define REBOUND_VERSION "0.1.0"

namespace rebound {
/// The library version, e.g. "0.1.0". Used in the `User-Agent: rebound/<version>` header.
inline constexpr const char* version = REBOUND_VERSION;
}  // namespace rebound

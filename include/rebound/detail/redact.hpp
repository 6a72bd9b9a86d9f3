// A store URI as logs and errors may show it: its password, if it names one, replaced.
#pragma once

#include <string>
#include <string_view>

namespace rebound::detail {

/// "scheme://user:secret@host/..." -> "scheme://user:***@host/..."; anything else as it is.
inline std::string redacted_uri(std::string_view uri) {
  std::string out(uri);
  const auto scheme = out.find("://");
  if (scheme == std::string::npos) return out;
  const auto start = scheme + 3;
  const auto end = out.find_first_of("/?#", start);
  const auto at = out.rfind('@', end == std::string::npos ? out.size() : end);
  if (at == std::string::npos || at < start) return out;
  const auto colon = out.find(':', start);
  if (colon == std::string::npos || colon > at) return out;
  return out.replace(colon + 1, at - colon - 1, "***");
}

}  // namespace rebound::detail

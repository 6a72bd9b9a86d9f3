// The operator console's static files (src/console), embedded at build time.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace rebound::detail {

struct ConsoleAsset {
  std::string_view name;  ///< the file name: served at /console/<name>
  const char* data;
  std::size_t size;
};

/// Every file of src/console, by name (cmake/embed_files.cmake writes its definition).
const std::vector<ConsoleAsset>& console_assets();

}  // namespace rebound::detail

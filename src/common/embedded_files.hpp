// Files compiled into the libraries at build time (cmake/embed_files.cmake): into rebound::http
// the operator console's static files (src/console) and the OpenAPI document
// (docs/openapi.json); into rebound::redis the store's Lua scripts (src/store/redis).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace rebound::detail {

struct EmbeddedFile {
  std::string_view name;  ///< the file name (a console file is served at /console/<name>)
  const char* data;
  std::size_t size;
};

/// Every file of src/console, by name.
const std::vector<EmbeddedFile>& console_assets();

/// docs/openapi.json, the document GET /openapi.json serves (with its version filled in).
const std::vector<EmbeddedFile>& openapi_files();

/// Every script of src/store/redis, by file name ("put.lua"): rebound::redis only.
const std::vector<EmbeddedFile>& redis_scripts();

}  // namespace rebound::detail

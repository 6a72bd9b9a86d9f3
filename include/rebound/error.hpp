// The one exception type rebound throws: configuration errors a caller must fix.
#pragma once

#include <stdexcept>
#include <string>

namespace rebound {

/// Thrown for configuration mistakes (a bad model spec, a zero capacity, an unusable option).
/// Expected runtime outcomes (a full queue, a failed delivery, a bad request) are values instead.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace rebound

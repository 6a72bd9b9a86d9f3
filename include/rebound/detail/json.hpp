// Internal: JSON that came from a client or a model, handled without recursion or exceptions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rebound {

/// The deepest nesting of arrays and objects accepted anywhere (request bodies, model outputs).
/// nlohmann::json parses iteratively but copies, compares and serialises recursively: a bound here
/// keeps every later step's stack use small.
inline constexpr std::size_t max_json_depth = 128;

namespace detail {

/// True when `text` nests arrays and objects deeper than `max_depth`. A linear scan of the bytes
/// (brackets outside strings), run before anything builds a tree; meaningful for valid JSON and
/// harmless for anything else, which the parser then refuses.
inline bool json_text_deeper_than(std::string_view text, std::size_t max_depth) {
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) return true;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return false;
}

/// True when the tree `value` nests deeper than `max_depth`; iterative, for values a model built.
inline bool json_deeper_than(const nlohmann::json& value, std::size_t max_depth) {
  if (!value.is_structured()) return false;
  std::vector<std::pair<const nlohmann::json*, std::size_t>> pending{{&value, 1}};
  while (!pending.empty()) {
    const auto [node, depth] = pending.back();
    pending.pop_back();
    if (depth > max_depth) return true;
    for (const auto& child : *node) {
      if (child.is_structured()) pending.emplace_back(&child, depth + 1);
    }
  }
  return false;
}

/// How parsing untrusted text ended.
enum class JsonParseError { none, invalid, too_deep };

/// Parses `text` into `out` unless it is not JSON or nests deeper than max_json_depth.
/// Never throws.
inline JsonParseError parse_untrusted_json(std::string_view text, nlohmann::json& out) {
  if (json_text_deeper_than(text, max_json_depth)) return JsonParseError::too_deep;
  out = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return out.is_discarded() ? JsonParseError::invalid : JsonParseError::none;
}

/// Serialises `value` compactly; invalid UTF-8 in strings (from a path or a model) becomes U+FFFD
/// instead of an exception.
inline std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace detail
}  // namespace rebound

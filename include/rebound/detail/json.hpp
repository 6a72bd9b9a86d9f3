// Internal: JSON that came from a client or a model, handled without recursion or exceptions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rebound::detail {

/// The deepest nesting of arrays and objects accepted anywhere (request bodies, model outputs).
/// nlohmann::json parses iteratively but copies, compares and serialises recursively: a bound here
/// keeps every later step's stack use small.
inline constexpr std::size_t max_json_depth = 128;

/// The most a parsed body may cost, counting each value 1 and each array, object and object
/// member 4 more: the tree nlohmann::json builds takes 16 to 100 bytes a value, so this holds
/// one body's tree near 32 MiB whatever its shape (`[{},{},...]` would take 40 times its size).
inline constexpr std::size_t json_cost_limit = 1000000;

/// What a linear scan of JSON text finds before anything builds a tree.
struct JsonTextShape {
  std::size_t depth = 0;  ///< the deepest nesting of arrays and objects
  std::size_t cost =
      0;  ///< values, with arrays, objects and members weighted (see json_cost_limit)
};

/// Scans the bytes of `text` (brackets, commas and colons outside strings), stopping as soon as
/// `max_depth` or `max_cost` is passed. Meaningful for valid JSON and harmless for anything
/// else, which the parser then refuses.
inline JsonTextShape scan_json_text(std::string_view text, std::size_t max_depth,
                                    std::size_t max_cost) {
  JsonTextShape shape;
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  shape.cost = 1;
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
        shape.cost += 4;  // a vector or a map of its own
        if (++depth > shape.depth) shape.depth = depth;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      case ',':
        shape.cost += 1;  // one more value
        break;
      case ':':
        shape.cost += 3;  // a map node and its key
        break;
      default:
        break;
    }
    if (shape.depth > max_depth || shape.cost > max_cost) break;
  }
  return shape;
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

/// About how many bytes of heap `value` holds: nodes, strings, object keys, and the allocator's
/// overhead per block (an estimate: it bounds MemoryJobStore's budget, not a measurement).
/// Iterative, like json_deeper_than.
inline std::size_t json_footprint(const nlohmann::json& value) {
  constexpr std::size_t per_block = 16;  // malloc's bookkeeping and rounding, roughly
  auto text = [](const std::string& s) {
    return s.capacity() > 15 ? s.capacity() + 1 + per_block : 0;  // past the small-string buffer
  };
  std::size_t bytes = sizeof(nlohmann::json);
  std::vector<const nlohmann::json*> pending{&value};
  while (!pending.empty()) {
    const nlohmann::json* node = pending.back();
    pending.pop_back();
    if (node->is_string()) {
      bytes += sizeof(std::string) + per_block + text(node->get_ref<const std::string&>());
    } else if (node->is_array()) {
      bytes += sizeof(nlohmann::json::array_t) + per_block + node->size() * sizeof(nlohmann::json);
      for (const auto& child : *node)
        pending.push_back(&child);
    } else if (node->is_object()) {
      bytes += sizeof(nlohmann::json::object_t) + per_block;
      for (auto it = node->begin(); it != node->end(); ++it) {
        // One red-black tree node per member: the key, the value, three pointers and a colour.
        bytes += sizeof(std::string) + sizeof(nlohmann::json) + 4 * sizeof(void*) + per_block +
                 text(it.key());
        pending.push_back(&it.value());
      }
    } else if (node->is_binary()) {
      bytes += sizeof(nlohmann::json::binary_t) + per_block + node->get_binary().size();
    }
  }
  return bytes;
}

/// How parsing untrusted text ended.
enum class JsonParseError { none, invalid, too_deep, too_complex };

/// Parses `text` into `out` unless it is not JSON, nests deeper than max_json_depth or costs
/// more than `max_cost`. Never throws.
inline JsonParseError parse_untrusted_json(std::string_view text, nlohmann::json& out,
                                           std::size_t max_cost = json_cost_limit) {
  const JsonTextShape shape = scan_json_text(text, max_json_depth, max_cost);
  if (shape.depth > max_json_depth) return JsonParseError::too_deep;
  if (shape.cost > max_cost) return JsonParseError::too_complex;
  out = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return out.is_discarded() ? JsonParseError::invalid : JsonParseError::none;
}

/// Serialises `value` compactly; invalid UTF-8 in strings (from a path or a model) becomes U+FFFD
/// instead of an exception.
inline std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace rebound::detail

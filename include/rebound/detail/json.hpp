// Internal: JSON that came from a client or a model, handled without recursion or exceptions.
#pragma once

#include <algorithm>
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

/// How much larger than its text a request body's tree may be (json_amplification_floor aside),
/// as scan_json_text estimates it: `[0,0,...]` 16 times its text, records like
/// `[{"x":1,"y":2},...]` 24, `[[0],[0],...]` 28; `[[],[],...]` and `[{},{},...]` 37.
inline constexpr std::size_t json_amplification_limit = 32;
/// The tree size any body may have, whatever its length.
inline constexpr std::size_t json_amplification_floor = std::size_t{1} << 20;

/// What a linear scan of JSON text finds before anything builds a tree.
struct JsonTextShape {
  std::size_t depth = 0;  ///< the deepest nesting of arrays and objects
  std::size_t cost =
      0;  ///< values, with arrays, objects and members weighted (see json_cost_limit)
  /// About the bytes of heap the tree will take (as json_footprint counts them, with a vector's
  /// spare room at its largest): each value's place, each container, member and string.
  std::size_t bytes = 0;
};

/// Scans the bytes of `text` (brackets, commas and colons outside strings), stopping as soon as
/// `max_depth` or `max_cost` is passed. Meaningful for valid JSON and harmless for anything
/// else, which the parser then refuses.
inline JsonTextShape scan_json_text(std::string_view text, std::size_t max_depth,
                                    std::size_t max_cost) {
  constexpr std::size_t place = 2 * sizeof(nlohmann::json);  // a value in a vector with spare room
  constexpr std::size_t container = 48;                      // a vector or a map, and its block
  constexpr std::size_t member = 48;  // a map node: links, its block (its key: the string before)
  constexpr std::size_t string = 48;  // a string value's own object and block
  constexpr std::size_t sso = 15;     // longer strings take a block for their characters
  std::size_t length = 0;             // of the string being scanned
  JsonTextShape shape;
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  shape.cost = 1;
  shape.bytes = sizeof(nlohmann::json);
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        if (length > sso) shape.bytes += length + 17;
        continue;
      }
      ++length;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        length = 0;
        shape.bytes += string;
        break;
      case '[':
      case '{':
        shape.cost += 4;                   // a vector or a map of its own
        shape.bytes += container + place;  // and the place of its first value
        if (++depth > shape.depth) shape.depth = depth;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      case ',':
        shape.cost += 1;  // one more value
        shape.bytes += place;
        break;
      case ':':
        shape.cost += 3;        // a map node and its key
        shape.bytes += member;  // with the key's 48 counted as a string's
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
      // What the vector reserved, not what it holds: a parser's push_back leaves up to twice.
      bytes += sizeof(nlohmann::json::array_t) + per_block +
               node->get_ref<const nlohmann::json::array_t&>().capacity() * sizeof(nlohmann::json);
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
enum class JsonParseError { none, invalid, too_deep, too_complex, amplifying };

/// The most bytes the tree of a `size`-byte body may take (json_amplification_limit).
inline std::size_t json_tree_limit(std::size_t size) {
  return std::max(json_amplification_floor, size * json_amplification_limit);
}

/// Parses `text` into `out` unless it is not JSON, nests deeper than max_json_depth, costs more
/// than `max_cost`, or (with `limit_amplification`, for request bodies) its tree would take more
/// than json_tree_limit of its size. Never throws. `shape_out`: what the scan found.
inline JsonParseError parse_untrusted_json(std::string_view text, nlohmann::json& out,
                                           std::size_t max_cost = json_cost_limit,
                                           bool limit_amplification = false,
                                           JsonTextShape* shape_out = nullptr) {
  const JsonTextShape shape = scan_json_text(text, max_json_depth, max_cost);
  if (shape_out) *shape_out = shape;
  if (shape.depth > max_json_depth) return JsonParseError::too_deep;
  if (shape.cost > max_cost) return JsonParseError::too_complex;
  if (limit_amplification && shape.bytes > json_tree_limit(text.size()))
    return JsonParseError::amplifying;
  out = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return out.is_discarded() ? JsonParseError::invalid : JsonParseError::none;
}

/// Serialises `value` compactly; invalid UTF-8 in strings (from a path or a model) becomes U+FFFD
/// instead of an exception.
inline std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace rebound::detail

// How a listing's cursor (ListCursor) reads in a URL: "<created ms>_<the id in hex>".
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "common/text.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound::detail {

/// The cursor as clients see it, naming the entry by `id` (the job's key, or its id without the
/// tenant where the caller's tenant is implied). Hex, so that any id makes a cursor that parses.
inline std::string list_cursor_text(const ListCursor& cursor, std::string_view id) {
  std::string text = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        cursor.created_at.time_since_epoch())
                                        .count()) +
                     "_";
  append_hex(text, id);
  return text;
}

/// A listing's `limit` as given: 1 to `max` in decimal digits; nullopt for anything else.
inline std::optional<std::size_t> parse_list_limit(const std::string& text, std::size_t max) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const std::size_t limit = std::stoul(text);
  if (limit < 1 || limit > max) return std::nullopt;
  return limit;
}

/// The cursor a list_cursor_text made, with the id as it was given; nullopt for anything else.
inline std::optional<ListCursor> parse_list_cursor_text(const std::string& text) {
  // At most 13 digits of milliseconds.
  const auto cut = text.find('_');
  if (cut == 0 || cut == std::string::npos || cut > 13 ||
      text.find_first_not_of("0123456789") != cut)
    return std::nullopt;
  const std::string hex = text.substr(cut + 1);
  if (hex.empty() || hex.size() % 2 != 0 || hex.size() > 2048 ||
      hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    return std::nullopt;
  std::string id;
  for (std::size_t i = 0; i < hex.size(); i += 2)
    id += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  // Within what the clock can hold (nanoseconds since 1970: the year 2262), so that no cursor
  // wraps around to a time before the caller's entries.
  const long long ms = std::stoll(text.substr(0, cut));
  constexpr long long latest = std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::time_point::max().time_since_epoch())
                                   .count();
  if (ms > latest) return std::nullopt;
  return ListCursor{std::chrono::system_clock::time_point(std::chrono::milliseconds(ms)),
                    std::move(id)};
}

}  // namespace rebound::detail

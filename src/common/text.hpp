// Internal: ASCII case-insensitive comparison for protocol tokens (header names and values, HTTP
// date names), independent of the process locale; bytes as lower-case hex.
#pragma once

#include <string>
#include <string_view>

namespace rebound::detail {

constexpr char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

/// True when `text` begins with `prefix`, letters compared without regard to case.
constexpr bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (ascii_lower(text[i]) != ascii_lower(prefix[i])) return false;
  }
  return true;
}

/// True when `a` and `b` are equal, letters compared without regard to case.
constexpr bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && starts_with_ignoring_case(a, b);
}

/// Appends each byte of `bytes` to `out` as two lower-case hex digits.
inline void append_hex(std::string& out, std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  for (const unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
}

}  // namespace rebound::detail

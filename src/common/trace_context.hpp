// Internal: W3C Trace Context (`traceparent`), checked on the way in and continued on callbacks.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace rebound::detail {

// True for a lower-case hex string of `n` characters that is not all zeros (when `nonzero`).
inline bool is_hex_field(std::string_view s, std::size_t n, bool nonzero) {
  if (s.size() != n) return false;
  bool any = false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    any = any || c != '0';
  }
  return any || !nonzero;
}

/// A `traceparent` header as W3C Trace Context level 1 defines it: "<version 2 hex, not ff>-
/// <trace-id 32 hex, not all zero>-<parent-id 16 hex, not all zero>-<flags 2 hex>", lower case.
/// Version 00 has nothing after the flags; a later version may add "-..." fields, ignored here.
inline bool is_valid_traceparent(std::string_view v) {
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return false;
  const std::string_view version = v.substr(0, 2);
  if (!is_hex_field(version, 2, false) || version == "ff") return false;
  if (version == "00" && v.size() != 55) return false;
  if (v.size() > 55 && (v[55] != '-' || v.size() > 512)) return false;
  return is_hex_field(v.substr(3, 32), 32, true) && is_hex_field(v.substr(36, 16), 16, true) &&
         is_hex_field(v.substr(53, 2), 2, false);
}

/// The trace id of a valid `traceparent` (32 hex characters).
inline std::string trace_id_of(std::string_view traceparent) {
  return std::string(traceparent.substr(3, 32));
}

/// Appends 16 random lower-case hex digits, not all zero (a span id, or half a trace id).
inline void append_random_hex16(std::string& out) {
  thread_local std::mt19937_64 random{std::random_device{}()};
  std::uint64_t bits = 0;
  while (bits == 0)
    bits = random();
  static constexpr char digits[] = "0123456789abcdef";
  for (int shift = 60; shift >= 0; shift -= 4)
    out += digits[(bits >> shift) & 0xf];
}

/// The `traceparent` of a request made on behalf of `parent` (a valid one): version 00, the same
/// trace id and flags, and a new random parent id (this request's span).
inline std::string child_traceparent(std::string_view parent) {
  std::string out = "00-";
  out.append(parent.substr(3, 32)).append("-");
  append_random_hex16(out);
  out.append("-").append(parent.substr(53, 2));
  return out;
}

/// A new trace's root `traceparent`: a random trace id and span id, sampled (flags 01).
inline std::string new_traceparent() {
  std::string out = "00-";
  append_random_hex16(out);
  append_random_hex16(out);
  out += '-';
  append_random_hex16(out);
  out += "-01";
  return out;
}

}  // namespace rebound::detail

// What the Redis store needs of the Redis Cluster protocol, as pure functions over text and
// replies: the slot of a key, the redirections (MOVED, ASK) and the slot map (CLUSTER SLOTS). No
// cluster client library is packaged in Debian bookworm; a store sends every call to one slot (its
// prefix's hash tag), so this is the part it needs, not a general client.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "store/redis/reply.hpp"

namespace rebound::detail::redis {

constexpr std::uint16_t kClusterSlots = 16384;

// CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys with.
inline std::uint16_t crc16(std::string_view bytes) {
  std::uint16_t crc = 0;
  for (const char byte : bytes) {
    crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(byte) << 8);
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<std::uint16_t>(crc << 1);
  }
  return crc;
}

// The slot Redis Cluster files `key` under: of the text between the first '{' and the first '}'
// after it when that is not empty (a hash tag), else of the whole key.
inline std::uint16_t key_slot(std::string_view key) {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(crc16(key) % kClusterSlots);
}

struct NodeAddress {
  std::string host;
  int port = 0;
  bool operator==(const NodeAddress& o) const { return port == o.port && host == o.host; }
  bool operator!=(const NodeAddress& o) const { return !(*this == o); }
  std::string text() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
           std::to_string(port);
  }
};

// "host:port" (the host may be an IPv6 address: the port follows the last ':'), or nullopt. An
// empty host (":port": a cluster that announces no address) is left empty: the node that answered.
inline std::optional<NodeAddress> parse_node(std::string_view s) {
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == s.size() || s.size() - colon - 1 > 5) {
    return std::nullopt;
  }
  for (const char c : s.substr(colon + 1))
    if (c < '0' || c > '9') return std::nullopt;
  const auto port = number(s.substr(colon + 1));
  if (port < 1 || port > 65535) return std::nullopt;
  std::string_view host = s.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return NodeAddress{std::string(host), static_cast<int>(port)};
}

// A cluster's "MOVED <slot> <host:port>" (the slot lives there now) or "ASK <slot> <host:port>"
// (this one call goes there, after ASKING: the slot is moving).
struct Redirect {
  bool ask = false;
  std::uint16_t slot = 0;
  NodeAddress node;
};

inline std::optional<Redirect> parse_redirect(std::string_view error) {
  Redirect r;
  if (error.substr(0, 6) == "MOVED ") {
    error.remove_prefix(6);
  } else if (error.substr(0, 4) == "ASK ") {
    r.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const auto space = error.find(' ');
  if (space == std::string_view::npos || space == 0 || space > 5) return std::nullopt;
  for (const char c : error.substr(0, space))
    if (c < '0' || c > '9') return std::nullopt;
  const auto slot = number(error.substr(0, space));
  if (slot >= kClusterSlots) return std::nullopt;
  r.slot = static_cast<std::uint16_t>(slot);
  auto node = parse_node(error.substr(space + 1));
  if (!node) return std::nullopt;
  r.node = std::move(*node);
  return r;
}

// From a CLUSTER SLOTS reply ([[first, last, [host, port, id, ...], replica, ...], ...]), the
// master that serves `slot` (and its node id), and every node named. A node given with an empty
// host is `asked`'s host, as Redis documents; one given as "?" (a hostname it was told to prefer
// and has none of) is left out.
struct SlotMap {
  std::optional<NodeAddress> master;
  std::string master_id;
  std::vector<NodeAddress> nodes;
};

inline SlotMap read_slot_map(const redisReply* r, std::uint16_t slot, const std::string& asked) {
  SlotMap map;
  if (!r || r->type != REDIS_REPLY_ARRAY) return map;
  auto node_of = [&](const redisReply* n) -> std::optional<NodeAddress> {
    if (!n || n->type != REDIS_REPLY_ARRAY || n->elements < 2 ||
        n->element[1]->type != REDIS_REPLY_INTEGER || n->element[1]->integer < 1 ||
        n->element[1]->integer > 65535) {
      return std::nullopt;
    }
    std::string host(text(n->element[0]));
    if (host == "?") return std::nullopt;
    if (host.empty()) host = asked;
    return NodeAddress{std::move(host), static_cast<int>(n->element[1]->integer)};
  };
  for (std::size_t i = 0; i < r->elements; ++i) {
    const redisReply* range = r->element[i];
    if (!range || range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER) {
      continue;
    }
    const bool serves = range->element[0]->integer <= slot && slot <= range->element[1]->integer;
    for (std::size_t n = 2; n < range->elements; ++n) {
      auto node = node_of(range->element[n]);
      if (!node) continue;
      if (serves && n == 2) {
        map.master = *node;
        if (range->element[n]->elements > 2) map.master_id = text(range->element[n]->element[2]);
      }
      bool known = false;
      for (const auto& k : map.nodes)
        known = known || k == *node;
      if (!known) map.nodes.push_back(std::move(*node));
    }
  }
  return map;
}

}  // namespace rebound::detail::redis

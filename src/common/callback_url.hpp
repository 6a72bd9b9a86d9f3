// Parsing of callback URLs: absolute http:// or https:// URLs, split into what a client needs.
#pragma once

#include <cctype>
#include <optional>
#include <string>
#include <string_view>

namespace rebound::detail {

/// A callback URL taken apart. `host` has no brackets, even for IPv6 literals.
struct CallbackUrl {
  std::string scheme;  ///< "http" or "https"
  std::string host;    ///< lower-case name, or an IP literal
  int port = 0;        ///< explicit, or 80 / 443 from the scheme
  std::string target;  ///< path and query, at least "/"

  bool host_is_ipv6() const { return host.find(':') != std::string::npos; }
  /// "scheme://host:port", with brackets around an IPv6 host: the key for connection reuse.
  std::string origin() const {
    return scheme + "://" + (host_is_ipv6() ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

/// The result of parse_callback_url: a URL, or a sentence saying what is wrong with it.
struct CallbackUrlParse {
  std::optional<CallbackUrl> url;
  std::string error;
};

/// Longest callback URL accepted, in bytes.
inline constexpr std::size_t max_callback_url_length = 2048;

/// Parses an absolute `http://` or `https://` URL. Refused: other schemes, credentials in the URL,
/// fragments, whitespace and control characters, an empty host, a host name DNS cannot hold
/// (a label over 63 bytes, a name over 253), a port outside 1..65535, and URLs longer than
/// `max_callback_url_length` as given (a submission's is held to it as sent too: sent_length).
/// Bytes past ASCII are accepted in the path and query (UTF-8, as a browser's address bar takes
/// them) and sent percent-encoded (as_sent).
inline CallbackUrlParse parse_callback_url(std::string_view text) {
  auto fail = [](std::string why) { return CallbackUrlParse{std::nullopt, std::move(why)}; };
  if (text.empty()) return fail("must not be empty");
  if (text.size() > max_callback_url_length) return fail("is longer than 2048 characters");
  for (unsigned char c : text) {
    if (c <= 0x20 || c == 0x7f) return fail("must not contain spaces or control characters");
  }
  CallbackUrl url;
  const auto scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos)
    return fail("must be an absolute http:// or https:// URL");
  for (char c : text.substr(0, scheme_end))
    url.scheme += static_cast<char>(std::tolower(c));
  if (url.scheme != "http" && url.scheme != "https") {
    return fail("must use http or https, not '" + url.scheme + "'");
  }
  std::string_view rest = text.substr(scheme_end + 3);
  if (rest.find('#') != std::string_view::npos) return fail("must not contain a fragment (#)");
  const auto authority_end = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, authority_end);
  url.target =
      authority_end == std::string_view::npos ? "/" : std::string(rest.substr(authority_end));
  if (url.target[0] == '?') url.target = "/" + url.target;
  if (authority.find('@') != std::string_view::npos) {
    return fail("must not contain credentials (user@host)");
  }
  std::string_view host = authority;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) return fail("has an unterminated IPv6 address");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return fail("has text after the IPv6 address");
      port = after.substr(1);
      if (port.empty()) return fail("has an empty port");
    }
    if (host.find(':') == std::string_view::npos) return fail("has a bad IPv6 address");
  } else {
    const auto colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      host = authority.substr(0, colon);
      port = authority.substr(colon + 1);
      if (port.empty()) return fail("has an empty port");
    }
  }
  if (host.empty()) return fail("has no host");
  const bool bracketed = !authority.empty() && authority.front() == '[';
  for (char c : host) {
    // (ASCII only, whatever the process's locale: a name past ASCII is written in punycode)
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.' || c == '_' || c == '%' || (c == ':' && bracketed);
    if (!ok) return fail("has a bad character in its host");
  }
  for (char c : host)
    url.host += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // A name DNS cannot hold would fail every attempt to resolve it (RFC 1035: labels of at most
  // 63 bytes, names of at most 253 written out).
  if (!url.host_is_ipv6()) {
    // (253 without the root's dot: "example.com." is "example.com")
    const std::size_t written = url.host.size() - (url.host.back() == '.' ? 1 : 0);
    if (written > 253) return fail("has a host name longer than 253 characters");
    std::size_t label = 0;
    for (char c : url.host) {
      label = c == '.' ? 0 : label + 1;
      if (label > 63) return fail("has a host name part (between dots) longer than 63 characters");
    }
  }
  if (!port.empty()) {
    if (port.size() > 5) return fail("has a port outside 1..65535");
    int value = 0;
    for (char c : port) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return fail("has a non-numeric port");
      value = value * 10 + (c - '0');
    }
    if (value < 1 || value > 65535) return fail("has a port outside 1..65535");
    url.port = value;
  } else {
    url.port = url.scheme == "https" ? 443 : 80;
  }
  return CallbackUrlParse{std::move(url), {}};
}

/// The length of `url` as sent (as_sent): three bytes for each byte past ASCII.
inline std::size_t sent_length(std::string_view url) {
  std::size_t n = 0;
  for (unsigned char c : url)
    n += c < 0x80 ? 1 : 3;
  return n;
}

/// The URL as a request names it: each byte past ASCII (only a path or query may hold one)
/// percent-encoded, as a browser sends an address typed with them; the rest as it is. An
/// HTTP request line is ASCII (RFC 9112), and a receiver may refuse raw UTF-8 in it.
inline std::string as_sent(std::string_view url) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(url.size());
  for (unsigned char c : url) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace rebound::detail

// Internal: the request and response of the server's routes (see http_message.hpp).
#include "http_message.hpp"

#include <boost/beast/core/string.hpp>

#include <iterator>

namespace rebound::detail {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string percent_decode(std::string_view text, bool plus_is_space, bool keep_slash) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      const int high = hex_value(text[i + 1]), low = hex_value(text[i + 2]);
      if (high >= 0 && low >= 0 && !(keep_slash && high * 16 + low == '/')) {
        out += static_cast<char>(high * 16 + low);
        i += 2;
        continue;
      }
    }
    out += plus_is_space && c == '+' ? ' ' : c;
  }
  return out;
}

HttpRequest::HttpRequest(Message message) : message_(std::move(message)) {
  method = std::string(message_.method_string());
  std::string_view target(message_.target().data(), message_.target().size());
  // The absolute form (RFC 9112 3.2.2: "GET http://host/ping"), which a server must accept:
  // routed by its path.
  for (const std::string_view scheme : {"http://", "https://"}) {
    if (target.size() > scheme.size() &&
        boost::beast::iequals(boost::beast::string_view(target.data(), scheme.size()),
                              boost::beast::string_view(scheme.data(), scheme.size()))) {
      const std::size_t path_at = target.find_first_of("/?", scheme.size());
      target = path_at == std::string_view::npos ? std::string_view() : target.substr(path_at);
      break;
    }
  }
  const std::size_t question = target.find('?');
  // Each segment decoded alone: an escaped '/' stays escaped, part of its segment, so that
  // "/v1%2Fstats" is no route's path (a proxy that matches the raw path would let it by, and the
  // routes would read /v1/stats). An absolute form without a path ("http://host?x") is "/".
  path = percent_decode(target.substr(0, question), false, /*keep_slash=*/true);
  if (path.empty()) path = "/";
  if (question == std::string_view::npos) return;
  std::string_view query = target.substr(question + 1);
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    params_.emplace(
        percent_decode(pair.substr(0, eq), true),
        eq == std::string_view::npos ? std::string() : percent_decode(pair.substr(eq + 1), true));
  }
}

std::string HttpRequest::header(std::string_view name, std::size_t index) const {
  const auto range = message_.equal_range(boost::beast::string_view(name.data(), name.size()));
  for (auto it = range.first; it != range.second; ++it) {
    if (index-- == 0) return std::string(it->value());
  }
  return {};
}

std::size_t HttpRequest::header_count(std::string_view name) const {
  return message_.count(boost::beast::string_view(name.data(), name.size()));
}

std::string HttpRequest::param(const std::string& name) const {
  const auto it = params_.find(name);
  return it == params_.end() ? std::string() : it->second;
}

const std::string* HttpRequest::repeated_param() const {
  // (A multimap keeps equal names side by side. No route reads an empty name: "=1&=2" is no
  // ambiguity.)
  for (auto it = params_.begin(); it != params_.end(); ++it) {
    const auto next = std::next(it);
    if (next != params_.end() && next->first == it->first && !it->first.empty()) return &it->first;
  }
  return nullptr;
}

void HttpResponse::set_header(std::string name, std::string value) {
  headers.emplace_back(std::move(name), std::move(value));
}

}  // namespace rebound::detail

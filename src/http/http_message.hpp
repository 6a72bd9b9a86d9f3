// Internal: one HTTP request and its response as the server's routes read and write them, over
// Boost.Beast's messages (the path decoded, the query parsed, headers looked up without case).
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rebound::detail {

/// A request as read (Beast's message), with its target split into a percent-decoded path and
/// its query parameters. Header names are matched without case, as HTTP says.
class HttpRequest {
 public:
  using Message = boost::beast::http::request<boost::beast::http::string_body>;

  HttpRequest() = default;
  explicit HttpRequest(Message message);

  const Message& message() const { return message_; }

  /// The method as sent ("GET"), the path percent-decoded ('+' kept), the body as read.
  std::string method;
  std::string path;
  const std::string& body() const { return message_.body(); }

  /// The value of header `name` (its `index`th when it repeats), or "" when absent.
  std::string header(std::string_view name, std::size_t index = 0) const;
  std::size_t header_count(std::string_view name) const;
  bool has_header(std::string_view name) const { return header_count(name) > 0; }

  /// A query parameter ('+' and %XX decoded), its first value; "" when absent.
  std::string param(const std::string& name) const;
  bool has_param(const std::string& name) const { return params_.count(name) > 0; }
  /// The name of a query parameter given more than once ("a=1&a=2"), or nullptr; empty names
  /// are not counted. A route reads one value, and a proxy or a cache before it may read
  /// another: such a query is refused.
  const std::string* repeated_param() const;

 private:
  Message message_;
  std::multimap<std::string, std::string> params_;
};

/// The answer a route builds: status, headers, body. Serialized with Content-Length.
struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type;  ///< "" with an empty body: no Content-Type
  /// Headers besides Content-Type and Content-Length, in order.
  std::vector<std::pair<std::string, std::string>> headers;

  void set_header(std::string name, std::string value);
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_redirect(std::string location, int code) {
    status = code;
    set_header("Location", std::move(location));
  }
};

/// %XX decoded (and '+' as a space when `plus_is_space`); a malformed escape is kept as is, and
/// so is %2F when `keep_slash` (a path's segments are decoded each alone).
std::string percent_decode(std::string_view text, bool plus_is_space, bool keep_slash = false);

}  // namespace rebound::detail

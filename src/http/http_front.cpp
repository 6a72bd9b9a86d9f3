// Internal: rebound-server's HTTP/1.1 front on Boost.Beast (see http_front.hpp). Shaped after
// Beast's example/http/server/async: a session per connection on its own strand, which owns its
// tcp_stream, sets a deadline before every read and write, and keeps itself alive through the
// handlers it has pending (and, while a route holds its request, through a reference it drops
// when the answer comes or the front stops).
#include "http_front.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "common/text.hpp"
#include "rebound/error.hpp"

namespace rebound::detail {
namespace {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using std::chrono::milliseconds;

// A request line longer than this gets 414, and a header line longer than this 431, whatever
// room the head as a whole has left (as the docs have said since the cpp-httplib front).
constexpr std::size_t max_request_line = 8192;
constexpr std::size_t max_header_line = 8192;
// Bytes read at once while waiting for a request's first byte.
constexpr std::size_t first_read = 16 * 1024;

bool is_control(unsigned char c) {
  return (c < 0x20 && c != '\t') || c == 0x7f;
}

// The head as sent (before Beast's parser judged it): a control byte in a header line (NUL, a
// bare CR, DEL) is how requests get smuggled past proxies, refused by name.
bool control_in_head(std::string_view head) {
  for (std::size_t i = 0; i < head.size(); ++i) {
    const auto c = static_cast<unsigned char>(head[i]);
    if (c == '\r' && i + 1 < head.size() && head[i + 1] == '\n') {
      ++i;
      continue;
    }
    if (c == '\r' && i + 1 == head.size()) break;  // the rest of a line end not read yet
    if (is_control(c)) return true;
  }
  return false;
}

std::string peer_address(const tcp::socket& socket) {
  boost::system::error_code ec;
  const auto endpoint = socket.remote_endpoint(ec);
  return ec ? std::string() : endpoint.address().to_string();
}

}  // namespace

// Whether the front still runs its io_context: a Reply posts only while it does.
struct Liveness {
  std::mutex mutex;
  bool alive = true;
};

class Session;

struct Reply::State {
  std::weak_ptr<Session> session;
  std::shared_ptr<Liveness> liveness;
  bool answered = false;
  std::mutex mutex;  // guards the two below: the route sets one, the session the other
  std::function<void()> abandoned;
  bool gone = false;  // the client went away, or the front stopped, before the answer
};

namespace {
// Tells a route that its request's client is gone, once.
void abandon(const std::shared_ptr<Reply::State>& state) {
  std::function<void()> tell;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->gone) return;
    state->gone = true;
    tell = std::move(state->abandoned);
  }
  if (tell) tell();
}
}  // namespace

struct HttpFront::Impl {
  Impl(HttpLimits l, std::size_t t, HttpHandler h, HttpErrorBody e, HttpHeadCheck c)
      : limits(l),
        threads(std::max<std::size_t>(1, t)),
        handler(std::move(h)),
        errors(std::move(e)),
        head_check(std::move(c)),
        io(static_cast<int>(threads)),
        accept_strand(net::make_strand(io)),
        acceptor(accept_strand) {}

  void accept();
  // Counts a connection in; false (and nothing counted) when a cap refuses it.
  bool admit(const std::string& address);
  void leave(const std::string& address);
  void remember(const std::shared_ptr<Session>& session);
  void forget(Session* session);
  std::vector<std::shared_ptr<Session>> live_sessions();
  // Bytes of bodies being received: false when `bytes` more would pass the limit.
  bool reserve_receiving(std::size_t bytes);
  // Stops run() once every connection is gone or the grace is over.
  void finish_stopping(std::chrono::steady_clock::time_point until);

  // Declared before the io_context, so destroyed after it: a session that its handlers held
  // until then still counts itself out.
  const HttpLimits limits;
  const std::size_t threads;
  const HttpHandler handler;
  const HttpErrorBody errors;
  const HttpHeadCheck head_check;
  std::shared_ptr<Liveness> liveness = std::make_shared<Liveness>();
  std::atomic<bool> stopping{false};
  std::atomic<bool> running{false};
  std::atomic<int> port{0};
  std::atomic<std::size_t> open{0};
  std::atomic<std::size_t> receiving{0};
  std::mutex run_mutex;  // orders run() and stop()
  // A serve_bytes that runs the io_context itself (run() was not running) is a driver: run()
  // waits for it, then restarts the io_context, which ran out of work and stopped when that
  // connection ended (a stopped io_context would end every run() thread at once).
  std::condition_variable drivers_done;
  std::size_t drivers = 0;  // under run_mutex
  std::mutex mutex;         // guards the two maps below
  std::unordered_map<std::string, std::size_t> per_address;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  net::io_context io;
  // The acceptor, its retry timer and the stop's closing of it run on this strand only.
  net::strand<net::io_context::executor_type> accept_strand;
  tcp::acceptor acceptor;
  std::unique_ptr<net::steady_timer> accept_retry;
  std::unique_ptr<net::steady_timer> stop_timer;
};

// One connection: reads a request, hands it to the routes, writes their answer, and again.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // `eof_is_gone`: a client that stops sending while its request waits has gone away (a real
  // socket); serve_bytes' peer half-closes after its input and still reads.
  Session(HttpFront::Impl& front, tcp::socket socket, std::string address, bool eof_is_gone)
      : front_(front),
        limits_(front.limits),
        stream_(std::move(socket)),
        address_(std::move(address)),
        buffer_(limits_.max_head_bytes + first_read),
        body_timer_(stream_.get_executor()),
        eof_is_gone_(eof_is_gone) {}

  ~Session() {
    release_receiving();
    front_.leave(address_);
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // The front stops: a connection between requests, or still sending one, ends now; one whose
  // answer is under way or still to come ends after it. `force` (the front is going): a route
  // still holding a request hears it is abandoned, and the connection ends now.
  void stop(bool force) {
    net::dispatch(stream_.get_executor(), [self = shared_from_this(), force] {
      self->close_after_ = true;
      if (!force && (self->writing_ || self->awaiting_)) return;
      if (auto pending = self->pending_.lock()) abandon(pending);
      self->close();
    });
  }

  // A route's answer, on the session's strand.
  void answer(HttpResponse response) {
    auto self = std::move(awaiting_);
    pending_.reset();
    if (!self || closing_) return;
    write(std::move(response));
  }

  net::any_io_executor executor() { return stream_.get_executor(); }

 private:
  void read_request() {
    if (front_.stopping || closing_) return close();
    if (watching_) {
      // The watch's read ends first (cancelled: the next request may be in the buffer already,
      // and nothing more may come), then this goes on.
      read_after_watch_ = true;
      boost::system::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    parser_.emplace();
    chunked_head_.reset();
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<std::size_t>(limits_.max_head_bytes, std::numeric_limits<std::uint32_t>::max())));
    parser_->body_limit(limits_.max_body_bytes);
    request_started_ = false;
    body_read_ = false;
    if (buffer_.size() > 0) return read_head();
    // Idle until the first byte: a kept-alive or new connection gets keep_alive_timeout.
    stream_.expires_after(limits_.keep_alive_timeout);
    stream_.async_read_some(
        buffer_.prepare(first_read),
        [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
          if (ec) return self->close();
          self->buffer_.commit(n);
          self->read_head();
        });
  }

  void read_head() {
    request_started_ = true;
    stream_.expires_after(limits_.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](boost::system::error_code ec,
                                                        std::size_t n) { self->on_head(ec, n); });
  }

  std::string_view buffered() const {
    return {static_cast<const char*>(buffer_.data().data()), buffer_.size()};
  }

  // `head_bytes`: what the parser took for the request line and the headers.
  void on_head(boost::system::error_code ec, std::size_t head_bytes) {
    if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      return close();  // a head that never came whole: nothing to answer
    }
    if (ec == http::error::body_limit) {
      // A declared Content-Length over the limit: refused unread, also to a client that waits
      // for 100 Continue.
      return refuse(413, "payload_too_large");
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      // The request line alone over 8 KiB: 414; else the head as a whole: 431. The parser takes
      // a whole request line out of the buffer before it waits for the rest of the head, so the
      // line is judged by what it parsed when it got that far, else by the bytes buffered.
      const auto& partial = parser_->get();
      bool long_line = false;
      if (!partial.target().empty()) {
        long_line =
            partial.method_string().size() + 1 + partial.target().size() + 9 > max_request_line;
      } else {
        const std::string_view seen = buffered();
        const std::size_t line_end = seen.find("\r\n");
        long_line = line_end == std::string_view::npos ? seen.size() > max_request_line
                                                       : line_end > max_request_line;
      }
      return refuse(long_line ? 414 : 431, long_line ? "uri_too_long" : "header_too_large");
    }
    if (ec) {
      const std::string_view seen = buffered();
      const std::size_t head_end = seen.find("\r\n\r\n");
      return refuse(400,
                    control_in_head(seen.substr(0, head_end)) ? "invalid_header" : "bad_request");
    }
    // Beast bounds the request line and the header fields each by the limit, not the two
    // together: the head as a whole is measured here.
    if (head_bytes > limits_.max_head_bytes) return refuse(431, "header_too_large");
    const auto& message = parser_->get();
    version_ = message.version();  // (what the front answers itself answers in its version)
    // A request line over 8 KiB is refused whole, also when the rest of the head leaves room.
    if (message.method_string().size() + 1 + message.target().size() + 9 > max_request_line) {
      return refuse(414, "uri_too_long");
    }
    // A head Beast accepts may still hold a control byte it allows (obs-text aside), or a line
    // longer than a header line may be.
    for (const auto& field : message) {
      for (const char c : field.value()) {
        if (is_control(static_cast<unsigned char>(c))) return refuse(400, "invalid_header");
      }
      if (field.name_string().size() + 2 + field.value().size() > max_header_line) {
        return refuse(431, "header_too_large");
      }
    }
    // An HTTP/1.1 request names its host exactly once (RFC 9112 3.2): one without it, or with two,
    // is refused as a proxy in front would refuse it.
    const std::size_t hosts = message.count(http::field::host);
    if (hosts > 1 || (hosts == 0 && message.version() >= 11)) return refuse(400, "invalid_host");
    // Framing that another hop could read differently (request smuggling) gets one request per
    // connection: a chunked body, or more than one Content-Length.
    if (parser_->chunked() || message.count(http::field::content_length) > 1 ||
        message[http::field::content_length].find(',') != beast::string_view::npos) {
      close_after_ = true;
    }
    if (message.count(http::field::transfer_encoding) > 0 && !parser_->chunked()) {
      return refuse(400, "bad_request");
    }
    const auto length = parser_->content_length();
    if (length && *length > limits_.max_body_bytes) {
      // Refused unread, also to a client that waits for 100 Continue.
      return refuse(413, "payload_too_large");
    }
    if (parser_->is_done()) return dispatch();
    // A body on a request whose method takes none (GET, HEAD, DELETE, OPTIONS) is not read: the
    // request is answered and the connection ends, so that the body is never taken for the next
    // request, nor waited for.
    const auto method = message.method();
    if (method == http::verb::get || method == http::verb::head || method == http::verb::delete_ ||
        method == http::verb::options) {
      close_after_ = true;
      return dispatch_without_body();
    }
    // A body still to come is read only for a request the routes would take (its key): one
    // they refuse is answered now, the body unread, and holds no part of the budget below.
    if (front_.head_check && !(length && buffer_.size() >= *length)) {
      std::optional<HttpResponse> refusal;
      try {
        refusal = front_.head_check(HttpRequest(http::request<http::string_body>(message)));
      } catch (...) {
        refusal = front_.errors(500, "internal_error");
      }
      if (refusal) {
        close_after_ = true;
        head_ = false;
        awaiting_ = shared_from_this();
        return answer(std::move(*refusal));
      }
    }
    // Beast adds a chunked body's trailer fields to the head's (each after the head's field of
    // its name): the head is kept to be put back once the body is read.
    if (parser_->chunked()) chunked_head_ = message.base();
    // What bodies being received hold at once is bounded: a chunked one counts as the limit.
    const std::size_t expected =
        length ? static_cast<std::size_t>(*length) : limits_.max_body_bytes;
    if (!front_.reserve_receiving(expected)) return refuse(503, "server_busy");
    receiving_ = expected;
    // (An HTTP/1.0 client's expectation is ignored, RFC 9110 10.1.1: it may not know 1xx.)
    if (message.version() >= 11 && beast::iequals(message[http::field::expect], "100-continue")) {
      auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      stream_.expires_after(limits_.response_timeout);
      return net::async_write(
          stream_, net::buffer(*interim),
          [self = shared_from_this(), interim](boost::system::error_code ec, std::size_t) {
            if (ec) return self->close();
            self->read_body();
          });
    }
    read_body();
  }

  // The body within body_timeout, on a timer of its own: when it runs out the socket stays open
  // for the 408 (the stream's own deadline would close it).
  void read_body() {
    stream_.expires_never();
    body_timed_out_ = false;
    body_timer_.expires_after(limits_.body_timeout);
    body_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return;
      self->body_timed_out_ = true;
      boost::system::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                       self->body_timer_.cancel();
                       self->on_body(ec);
                     });
  }

  void on_body(boost::system::error_code ec) {
    if (body_timed_out_) return refuse(408, "request_timeout");
    if (ec == http::error::body_limit) return refuse(413, "payload_too_large");
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      return close();
    }
    // The buffer filled before a line of the body ended: a trailer's fields are header fields
    // (431, as a head too large), a chunk's size line (its extensions) is a body not read (400).
    if (ec == http::error::buffer_overflow && in_trailer()) return refuse(431, "header_too_large");
    if (ec) return refuse(400, "bad_request");
    // The routes read the head only: a trailer could otherwise bring the key (or a second
    // Host) after every check on the head.
    if (chunked_head_) {
      parser_->get().base() = std::move(*chunked_head_);
      chunked_head_.reset();
    }
    dispatch();
  }

  // Whether the bytes the parser left in the buffer begin with the last chunk's whole line ("0",
  // perhaps with extensions, after the CRLF that ends the chunk before): the parser keeps it there
  // until the trailer after it ends. (A last chunk's line that does not end is a chunk line.)
  bool in_trailer() const {
    std::string_view rest = buffered();
    if (rest.substr(0, 2) == "\r\n") rest.remove_prefix(2);
    const std::size_t zeros = rest.find_first_not_of('0');
    return zeros > 0 && zeros != std::string_view::npos &&
           (rest[zeros] == ';' || rest[zeros] == '\r') &&
           rest.find("\r\n", zeros) != std::string_view::npos;
  }

  // The head alone goes to the routes; the body stays unread (and the connection ends).
  void dispatch_without_body() {
    auto head = parser_->release();
    head.body().clear();
    dispatch(std::move(head), false);
  }

  void dispatch() { dispatch(parser_->release(), true); }

  void dispatch(http::request<http::string_body> message, bool body_read) {
    release_receiving();  // the body is the request's now: the routes count what it becomes
    body_read_ = body_read;
    ++served_;
    const bool keep =
        message.keep_alive() && !close_after_ && served_ < limits_.max_requests_per_connection;
    close_after_ = !keep;
    head_ = message.method() == http::verb::head;
    version_ = message.version();
    HttpRequest request(std::move(message));
    parser_.reset();
    auto state = std::make_shared<Reply::State>();
    state->session = weak_from_this();
    state->liveness = front_.liveness;
    pending_ = state;
    awaiting_ = shared_from_this();
    try {
      front_.handler(request, Reply(std::move(state)));
    } catch (...) {
      // The Reply was destroyed by the unwinding: it answered 500 already.
    }
    // An answer given at once is queued on this strand before this check runs; one given later
    // (a wait) is not, and then the client is watched: gone, it abandons its request.
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->watch_client(); });
  }

  // While a route holds the request, a read stays pending: a client that closes its end (or
  // resets) is gone, and the route hears so. Bytes it sends meanwhile (a pipelined request) are
  // kept for later, and the watch ends there. (A readiness wait cannot tell: Asio may complete
  // one at once, speculatively.) read_request waits for this read to end before its own.
  void watch_client() {
    if (!awaiting_ || closing_ || watching_ || !eof_is_gone_) return;
    const std::size_t room = std::min(first_read, buffer_.max_size() - buffer_.size());
    if (room == 0) return;
    watching_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(room),
        [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
          self->watching_ = false;
          self->buffer_.commit(n);
          if (self->closing_) return;
          if (ec && !(ec == net::error::operation_aborted && self->read_after_watch_)) {
            if (auto pending = self->pending_.lock()) abandon(pending);
            return self->close();
          }
          if (self->read_after_watch_) {
            self->read_after_watch_ = false;
            self->read_request();
          }
        });
  }

  // An answer the front gives itself; the connection ends after it.
  void refuse(int status, const std::string& code) {
    close_after_ = true;
    // A HEAD hears the status and the length, no body (when its request line was read).
    head_ = parser_ && parser_->get().method() == http::verb::head;
    awaiting_ = shared_from_this();
    answer(front_.errors(status, code));
  }

  void write(HttpResponse r) {
    auto message = std::make_shared<http::response<http::string_body>>();
    message->version(version_ == 10 ? 10 : 11);
    message->result(static_cast<unsigned>(r.status));
    for (auto& [name, value] : r.headers)
      message->insert(name, value);
    if (!r.content_type.empty()) message->set(http::field::content_type, r.content_type);
    // A 204 or 304 has no body and says no length (RFC 9110 8.6; prepare_payload would throw on
    // a body).
    const bool bodiless = r.status == 204 || r.status == 304;
    if (!bodiless) message->body() = std::move(r.body);
    message->prepare_payload();
    if (bodiless) message->erase(http::field::content_length);
    if (head_) message->body().clear();  // HEAD: the length of the GET's body, none of it
    message->keep_alive(!close_after_ && !front_.stopping);
    stream_.expires_after(limits_.response_timeout);
    writing_ = true;
    http::async_write(
        stream_, *message,
        [self = shared_from_this(), message](boost::system::error_code ec, std::size_t) {
          self->writing_ = false;
          if (ec) return self->close();
          if (self->close_after_ || self->front_.stopping) return self->finish();
          self->read_request();
        });
  }

  // Ends the connection after its last answer. When the peer may still be sending (an unread
  // body), stop sending and read and discard for a while (as nginx does), so that a client which
  // sends its whole body before reading (most do) sees the answer instead of a reset. Bounded:
  // 2 s, and the body limit plus 1 MiB.
  void finish() {
    boost::system::error_code ignored;
    if (!request_started_ || body_read_ || front_.stopping || watching_) return close();
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    drained_ = 0;
    stream_.expires_after(std::chrono::seconds(2));
    drain();
  }

  void drain() {
    buffer_.clear();
    stream_.async_read_some(
        buffer_.prepare(first_read),
        [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
          self->drained_ += n;
          if (ec || self->drained_ > self->limits_.max_body_bytes + (1u << 20)) {
            return self->close();
          }
          self->drain();
        });
  }

  void release_receiving() {
    if (receiving_ == 0) return;
    front_.receiving -= receiving_;
    receiving_ = 0;
  }

  void close() {
    closing_ = true;
    awaiting_.reset();
    release_receiving();
    body_timer_.cancel();
    boost::system::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    front_.forget(this);
  }

  HttpFront::Impl& front_;
  const HttpLimits& limits_;
  beast::tcp_stream stream_;
  const std::string address_;
  beast::flat_buffer buffer_;
  net::steady_timer body_timer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Session> awaiting_;    // itself, while a route holds its request
  std::weak_ptr<Reply::State> pending_;  // that request's Reply, to tell it when abandoned
  std::size_t served_ = 0;
  std::size_t drained_ = 0;
  std::size_t receiving_ = 0;  // bytes of receiving counted for the body being read
  std::optional<http::request_header<>> chunked_head_;  // the head of a chunked body being read
  unsigned version_ = 11;
  const bool eof_is_gone_;
  bool request_started_ = false;  // a byte of the current request arrived
  bool body_read_ = false;        // ... and it was read to its end
  bool body_timed_out_ = false;
  bool close_after_ = false;
  bool head_ = false;
  bool closing_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool read_after_watch_ = false;
};

// --- Reply

Reply& Reply::operator=(Reply&& other) noexcept {
  if (this != &other) {
    if (state_ && !state_->answered) (*this)(HttpResponse{500, {}, {}, {}});
    state_ = std::move(other.state_);
  }
  return *this;
}

Reply::~Reply() {
  if (state_ && !state_->answered) {
    HttpResponse failed;
    failed.status = 500;
    failed.set_content(
        R"({"error":{"code":"internal_error","message":"The server failed to handle the request."}})",
        "application/json");
    (*this)(std::move(failed));
  }
}

void Reply::operator()(HttpResponse response) {
  if (!state_ || state_->answered) return;
  state_->answered = true;
  std::lock_guard<std::mutex> lock(state_->liveness->mutex);
  if (!state_->liveness->alive) return;
  auto session = state_->session.lock();
  if (!session) return;
  auto executor = session->executor();
  net::post(executor, [session = std::move(session), response = std::move(response)]() mutable {
    session->answer(std::move(response));
  });
}

net::any_io_executor Reply::executor() const {
  if (!state_) return {};
  auto session = state_->session.lock();
  return session ? session->executor() : net::any_io_executor{};
}

void Reply::on_abandoned(std::function<void()> abandoned) {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->gone) {
      state_->abandoned = std::move(abandoned);
      return;
    }
  }
  abandoned();
}

// --- HttpFront::Impl

void HttpFront::Impl::accept() {
  acceptor.async_accept(net::make_strand(io), [this](boost::system::error_code ec,
                                                     tcp::socket socket) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: try again shortly rather than spin.
      accept_retry = std::make_unique<net::steady_timer>(accept_strand, milliseconds(10));
      accept_retry->async_wait([this](boost::system::error_code) {
        if (!stopping) accept();
      });
      return;
    }
    std::string address = peer_address(socket);
    if (admit(address)) {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<Session>(*this, std::move(socket), std::move(address), true);
      remember(session);
      session->start();
    } else {
      boost::system::error_code ignored;
      socket.close(ignored);  // over a cap: closed at once, costing nothing
    }
    accept();
  });
}

bool HttpFront::Impl::admit(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex);
  if (open.load() >= limits.max_connections) return false;
  if (limits.max_connections_per_address > 0 && !address.empty()) {
    std::size_t& mine = per_address[address];
    if (mine >= limits.max_connections_per_address) return false;
    ++mine;
  }
  ++open;
  return true;
}

void HttpFront::Impl::leave(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex);
  --open;
  if (limits.max_connections_per_address > 0 && !address.empty()) {
    auto it = per_address.find(address);
    if (it != per_address.end() && --it->second == 0) per_address.erase(it);
  }
}

void HttpFront::Impl::remember(const std::shared_ptr<Session>& session) {
  std::lock_guard<std::mutex> lock(mutex);
  sessions.emplace(session.get(), session);
}

void HttpFront::Impl::forget(Session* session) {
  std::lock_guard<std::mutex> lock(mutex);
  sessions.erase(session);
}

std::vector<std::shared_ptr<Session>> HttpFront::Impl::live_sessions() {
  std::vector<std::shared_ptr<Session>> live;
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& [raw, weak] : sessions)
    if (auto s = weak.lock()) live.push_back(std::move(s));
  return live;
}

bool HttpFront::Impl::reserve_receiving(std::size_t bytes) {
  std::size_t now = receiving.load();
  do {
    if (now > 0 && (bytes > limits.max_receiving_bytes || now > limits.max_receiving_bytes - bytes))
      return false;
  } while (!receiving.compare_exchange_weak(now, now + bytes));
  return true;
}

void HttpFront::Impl::finish_stopping(std::chrono::steady_clock::time_point until) {
  if (open.load() == 0 || std::chrono::steady_clock::now() >= until) return io.stop();
  stop_timer->expires_after(milliseconds(10));
  stop_timer->async_wait([this, until](boost::system::error_code) { finish_stopping(until); });
}

// --- HttpFront

HttpFront::HttpFront(HttpLimits limits, std::size_t threads, HttpHandler handler,
                     HttpErrorBody errors, HttpHeadCheck head_check)
    : impl_(std::make_shared<Impl>(limits, threads, std::move(handler), std::move(errors),
                                   std::move(head_check))) {}

HttpFront::~HttpFront() {
  stop();
  impl_->io.stop();  // run() has returned (its caller joined it), or never ran
  {
    // From here no Reply posts: the io_context and its sessions go with the Impl.
    std::lock_guard<std::mutex> lock(impl_->liveness->mutex);
    impl_->liveness->alive = false;
  }
  for (auto& s : impl_->live_sessions())
    s->stop(true);
  // What stop() posted runs here, and then no handler is left to keep a session.
  impl_->io.restart();
  impl_->io.poll();
}

int HttpFront::bind(const std::string& host, int port) {
  auto& a = impl_->acceptor;
  boost::system::error_code ec;
  const auto address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec)
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + " (not an address)");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    boost::system::error_code ignored;
    a.close(ignored);
    throw Error("cannot listen on " + host + ":" + std::to_string(port) +
                " (address in use, or not an address of this machine)");
  }
  impl_->port = a.local_endpoint().port();
  return impl_->port;
}

void HttpFront::run() {
  {
    std::unique_lock<std::mutex> lock(impl_->run_mutex);
    impl_->drivers_done.wait(lock, [&] { return impl_->drivers == 0 || impl_->stopping; });
    if (impl_->stopping) return;
    impl_->io.restart();
    impl_->running = true;
    if (impl_->acceptor.is_open()) impl_->accept();
  }
  // A completion handler that throws must not end a thread (in another thread than this one, the
  // process): the thread goes back to the loop, as the JobQueue's io thread does.
  auto serve = [this] {
    for (;;) {
      try {
        impl_->io.run();
        return;
      } catch (...) {
      }
    }
  };
  std::vector<std::thread> others;
  for (std::size_t i = 1; i < impl_->threads; ++i)
    others.emplace_back(serve);
  serve();
  for (auto& t : others)
    t.join();
  impl_->running = false;
}

void HttpFront::stop() {
  std::lock_guard<std::mutex> lock(impl_->run_mutex);
  if (impl_->stopping.exchange(true)) return;
  impl_->drivers_done.notify_all();  // a run() waiting for a serve_bytes returns now
  if (!impl_->running) {
    // Bound but never served: closed now, so that connections are refused instead of waiting
    // in the backlog unanswered.
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->io.stop();
    return;
  }
  // Served: no new connection; each one ends as soon as it has no answer under way; run()
  // returns once they are gone, or after the grace.
  net::post(impl_->accept_strand, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    if (impl->accept_retry) impl->accept_retry->cancel();
    for (auto& s : impl->live_sessions())
      s->stop(false);
    impl->stop_timer = std::make_unique<net::steady_timer>(impl->io);
    impl->finish_stopping(std::chrono::steady_clock::now() + impl->limits.stop_grace);
  });
}

int HttpFront::port() const {
  return impl_->port;
}

std::size_t HttpFront::connections() const {
  return impl_->open;
}

std::string HttpFront::serve_bytes(std::string input) {
  // Decided once, under the lock run() takes: either run() serves this connection, or this thread
  // does (and run() waits until it is over).
  bool drive = false;
  {
    std::lock_guard<std::mutex> lock(impl_->run_mutex);
    if (impl_->stopping) return {};
    drive = !impl_->running;
    if (drive) ++impl_->drivers;
  }
  struct Driven {
    Impl& impl;
    bool drive;
    ~Driven() {
      if (!drive) return;
      {
        std::lock_guard<std::mutex> lock(impl.run_mutex);
        --impl.drivers;
      }
      impl.drivers_done.notify_all();
    }
  } driven{*impl_, drive};
  net::local::stream_protocol::socket ours(impl_->io), theirs(impl_->io);
  net::local::connect_pair(ours, theirs);
  // The server's end as a TCP socket: Asio reads and writes any stream descriptor the same way.
  tcp::socket server_end(net::make_strand(impl_->io));  // a session's handlers never overlap
  server_end.assign(tcp::v4(), theirs.release());
  if (!impl_->admit({})) return {};
  auto session = std::make_shared<Session>(*impl_, std::move(server_end), std::string(), false);
  impl_->remember(session);
  session->start();
  session.reset();
  const int fd = ours.native_handle();
  std::string output;
  std::atomic<bool> done{false};
  // The peer writes and reads on threads of its own, so that neither direction waits for the
  // other (a large pipelined input, answered while it is still being sent).
  std::thread writer([fd, &input] {
    std::size_t sent = 0;
    while (sent < input.size()) {
      const ssize_t n = ::send(fd, input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
  });
  std::thread reader([fd, &output, &done] {
    std::array<char, 16 * 1024> chunk;
    for (;;) {
      const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
      if (n <= 0) break;
      output.append(chunk.data(), static_cast<std::size_t>(n));
    }
    done = true;
  });
  if (drive) {
    // Nobody runs the io_context: this thread does, until the connection is over.
    while (!done) {
      impl_->io.restart();
      impl_->io.run_for(milliseconds(10));
    }
  }
  writer.join();
  reader.join();
  return output;
}

}  // namespace rebound::detail

// CurlTransport: libcurl's multi interface on an Asio strand (curl's socket and timer callbacks
// become async_wait calls). Per-origin limits and breakers are OriginGate's, in front of it.
#include "rebound/delivery/curl_transport.hpp"

#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "common/callback_url.hpp"
#include "common/text.hpp"
#include "rebound/error.hpp"
#include "rebound/job_queue.hpp"

namespace rebound {
namespace {

using Strand = boost::asio::strand<boost::asio::any_io_executor>;

// libcurl wants one global initialisation before any handle, process-wide.
void init_curl_once() {
  static const bool done = [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error("libcurl failed to start");
    return true;
  }();
  (void)done;
}

CallbackResponse failure(TransportError error, std::string message) {
  CallbackResponse r;
  r.error = error;
  r.message = std::move(message);
  return r;
}

}  // namespace

struct CurlTransport::Impl : std::enable_shared_from_this<CurlTransport::Impl> {
  // Why an attempt was cut short by rebound rather than by curl.
  enum class Cut { none, headers_too_large, body_too_large };

  struct Transfer {
    Impl* impl = nullptr;
    CallbackRequest request;
    CallbackResponseHandler on_done;
    std::string origin;
    std::string host;
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    std::size_t header_bytes = 0;
    std::size_t body_bytes = 0;
    bool headers_complete = false;
    std::string retry_after;
    // Retry-After is a single value (RFC 9110): fields that repeat it count as one; fields that
    // disagree name no delay at all, and the schedule's holds (as an unreadable value's would).
    bool retry_after_seen = false;
    bool retry_after_conflict = false;
    bool connected = false;  // a connection (and its TLS) ready for the request: before_request
    std::size_t refused_addresses = 0;
    std::size_t addresses_tried = 0;
    bool local_failure = false;  // rebound's own trouble (no socket, no handle): not the receiver's
    Cut cut = Cut::none;
    char error[CURL_ERROR_SIZE] = {};
    ~Transfer() {
      if (easy) curl_easy_cleanup(easy);
      if (headers) curl_slist_free_all(headers);
    }
  };

  // A socket curl waits on: one it opened through open_socket (owned: closed by close_socket) or
  // one of curl's own (its resolver's wake-up pipe), only watched.
  struct Socket {
    std::unique_ptr<boost::asio::posix::stream_descriptor> descriptor;
    bool owned = false;
    int want = 0;  // CURL_POLL_*
    bool reading = false;
    bool writing = false;
    std::uint32_t ports = 0;  // local and remote, once known (on_socket): before_request's key
    std::uint64_t id = 0;
  };

  Impl(boost::asio::any_io_executor executor, CurlTransportOptions o)
      : strand(boost::asio::make_strand(std::move(executor))),
        options(std::move(o)),
        timer(strand) {
    init_curl_once();
    multi = curl_multi_init();
    if (!multi) throw Error("CurlTransport: curl_multi_init failed");
    curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, &Impl::on_socket);
    curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, &Impl::on_timer);
    curl_multi_setopt(multi, CURLMOPT_TIMERDATA, this);
    // The OriginGate in front keeps requests within its limits; this cap is a second line.
    curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, static_cast<long>(options.max_total));
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, static_cast<long>(options.max_total));
    for (const auto& entry : options.resolve)
      resolve = curl_slist_append(resolve, entry.c_str());
  }

  ~Impl() {
    // Only reached once every handler holding the Impl ran; shutdown() emptied everything,
    // unless the executor's context was destroyed without running it.
    for (CURL* easy : idle_easies)
      curl_easy_cleanup(easy);
    if (multi) curl_multi_cleanup(multi);
    if (resolve) curl_slist_free_all(resolve);
  }

  // --- on the strand

  void enqueue(std::shared_ptr<Transfer> transfer) {
    if (stopped) return finish_without_sending(std::move(transfer), "the transport is stopped");
    start(std::move(transfer));
  }

  // An easy handle from the pool, or a new one with the options every transfer shares. Reusing
  // handles saves curl's per-handle set-up, a good part of a callback's cost on a fast receiver.
  CURL* take_easy() {
    if (!idle_easies.empty()) {
      CURL* easy = idle_easies.back();
      idle_easies.pop_back();
      return easy;
    }
    CURL* easy = curl_easy_init();
    if (!easy) return nullptr;
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &Impl::on_header);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &Impl::on_body);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, &Impl::open_socket);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, &Impl::close_socket);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, this);
    curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, &Impl::before_request);
    // "" for both: no proxy from the environment, and no host exempted from the one configured
    // (NO_PROXY would let a callback bypass the proxy, and with it the egress policy).
    curl_easy_setopt(easy, CURLOPT_PROXY, options.proxy.c_str());
    curl_easy_setopt(easy, CURLOPT_NOPROXY, "");
    // A proxy's answer to CONNECT is not the receiver's: kept out of on_header (its head would
    // count toward the receiver's header cap and read as the answer's head).
    curl_easy_setopt(easy, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
    // A transfer that ends while its name is still resolving does not wait for the resolver
    // thread: a nameserver that never answers cannot stall the event loop.
    curl_easy_setopt(easy, CURLOPT_QUICK_EXIT, 1L);
    if (!options.ca_cert_file.empty())
      curl_easy_setopt(easy, CURLOPT_CAINFO, options.ca_cert_file.c_str());
    if (resolve) curl_easy_setopt(easy, CURLOPT_RESOLVE, resolve);
    return easy;
  }

  // A finished transfer's handle goes back to the pool (bounded), its per-transfer pointers
  // cleared so that nothing in it refers to the transfer any more.
  void return_easy(Transfer& t) {
    CURL* easy = std::exchange(t.easy, nullptr);
    if (!easy) return;
    if (idle_easies.size() >= max_idle_easies) return curl_easy_cleanup(easy);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, nullptr);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, nullptr);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, nullptr);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, nullptr);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, nullptr);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, nullptr);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, nullptr);
    curl_easy_setopt(easy, CURLOPT_PREREQDATA, nullptr);
    idle_easies.push_back(easy);
  }

  void start(std::shared_ptr<Transfer> t) {
    CURL* easy = take_easy();
    if (!easy) return complete_later(std::move(t), "curl_easy_init failed");
    t->easy = easy;
    t->impl = this;
    for (const auto& [name, value] : t->request.headers)
      t->headers = curl_slist_append(t->headers, (name + ": " + value).c_str());
    // curl would otherwise send "Expect: 100-continue" for larger bodies and wait a second.
    t->headers = curl_slist_append(t->headers, "Expect:");
    const long timeout_ms = static_cast<long>(std::max<long long>(1, t->request.timeout.count()));
    // (libcurl copies the string; it would send bytes past ASCII in the path or query raw)
    const std::string& url = t->request.url;
    const bool ascii = detail::sent_length(url) == url.size();
    curl_easy_setopt(easy, CURLOPT_URL, ascii ? url.c_str() : detail::as_sent(url).c_str());
    curl_easy_setopt(easy, CURLOPT_PRIVATE, t.get());
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, t->error);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, t->request.body.data());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(t->request.body.size()));
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, t->headers);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, t.get());
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, t.get());
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, t.get());
    curl_easy_setopt(easy, CURLOPT_PREREQDATA, t.get());
    if (curl_multi_add_handle(multi, easy) != CURLM_OK)
      return complete_later(std::move(t), "curl_multi_add_handle failed");
    Transfer* raw = t.get();
    in_curl.emplace(raw, std::move(t));
  }

  // Ends an attempt that never reached curl; posted, so that no handler runs inside `send`.
  void complete_later(std::shared_ptr<Transfer> t, std::string why) {
    t->local_failure = true;
    boost::asio::post(strand, [self = shared_from_this(), t = std::move(t), why = std::move(why)] {
      self->complete(t, failure(TransportError::io, why));
    });
  }

  // Reads what curl finished.
  void collect() {
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      const CURLcode code = msg->data.result;
      Transfer* raw = nullptr;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, &raw);
      curl_multi_remove_handle(multi, easy);
      auto found = in_curl.find(raw);
      if (found == in_curl.end()) continue;
      std::shared_ptr<Transfer> t = std::move(found->second);
      in_curl.erase(found);
      CallbackResponse response = outcome(*t, code);
      return_easy(*t);
      complete(std::move(t), std::move(response));
    }
  }

  CallbackResponse outcome(Transfer& t, CURLcode code) {
    long status = 0;
    curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
    // Once the whole head of an answer is in, its status stands, whatever happens to the body
    // (over the cap, cut by the timeout, dropped): the receiver has answered.
    if (code == CURLE_OK ||
        (t.headers_complete && status >= 200 && t.cut != Cut::headers_too_large)) {
      CallbackResponse r;
      r.status = static_cast<int>(status);
      if (!t.retry_after_conflict) r.retry_after = std::move(t.retry_after);
      return r;
    }
    const std::string where = " (" + t.origin + ")";
    if (t.cut == Cut::headers_too_large) {
      return failure(TransportError::io, "response headers over " +
                                             std::to_string(options.max_response_header_bytes) +
                                             " bytes" + where);
    }
    const std::string detail =
        (t.error[0] ? std::string(t.error) : curl_easy_strerror(code)) + where;
    switch (code) {
      case CURLE_COULDNT_CONNECT:
        if (t.refused_addresses > 0 && t.refused_addresses == t.addresses_tried) {
          return failure(TransportError::refused_address,
                         t.host + " has no address callbacks may use" + where);
        }
        return failure(TransportError::connect_failed, "connection failed: " + detail);
      case CURLE_COULDNT_RESOLVE_PROXY:
        t.local_failure = true;
        return failure(TransportError::resolve_failed, "cannot resolve the proxy: " + detail);
      case CURLE_COULDNT_RESOLVE_HOST:
        return failure(TransportError::resolve_failed, "cannot resolve: " + detail);
      case CURLE_OPERATION_TIMEDOUT:
        return failure(TransportError::timeout, "no complete answer within " +
                                                    std::to_string(t.request.timeout.count()) +
                                                    " ms: " + how_far(t, status) + where);
      case CURLE_UNSUPPORTED_PROTOCOL: {
        // Also what libcurl says of an answer it cannot read (HTTP/0.9, "HTTP/1.2", no status
        // line): once the request went out, the receiver answered badly, and that is retried
        // like any broken answer; the URL is at fault only before.
        long sent = 0;
        curl_easy_getinfo(t.easy, CURLINFO_REQUEST_SIZE, &sent);
        if (sent > 0) return failure(TransportError::io, "unreadable answer: " + detail);
        return failure(TransportError::invalid_url, "callback_url cannot be used: " + detail);
      }
      case CURLE_URL_MALFORMAT:
        return failure(TransportError::invalid_url, "callback_url cannot be used: " + detail);
      case CURLE_OUT_OF_MEMORY:
        // What libcurl says of an answer's header line past its own limit (100 KiB): a line
        // reaches the header cap above only once it ends.
        if (!t.headers_complete) {
          return failure(TransportError::io,
                         "a response header line too long to read (or no memory)" + where);
        }
        return failure(TransportError::io, "request failed: " + detail);
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CERTPROBLEM:
      case CURLE_SSL_CACERT_BADFILE:
        return failure(TransportError::tls, "TLS failed: " + detail);
      default:
        return failure(TransportError::io, "request failed: " + detail);
    }
  }

  // How far an attempt that ran out of time got (`status`: the last status line's), in the
  // receiver's terms (libcurl's own text counts body bytes alone: a receiver that trickled its
  // headers read "0 bytes received").
  static std::string how_far(const Transfer& t, long status) {
    if (t.headers_complete) {
      if (status < 200) return "an interim " + std::to_string(status) + " answer, then no other";
      return "the answer's body incomplete after " + std::to_string(t.body_bytes) + " bytes";
    }
    if (t.header_bytes > 0)
      return "the answer's head incomplete after " + std::to_string(t.header_bytes) + " bytes";
    if (!t.connected) return "no connection ready (TCP, or TLS, not through)";
    curl_off_t sent = 0;
    curl_easy_getinfo(t.easy, CURLINFO_SIZE_UPLOAD_T, &sent);
    if (sent < static_cast<curl_off_t>(t.request.body.size())) {
      return "connected, " + std::to_string(sent) + " of the body's " +
             std::to_string(t.request.body.size()) + " bytes taken";
    }
    return "the request sent, no answer";
  }

  // An attempt ended: its handler hears how.
  void complete(std::shared_ptr<Transfer> t, CallbackResponse response) {
    response.local = response.local || t->local_failure;
    deliver(std::move(t), std::move(response));
  }

  static void deliver(std::shared_ptr<Transfer> t, CallbackResponse response) {
    CallbackResponseHandler handler = std::move(t->on_done);
    t.reset();
    try {
      if (handler) handler(std::move(response));
    } catch (...) {
      // The handler's owner decides what its failures mean.
    }
  }

  void finish_without_sending(std::shared_ptr<Transfer> t, const std::string& why) {
    deliver(std::move(t), failure(TransportError::cancelled, why));
  }

  // Everything in flight or waiting ends `cancelled`; nothing starts again.
  void shutdown() {
    if (stopped) return;
    stopped = true;
    timer.cancel();
    std::vector<std::shared_ptr<Transfer>> ended;
    for (auto& [raw, t] : in_curl) {
      curl_multi_remove_handle(multi, t->easy);
      ended.push_back(std::move(t));
    }
    in_curl.clear();
    for (CURL* easy : idle_easies)
      curl_easy_cleanup(easy);
    idle_easies.clear();
    // curl closes its cached connections through close_socket; what is left is curl's own.
    curl_multi_cleanup(multi);
    multi = nullptr;
    for (auto& [fd, socket] : sockets) {
      if (!socket.owned) socket.descriptor->release();
    }
    sockets.clear();
    for (auto& t : ended)
      finish_without_sending(std::move(t), "the transport shut down");
  }

  // --- curl's callbacks (called from inside curl, on the strand)

  static int on_socket(CURL*, curl_socket_t fd, int what, void* userp, void*) {
    auto* self = static_cast<Impl*>(userp);
    auto found = self->sockets.find(fd);
    if (what == CURL_POLL_REMOVE) {
      if (found == self->sockets.end()) return 0;
      found->second.want = 0;
      if (found->second.owned) {
        found->second.descriptor->cancel();
      } else {
        found->second.descriptor->release();
        self->sockets.erase(found);
      }
      return 0;
    }
    if (found == self->sockets.end()) {
      // Nothing may throw through curl's C frames.
      try {
        Socket s;
        s.descriptor = std::make_unique<boost::asio::posix::stream_descriptor>(self->strand, fd);
        s.id = ++self->socket_ids;
        found = self->sockets.emplace(fd, std::move(s)).first;
      } catch (...) {
        return -1;
      }
    }
    if (found->second.owned && found->second.ports == 0) self->learn_ports(fd, found->second);
    found->second.want = what;
    self->arm(fd);
    return 0;
  }

  // A connection's local and remote ports, once: before_request knows a connection by them (a
  // local port alone may be shared by connections to different receivers).
  static std::uint32_t ports_key(int local_port, int remote_port) {
    return (static_cast<std::uint32_t>(local_port) << 16) | static_cast<std::uint32_t>(remote_port);
  }
  static int port_of(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return 0;
  }
  void learn_ports(curl_socket_t fd, Socket& s) {
    sockaddr_storage local{}, remote{};
    socklen_t local_length = sizeof local, remote_length = sizeof remote;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_length) != 0) {
      return;  // (not connected yet: learnt at curl's next word on it)
    }
    const int local_port = port_of(local), remote_port = port_of(remote);
    if (local_port == 0 || remote_port == 0) return;
    s.ports = ports_key(local_port, remote_port);
    by_ports[s.ports] = fd;
  }

  // Just before a request goes out on a connection, new or kept alive: bytes already waiting on
  // it were asked for by no request (an answer nobody asked for, a second answer to the last
  // request), and libcurl 7.88 would read them as this request's answer (each callback after on
  // that connection hearing the status meant for the one before). Such a connection is shut and
  // drained: the request's send fails, and libcurl sends it again on a new connection, as it does
  // for a kept-alive connection that died. (Bytes that come after this look, while the request
  // is under way, still reach libcurl: no client can tell them from the answer.)
  static int before_request(void* clientp, char*, char*, int remote_port, int local_port) {
    auto* t = static_cast<Transfer*>(clientp);
    t->connected = true;
    Impl* self = t->impl;
    const std::uint32_t key = ports_key(local_port, remote_port);
    const auto known = self->by_ports.find(key);
    if (known == self->by_ports.end()) return CURL_PREREQFUNC_OK;
    const auto found = self->sockets.find(known->second);
    // (A connection of its first request is new: nothing can wait on it yet.)
    if (found == self->sockets.end() || found->second.ports != key || found->second.want != 0) {
      return CURL_PREREQFUNC_OK;
    }
    const curl_socket_t fd = known->second;
    char scratch[4096];
    if (::recv(fd, scratch, 1, MSG_PEEK | MSG_DONTWAIT) <= 0) return CURL_PREREQFUNC_OK;
    ::shutdown(fd, SHUT_RDWR);
    t->connected = false;                       // (the request goes on a new connection)
    for (int reads = 0; reads < 16; ++reads) {  // (more than 64 KiB: the send fails all the same)
      if (::recv(fd, scratch, sizeof scratch, MSG_DONTWAIT) <= 0) break;
    }
    return CURL_PREREQFUNC_OK;
  }

  void arm(curl_socket_t fd) {
    auto found = sockets.find(fd);
    if (found == sockets.end()) return;
    Socket& s = found->second;
    const std::uint64_t id = s.id;
    if ((s.want & CURL_POLL_IN) && !s.reading) {
      s.reading = true;
      s.descriptor->async_wait(
          boost::asio::posix::descriptor_base::wait_read,
          [self = shared_from_this(), fd, id](const boost::system::error_code& ec) {
            self->on_ready(fd, id, CURL_CSELECT_IN, ec);
          });
    }
    if ((s.want & CURL_POLL_OUT) && !s.writing) {
      s.writing = true;
      s.descriptor->async_wait(
          boost::asio::posix::descriptor_base::wait_write,
          [self = shared_from_this(), fd, id](const boost::system::error_code& ec) {
            self->on_ready(fd, id, CURL_CSELECT_OUT, ec);
          });
    }
  }

  void on_ready(curl_socket_t fd, std::uint64_t id, int direction,
                const boost::system::error_code& ec) {
    auto found = sockets.find(fd);
    if (found == sockets.end() || found->second.id != id) return;  // closed, or another socket
    (direction == CURL_CSELECT_IN ? found->second.reading : found->second.writing) = false;
    // A wait cancelled because curl changed its interest is re-armed if curl wants it again.
    if (stopped || (ec && ec != boost::asio::error::operation_aborted)) return;
    if (!ec) {
      int running = 0;
      curl_multi_socket_action(multi, fd, direction, &running);
      collect();
    }
    arm(fd);
  }

  // curl moves its deadline with nearly every call; each move of an Asio timer is a timerfd_settime
  // system call, which cost a third of the transport's time at 10,000 callbacks/s. So the Asio
  // timer only ever moves earlier: a later deadline is remembered and the timer, when it fires
  // early, is set again; "now" is a post, not a timer.
  static int on_timer(CURLM*, long timeout_ms, void* userp) {
    auto* self = static_cast<Impl*>(userp);
    if (self->stopped) return 0;  // shutdown() removes handles: nothing may be armed again
    if (timeout_ms < 0) {
      self->curl_deadline.reset();  // an armed timer fires and finds nothing to do
      return 0;
    }
    const auto now = std::chrono::steady_clock::now();
    self->curl_deadline = now + std::chrono::milliseconds(timeout_ms);
    if (timeout_ms == 0) {
      if (!self->timeout_posted) {
        self->timeout_posted = true;
        boost::asio::post(self->strand, [self = self->shared_from_this()] {
          self->timeout_posted = false;
          self->on_deadline();
        });
      }
      return 0;
    }
    if (!self->timer_armed || *self->curl_deadline < self->timer_armed_for) self->arm_timer();
    return 0;
  }

  void arm_timer() {
    timer_armed = true;
    timer_armed_for = *curl_deadline;
    timer.expires_at(timer_armed_for);
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec) return;  // moved earlier (a newer wait is pending) or shut down
      self->timer_armed = false;
      self->on_deadline();
    });
  }

  // The timer fired or a "now" came: curl acts if its deadline has come, else the timer waits on.
  void on_deadline() {
    if (stopped || !curl_deadline) return;
    if (std::chrono::steady_clock::now() < *curl_deadline) {
      if (!timer_armed || *curl_deadline < timer_armed_for) arm_timer();
      return;
    }
    curl_deadline.reset();
    int running = 0;
    curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
    collect();
  }

  // Every connection curl opens comes here: the SSRF guard sees the address actually connected
  // to, after DNS, so a name cannot be re-pointed at a private address between check and use.
  static curl_socket_t open_socket(void* clientp, curlsocktype purpose, curl_sockaddr* address) {
    auto* t = static_cast<Transfer*>(clientp);
    Impl* self = t->impl;
    if (purpose == CURLSOCKTYPE_IPCXN) ++t->addresses_tried;
    if (purpose == CURLSOCKTYPE_IPCXN && self->options.proxy.empty() &&
        !self->options.guard.host_listed(t->host)) {
      const auto* sa = &address->addr;
      bool permitted = false;
      if (sa->sa_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
        permitted = self->options.guard.permits_address(
            reinterpret_cast<const std::uint8_t*>(&in->sin_addr), 4);
      } else if (sa->sa_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
        permitted = self->options.guard.permits_address(
            reinterpret_cast<const std::uint8_t*>(&in6->sin6_addr), 16);
      }
      if (!permitted) {
        ++t->refused_addresses;
        return CURL_SOCKET_BAD;  // curl tries the host's next address, if it has one
      }
    }
    const int fd = ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
    if (fd < 0) {
      t->local_failure = true;  // out of descriptors: not the receiver's doing
      return CURL_SOCKET_BAD;
    }
    try {  // nothing may throw through curl's C frames
      Socket s;
      s.descriptor = std::make_unique<boost::asio::posix::stream_descriptor>(self->strand, fd);
      s.owned = true;
      s.id = ++self->socket_ids;
      self->sockets.erase(fd);
      self->sockets.emplace(fd, std::move(s));
    } catch (...) {
      ::close(fd);
      t->local_failure = true;
      return CURL_SOCKET_BAD;
    }
    return fd;
  }

  static int close_socket(void* clientp, curl_socket_t fd) {
    auto* self = static_cast<Impl*>(clientp);
    auto found = self->sockets.find(fd);
    if (found == self->sockets.end()) return ::close(fd);
    const auto known = self->by_ports.find(found->second.ports);
    if (known != self->by_ports.end() && known->second == fd) self->by_ports.erase(known);
    self->sockets.erase(found);  // the descriptor closes the socket and cancels its waits
    return 0;
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t count, void* userp) {
    auto* t = static_cast<Transfer*>(userp);
    const std::size_t n = size * count;
    const bool status_line = (t->header_bytes == 0 || t->headers_complete) &&
                             detail::starts_with_ignoring_case({data, n}, "HTTP/");
    if (status_line) {
      // A new response (after a 1xx, say): its headers start over.
      t->headers_complete = false;
      t->retry_after.clear();
      t->retry_after_seen = t->retry_after_conflict = false;
    } else if (t->headers_complete) {
      return n;  // trailers after a chunked body: not part of the answer's head
    }
    t->header_bytes += n;
    if (t->header_bytes > t->impl->options.max_response_header_bytes) {
      t->cut = Cut::headers_too_large;
      return 0;
    }
    // The blank line ends the head (a line with anything on it, ":" say, does not).
    if ((n == 2 && data[0] == '\r' && data[1] == '\n') || (n == 1 && data[0] == '\n')) {
      t->headers_complete = true;
    } else if (detail::starts_with_ignoring_case({data, n}, "retry-after:")) {
      std::string value(data + 12, n - 12);
      while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back())))
        value.pop_back();
      const auto first = value.find_first_not_of(" \t");
      value = first == std::string::npos ? std::string() : value.substr(first);
      if (!t->retry_after_seen) {
        t->retry_after = std::move(value);
        t->retry_after_seen = true;
      } else if (value != t->retry_after) {
        t->retry_after_conflict = true;
      }
    }
    return n;
  }

  static std::size_t on_body(char*, std::size_t size, std::size_t count, void* userp) {
    auto* t = static_cast<Transfer*>(userp);
    const std::size_t n = size * count;
    t->body_bytes += n;
    if (t->body_bytes > t->impl->options.max_response_body_bytes) {
      t->cut = Cut::body_too_large;
      return 0;  // read no more: the connection is dropped
    }
    return n;
  }

  Strand strand;
  CurlTransportOptions options;
  boost::asio::steady_timer timer;
  std::optional<std::chrono::steady_clock::time_point> curl_deadline;  // when curl wants a call
  bool timer_armed = false;                                            // `timer` waits, for:
  std::chrono::steady_clock::time_point timer_armed_for;
  bool timeout_posted = false;  // a "now" is already posted
  CURLM* multi = nullptr;
  curl_slist* resolve = nullptr;
  bool stopped = false;
  std::unordered_map<Transfer*, std::shared_ptr<Transfer>> in_curl;
  std::vector<CURL*> idle_easies;
  static constexpr std::size_t max_idle_easies = 256;
  std::unordered_map<curl_socket_t, Socket> sockets;
  std::unordered_map<std::uint32_t, curl_socket_t> by_ports;  // ours, by local and remote port
  std::uint64_t socket_ids = 0;
};

CurlTransport::CurlTransport(boost::asio::any_io_executor executor, CurlTransportOptions options) {
  if (options.max_total == 0) throw Error("CurlTransport: the connection limit must be at least 1");
  impl_ = std::make_shared<Impl>(std::move(executor), std::move(options));
}

CurlTransport::~CurlTransport() {
  // What is in flight or waiting ends `cancelled` on the strand; the Impl lives until then (or
  // until the executor's context is destroyed without running it).
  if (impl_->strand.running_in_this_thread()) {
    impl_->shutdown();
  } else {
    boost::asio::post(impl_->strand, [impl = impl_] { impl->shutdown(); });
  }
}

void CurlTransport::send(CallbackRequest request, CallbackResponseHandler on_done) {
  auto t = std::make_shared<Impl::Transfer>();
  const detail::CallbackUrlParse parsed = detail::parse_callback_url(request.url);
  t->request = std::move(request);
  t->on_done = std::move(on_done);
  if (parsed.url) {
    t->origin = parsed.url->origin();
    t->host = parsed.url->host;
  }
  // Sent from the strand itself (an OriginGate starting the next request as one ends): started
  // at once, not after everything queued on the executor. Its answer still comes later.
  if (parsed.url && impl_->strand.running_in_this_thread() && !impl_->stopped) {
    return impl_->start(std::move(t));
  }
  boost::asio::post(impl_->strand, [impl = impl_, t = std::move(t), valid = parsed.url.has_value(),
                                    error = parsed.error]() mutable {
    if (!valid) {
      return Impl::deliver(std::move(t),
                           failure(TransportError::invalid_url, "callback_url " + error));
    }
    impl->enqueue(std::move(t));
  });
}

}  // namespace rebound

namespace rebound::detail {
namespace {

// What a JobQueue delivers callbacks with when the program links rebound::http and names no
// transport (detail::default_transport in job_queue.hpp).
std::unique_ptr<CallbackTransport> make_default_transport(boost::asio::any_io_executor io,
                                                          const AddressGuard& guard) {
  CurlTransportOptions options;
  options.guard = guard;
  return std::make_unique<CurlTransport>(std::move(io), std::move(options));
}

}  // namespace
}  // namespace rebound::detail

// Registers the default; called from every translation unit that includes job_queue.hpp with
// rebound::http (REBOUND_HAS_HTTP), and named by rebound::http's link options
// (-Wl,--undefined=...) so that a static link pulls this file in even without such a unit.
extern "C" const void* rebound_http_default_transport() {
  rebound::detail::set_default_transport(&rebound::detail::make_default_transport);
  static const char registered = 1;
  return &registered;
}

namespace rebound::detail {
namespace {
// And as the program starts (or as the shared library loads), for programs that reach the
// JobQueue only through other libraries' code.
[[maybe_unused]] const void* const registered_at_load = rebound_http_default_transport();
}  // namespace
}  // namespace rebound::detail

// HttpTransport: a fixed set of sender threads, each with its own kept-alive client per origin.
#include "rebound/http_transport.hpp"

#include <httplib.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rebound/callback_url.hpp"
#include "rebound/error.hpp"

namespace rebound {
namespace {

CallbackResponse transport_failure(TransportError error, std::string message) {
  CallbackResponse r;
  r.error = error;
  r.message = std::move(message);
  return r;
}

CallbackResponse from_httplib_error(httplib::Error error, const std::string& origin) {
  const std::string what = httplib::to_string(error) + " (" + origin + ")";
  switch (error) {
    case httplib::Error::Connection:
      return transport_failure(TransportError::connect_failed, "connection failed: " + what);
    case httplib::Error::ConnectionTimeout:
      return transport_failure(TransportError::connect_failed, "connection timed out: " + what);
    case httplib::Error::Read:
      return transport_failure(TransportError::timeout, "no complete answer in time: " + what);
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification:
      return transport_failure(TransportError::tls, "TLS failed: " + what);
    default:
      return transport_failure(TransportError::io, "request failed: " + what);
  }
}

}  // namespace

struct HttpTransport::Impl {
  // One sender thread's kept-alive clients, by origin, with when each was last used.
  struct Clients {
    struct Entry {
      std::unique_ptr<httplib::Client> client;
      std::uint64_t last_used = 0;
    };
    std::unordered_map<std::string, Entry> by_origin;
    std::uint64_t tick = 0;
  };

  struct Pending {
    CallbackRequest request;
    CallbackResponseHandler on_done;
  };

  explicit Impl(HttpTransportOptions opts) : options(std::move(opts)) {
    threads.reserve(options.connections);
    for (std::size_t i = 0; i < options.connections; ++i) {
      threads.emplace_back([this] { run(); });
    }
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      queue.clear();
    }
    wake.notify_all();
    for (auto& t : threads)
      t.join();
  }

  void run() {
    // Clients are per thread, so no client is ever shared between two requests in flight.
    Clients clients;
    for (;;) {
      Pending item;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [this] { return stopping || !queue.empty(); });
        if (stopping) return;
        item = std::move(queue.front());
        queue.pop_front();
      }
      CallbackResponse response;
      try {
        response = perform(item.request, clients);
      } catch (const std::exception& e) {
        response =
            transport_failure(TransportError::io, std::string("request failed: ") + e.what());
      } catch (...) {
        response = transport_failure(TransportError::io, "request failed");
      }
      try {
        item.on_done(std::move(response));
      } catch (...) {
        // The handler's owner decides what its failures mean; the sender thread carries on.
      }
    }
  }

  httplib::Client* client_for(const CallbackUrl& url, const std::string& origin, Clients& clients,
                              CallbackResponse& refusal) {
    auto found = clients.by_origin.find(origin);
    if (found != clients.by_origin.end()) {
      found->second.last_used = ++clients.tick;
      return found->second.client.get();
    }

    std::string address;
    if (classify_ip_literal(url.host)) {
      if (auto refused = options.guard.check_host(url.host)) {
        refusal = transport_failure(TransportError::refused_address, url.host + " " + *refused);
        return nullptr;
      }
    } else if (!options.guard.allow_private()) {
      // Resolve once, check, and pin the connection to the checked address (no DNS rebinding).
      auto resolved = options.guard.resolve(url.host);
      if (resolved.address.empty()) {
        refusal = transport_failure(
            resolved.refused ? TransportError::refused_address : TransportError::resolve_failed,
            resolved.error);
        return nullptr;
      }
      address = resolved.address;
    }
    auto client = std::make_unique<httplib::Client>(origin);
    if (!address.empty()) client->set_hostname_addr_map({{url.host, address}});
    client->set_keep_alive(true);
    client->set_follow_location(false);
    client->set_tcp_nodelay(true);
    if (url.scheme == "https") {
      client->enable_server_certificate_verification(true);
      if (!options.ca_cert_file.empty()) client->set_ca_cert_path(options.ca_cert_file);
    }
    if (clients.by_origin.size() >= options.origins_per_connection) {
      // Close the least recently used connection (a linear scan: the map is small).
      auto oldest = clients.by_origin.begin();
      for (auto it = clients.by_origin.begin(); it != clients.by_origin.end(); ++it) {
        if (it->second.last_used < oldest->second.last_used) oldest = it;
      }
      clients.by_origin.erase(oldest);
    }
    auto* raw = client.get();
    clients.by_origin.emplace(origin, Clients::Entry{std::move(client), ++clients.tick});
    return raw;
  }

  CallbackResponse perform(const CallbackRequest& request, Clients& clients) {
    const CallbackUrlParse parsed = parse_callback_url(request.url);
    if (!parsed.url)
      return transport_failure(TransportError::invalid_url, "callback_url " + parsed.error);
    const CallbackUrl& url = *parsed.url;
    const std::string origin = url.origin();

    CallbackResponse refusal;
    httplib::Client* client = client_for(url, origin, clients, refusal);
    if (client == nullptr) return refusal;

    const auto timeout = request.timeout;
    client->set_connection_timeout(timeout);
    client->set_read_timeout(timeout);
    client->set_write_timeout(timeout);

    httplib::Headers headers;
    std::string content_type = "application/json";
    for (const auto& [name, value] : request.headers) {
      if (name == "Content-Type")
        content_type = value;
      else
        headers.emplace(name, value);
    }
    auto result = client->Post(url.target.c_str(), headers, request.body, content_type.c_str());
    if (!result) {
      // Forget the client: its connection is in an unknown state, and a new one re-resolves.
      const auto error = result.error();
      clients.by_origin.erase(origin);
      return from_httplib_error(error, origin);
    }
    CallbackResponse response;
    response.status = result->status;
    response.retry_after = result->get_header_value("Retry-After");
    return response;
  }

  HttpTransportOptions options;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Pending> queue;
  bool stopping = false;
  std::vector<std::thread> threads;
};

HttpTransport::HttpTransport(HttpTransportOptions options) {
  if (options.connections == 0) throw Error("HttpTransport: connections must be at least 1");
  if (options.origins_per_connection == 0) {
    throw Error("HttpTransport: origins_per_connection must be at least 1");
  }
  impl_ = std::make_unique<Impl>(std::move(options));
}

HttpTransport::~HttpTransport() = default;

void HttpTransport::send(CallbackRequest request, CallbackResponseHandler on_done) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->queue.push_back({std::move(request), std::move(on_done)});
  }
  impl_->wake.notify_one();
}

}  // namespace rebound

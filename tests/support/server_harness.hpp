// A real rebound::Server around any Model on loopback, for the HTTP tests.
#pragma once

#include <doctest/doctest.h>
#include <httplib.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include "rebound/delivery/curl_transport.hpp"
#include "rebound/http/server.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "support/receiver.hpp"

namespace rebound::test {

struct HarnessOptions {
  std::size_t workers = 4;
  std::size_t capacity = 10000;
  int max_tries = 5;
  bool open_model = true;  ///< used by harnesses whose model can be held closed
  std::vector<std::string> api_keys = {};
  std::vector<std::string> operator_keys = {};
  std::vector<std::string> viewer_keys = {};
  std::optional<std::size_t> max_batch_size = std::nullopt;
  std::optional<std::chrono::microseconds> max_queue_delay = std::nullopt;
  std::chrono::milliseconds job_ttl{0};
  std::chrono::milliseconds inference_timeout{0};
  rebound::Logger logger = {};
  std::size_t http_threads = 80;
  std::size_t store_call_threads = 0;  ///< ServerOptions::store_call_threads
  std::size_t max_body_bytes = 6291456;
  std::size_t max_header_bytes = 65536;
  std::size_t max_parsing_bytes = std::size_t{256} << 20;
  /// JobQueueOptions::max_work_bytes.
  std::size_t max_work_bytes = std::size_t{512} << 20;
  std::chrono::milliseconds response_timeout{60000};
  std::chrono::milliseconds body_timeout{60000};
  std::size_t max_receiving_bytes = std::size_t{256} << 20;
  std::size_t max_waiters = 10000;
  /// The job store; unset: a MemoryJobStore.
  std::function<std::unique_ptr<rebound::JobStore>()> make_store = {};
  std::chrono::milliseconds store_retry_interval{1000};
  /// Keys callbacks are signed with (whsec_... and whsk_...).
  std::vector<std::string> signing_secrets = {};
  /// The queue's clock (JobQueueOptions::clock); unset: the system clock.
  std::function<std::chrono::system_clock::time_point()> clock = {};
  /// JobQueueOptions::allow_private_callbacks: on, as the receivers are on loopback.
  bool allow_private_callbacks = true;
  /// JobQueueOptions::tenant_share.
  double tenant_share = 1.0;
  /// How long a callback attempt may take (DeliveryOptions::timeout): the shipped 10 s. A shorter
  /// one made answers that a sanitizer's slowdown delayed past it count as failed attempts, and
  /// their retries as second deliveries (ThreadSanitizer, 2026-12-01: a receiver counted twice).
  std::chrono::milliseconds callback_timeout{10000};
  /// The receiver origins' limits and breakers (JobQueueOptions::origins).
  rebound::OriginGateOptions origins = {};
  /// JobQueueOptions::tenant_defaults and ::tenants (turns and rates).
  rebound::TenantOptions tenant_defaults = {};
  std::map<std::string, rebound::TenantOptions, std::less<>> tenants = {};
  /// Whether the server starts serving (Server::run on a thread) at once; else at serve().
  bool serving = true;
  /// ServerOptions::model_digest and ::model_loaded_at (GET /v1/models).
  std::string model_digest = {};
  std::optional<std::chrono::system_clock::time_point> model_loaded_at = std::nullopt;
};

class ServerHarness {
 public:
  ServerHarness(std::unique_ptr<rebound::Model> m, const HarnessOptions& o)
      : inference(o.workers), model_ptr(m.get()) {
    using namespace std::chrono_literals;
    rebound::JobQueueOptions so;
    so.workers = o.workers;
    so.queue_capacity = o.capacity;
    so.max_work_bytes = o.max_work_bytes;
    so.max_batch_size = o.max_batch_size;
    so.max_queue_delay = o.max_queue_delay;
    so.job_ttl = o.job_ttl;
    so.inference_timeout = o.inference_timeout;
    so.logger = o.logger;
    so.store_retry_interval = o.store_retry_interval;
    so.delivery.backoff =
        rebound::backoff::max_tries(rebound::backoff::exponential(10ms, 2.0, 100ms), o.max_tries);
    so.delivery.timeout = o.callback_timeout;
    so.delivery.signing_secrets = o.signing_secrets;
    so.allow_private_callbacks = o.allow_private_callbacks;
    if (o.clock) so.clock = o.clock;
    so.origins = o.origins;
    so.tenant_share = o.tenant_share;
    so.tenant_defaults = o.tenant_defaults;
    so.tenants = o.tenants;
    rebound::CurlTransportOptions to;
    to.guard = rebound::AddressGuard(true);
    service = std::make_unique<rebound::JobQueue>(
        inference.get_executor(), io.get_executor(), std::move(m),
        o.make_store ? o.make_store() : std::make_unique<rebound::MemoryJobStore>(),
        std::make_unique<rebound::CurlTransport>(io.get_executor(), to), so);
    rebound::ServerOptions sv;
    sv.host = "127.0.0.1";
    sv.port = 0;
    sv.http_threads = o.http_threads;
    sv.store_call_threads = o.store_call_threads;
    sv.max_body_bytes = o.max_body_bytes;
    sv.max_header_bytes = o.max_header_bytes;
    sv.max_parsing_bytes = o.max_parsing_bytes;
    sv.response_timeout = o.response_timeout;
    sv.body_timeout = o.body_timeout;
    sv.max_receiving_bytes = o.max_receiving_bytes;
    sv.max_waiters = o.max_waiters;
    sv.api_keys = o.api_keys;
    sv.operator_keys = o.operator_keys;
    sv.viewer_keys = o.viewer_keys;
    sv.model_digest = o.model_digest;
    sv.model_loaded_at = o.model_loaded_at;
    server = std::make_unique<rebound::Server>(*service, sv);
    port = server->bind();
    if (o.serving) serve();
  }

  /// Starts Server::run on a thread (HarnessOptions::serving: at construction).
  void serve() {
    server_thread = std::thread([this] { server->run(); });
  }

  ~ServerHarness() {
    if (server) server->stop();
    if (server_thread.joinable()) server_thread.join();
    service->shutdown(std::chrono::seconds(10));
    server.reset();
    service.reset();
    work.reset();
    io.stop();
    io_thread.join();
    inference.join();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    if (!bearer.empty()) c.set_bearer_token_auth(bearer.c_str());
    return c;
  }
  httplib::Result submit(const nlohmann::json& body) const {
    return client().Post("/v1/inferences", body.dump(), "application/json");
  }
  nlohmann::json poll(const std::string& id) const {
    auto res = client().Get(("/v1/inferences/" + id).c_str());
    REQUIRE(res);
    return nlohmann::json::parse(res->body);
  }
  // Waits until the job's callback is final (delivered or failed) and returns its record.
  nlohmann::json wait_callback_final(const std::string& id) const {
    nlohmann::json last;
    const bool done = eventually([&] {
      last = poll(id);
      const auto state = last["callback"]["state"];
      return state == "delivered" || state == "failed";
    });
    REQUIRE_MESSAGE(done, last.dump());
    return last;
  }

  std::string bearer;  // sent by client() when set
  boost::asio::thread_pool inference;
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::thread io_thread{[this] { io.run(); }};
  rebound::Model* model_ptr = nullptr;  // owned by the service
  std::unique_ptr<rebound::JobQueue> service;
  std::unique_ptr<rebound::Server> server;
  int port = 0;
  std::thread server_thread;
};

/// Checks an error answer: status, JSON content type, code, a message, and the field if any.
inline void check_error(const httplib::Result& res, int status, const std::string& code,
                        const std::string& field = {}) {
  REQUIRE(res);
  CHECK(res->status == status);
  CHECK(res->get_header_value("Content-Type") == "application/json");
  const nlohmann::json body = nlohmann::json::parse(res->body, nullptr, false);
  REQUIRE_MESSAGE(body.is_object(), res->body);
  CHECK(body["error"]["code"] == code);
  CHECK(body["error"]["message"].is_string());
  CHECK_FALSE(body["error"]["message"].get<std::string>().empty());
  if (field.empty()) {
    CHECK_FALSE(body["error"].contains("field"));
  } else {
    CHECK(body["error"]["field"] == field);
  }
}

}  // namespace rebound::test

// Server: the HTTP routes of DESIGN.md on cpp-httplib, translating to and from a Service.
#include "rebound/server.hpp"

#include <httplib.h>
#include <openssl/crypto.h>

#include <atomic>
#include <future>
#include <utility>

#include <nlohmann/json.hpp>

#include "rebound/error.hpp"
#include "rebound/submission.hpp"
#include "rebound/version.hpp"

namespace rebound {
namespace {

constexpr const char* json_type = "application/json";

const std::string& openapi_document() {
  static const std::string doc = [] {
    std::string text =
#include "openapi.json.inc"
        ;
    const std::string placeholder = "VERSION";
    text.replace(text.find(placeholder), placeholder.size(), version);
    return text;
  }();
  return doc;
}

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(), json_type);
}

void send_error(httplib::Response& res, const ApiError& error) {
  send_json(res, error.status, error.to_json());
}

// The error body for statuses that cpp-httplib produces itself, before any route runs.
ApiError error_for_status(int status, const httplib::Request& req) {
  switch (status) {
    case 404:
      return {404, "not_found", "No route for " + req.method + " " + req.path + ".", {}};
    case 405:
      return {405, "method_not_allowed", "Method " + req.method + " is not allowed here.", {}};
    case 413:
      return {413, "payload_too_large", "The request body is over the size limit.", {}};
    case 414:
      return {414, "uri_too_long", "The request URI is too long.", {}};
    case 400:
      return {400, "bad_request", "The request could not be read.", {}};
    default:
      return {status, "bad_request", "The request could not be read.", {}};
  }
}

// The 503 answers shared by submissions, invocations and redeliveries.
void send_queue_full(httplib::Response& res) {
  res.set_header("Retry-After", "1");
  send_error(res, {503, "queue_full", "The queue is full; retry later.", {}});
}

void send_shutting_down(httplib::Response& res) {
  send_error(res, {503, "shutting_down", "The server is shutting down.", {}});
}

}  // namespace

struct Server::Impl {
  Impl(Service& s, ServerOptions o) : service(s), options(std::move(o)) {
    const std::size_t threads = options.http_threads;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_tcp_nodelay(true);
    // cpp-httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port
    // and silently take half the traffic. Reuse the address only.
    // The listening socket is remembered so that bind() can raise its backlog (see there).
    http.set_socket_options([this](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_socket = sock;
    });
    http.set_keep_alive_max_count(100000);
    http.set_payload_max_length(options.max_body_bytes);
    http.set_error_handler(httplib::Server::HandlerWithResponse(
        [](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          send_error(res, error_for_status(res.status, req));
          return httplib::Server::HandlerResponse::Handled;
        }));
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          send_error(res, {500, "internal_error", "The server failed to handle the request.", {}});
        });

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, {401,
                       "unauthorized",
                       "This server requires an API key: Authorization: Bearer <key>.",
                       {}});
      return httplib::Server::HandlerResponse::Handled;
    });

    http.Post("/v1/inferences",
              [this](const httplib::Request& req, httplib::Response& res) { submit(req, res); });
    http.Get(R"(/v1/inferences/([^/]+))",
             [this](const httplib::Request& req, httplib::Response& res) {
               poll(req.matches[1].str(), res);
             });
    http.Post(R"(/v1/inferences/([^/]+)/redeliver)",
              [this](const httplib::Request& req, httplib::Response& res) {
                redeliver(req.matches[1].str(), res);
              });
    http.Get("/v1/inferences", [this](const httplib::Request& req, httplib::Response& res) {
      list_failed(req, res);
    });
    http.Post("/invocations",
              [this](const httplib::Request& req, httplib::Response& res) { invoke(req, res); });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(service.render_metrics(), "text/plain; version=0.0.4");
    });
    http.Get("/ping", [this](const httplib::Request&, httplib::Response& res) {
      if (service.ready()) {
        res.status = 200;
        res.set_content("", "text/plain");
      } else {
        send_error(res,
                   {503, "not_ready", "The model is not ready or the server is stopping.", {}});
      }
    });
    http.Get("/openapi.json", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(openapi_document(), json_type);
    });
  }

  void submit(const httplib::Request& req, httplib::Response& res) {
    SubmissionParse parsed = parse_submission(req.body, options.guard);
    if (parsed.error) return send_error(res, *parsed.error);
    Job& job = *parsed.job;
    if (auto invalid = service.model().validate(job.input)) {
      return send_error(res,
                        {422, invalid->code, "The field 'input' " + invalid->message, "input"});
    }
    const std::string id = job.id;
    switch (service.submit(std::move(job))) {
      case SubmitStatus::accepted:
      case SubmitStatus::duplicate: {
        const std::string status_url = "/v1/inferences/" + id;
        res.set_header("Location", status_url);
        return send_json(res, 202,
                         {{"message", "Received"}, {"id", id}, {"status_url", status_url}});
      }
      case SubmitStatus::conflict:
        return send_error(
            res, {409, "id_conflict", "A different job with id '" + id + "' was already submitted.",
                  "id"});
      case SubmitStatus::queue_full:
        return send_queue_full(res);
      case SubmitStatus::not_ready:
        res.set_header("Retry-After", "5");
        return send_error(res, {503, "not_ready", "The model is not ready yet.", {}});
      case SubmitStatus::shutting_down:
        return send_shutting_down(res);
      case SubmitStatus::store_error:
        return send_error(res, {500, "store_error", "The job could not be stored.", {}});
    }
  }

  // SageMaker's synchronous inference: the body is the model input, the answer its output.
  void invoke(const httplib::Request& req, httplib::Response& res) {
    const std::string attributes = req.get_header_value("X-Amzn-SageMaker-Custom-Attributes");
    if (!attributes.empty()) res.set_header("X-Amzn-SageMaker-Custom-Attributes", attributes);
    nlohmann::json input = nlohmann::json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (input.is_discarded()) {
      return send_error(res, {400, "invalid_json", "The request body is not valid JSON.", {}});
    }
    if (auto invalid = service.model().validate(input)) {
      return send_error(res, {422, invalid->code, "The input " + invalid->message, {}});
    }
    // The HTTP thread waits for the batch its request joins; the promise outlives a timeout.
    auto result = std::make_shared<std::promise<Prediction>>();
    auto future = result->get_future();
    const SubmitStatus status =
        service.invoke(std::move(input), [result](const Prediction& p) { result->set_value(p); });
    switch (status) {
      case SubmitStatus::accepted:
        break;
      case SubmitStatus::queue_full:
        return send_queue_full(res);
      case SubmitStatus::not_ready:
        return send_error(res, {503, "not_ready", "The model is not ready yet.", {}});
      default:
        return send_shutting_down(res);
    }
    if (future.wait_for(options.invocation_timeout) != std::future_status::ready) {
      return send_error(res, {504,
                              "inference_timeout",
                              "The model did not answer within the invocation timeout.",
                              {}});
    }
    const Prediction prediction = future.get();
    if (prediction.ok()) return send_json(res, 200, prediction.output());
    const ErrorInfo& error = prediction.error();
    const int http_status = error.code == "invalid_input"       ? 422
                            : error.code == "shutting_down"     ? 503
                            : error.code == "inference_timeout" ? 504
                                                                : 500;
    send_error(res, {http_status, error.code, error.message, {}});
  }

  bool authorized(const httplib::Request& req) const {
    if (options.api_keys.empty() || req.path == "/ping" || req.path == "/openapi.json") return true;
    const std::string header = req.get_header_value("Authorization");
    constexpr std::string_view scheme = "Bearer ";
    if (header.size() <= scheme.size() || header.compare(0, scheme.size(), scheme) != 0)
      return false;
    const std::string_view given = std::string_view(header).substr(scheme.size());
    bool match = false;
    for (const auto& key : options.api_keys) {
      // Constant time for a given length, so a wrong key reveals nothing but its length.
      match |=
          key.size() == given.size() && CRYPTO_memcmp(key.data(), given.data(), key.size()) == 0;
    }
    return match;
  }

  void redeliver(const std::string& id, httplib::Response& res) {
    switch (is_valid_job_id(id) ? service.redeliver(id) : RedeliverStatus::not_found) {
      case RedeliverStatus::accepted:
        return send_json(
            res, 202,
            {{"message", "Redelivering"}, {"id", id}, {"status_url", "/v1/inferences/" + id}});
      case RedeliverStatus::not_found:
        return send_error(res, {404, "not_found", "No job with id '" + id + "'.", {}});
      case RedeliverStatus::not_failed:
        return send_error(res, {409,
                                "callback_not_failed",
                                "Only a callback that was given up can be redelivered.",
                                {}});
      case RedeliverStatus::queue_full:
        return send_queue_full(res);
      case RedeliverStatus::shutting_down:
        return send_shutting_down(res);
    }
  }

  void list_failed(const httplib::Request& req, httplib::Response& res) {
    const std::string state = req.get_param_value("callback_state");
    if (state != "failed") {
      return send_error(res, {422, "invalid_field",
                              "List jobs with callback_state=failed (the only listing offered).",
                              "callback_state"});
    }
    std::size_t limit = 100;
    if (req.has_param("limit")) {
      const std::string text = req.get_param_value("limit");
      const bool digits = !text.empty() && text.size() <= 4 &&
                          text.find_first_not_of("0123456789") == std::string::npos;
      limit = digits ? std::stoul(text) : 0;
      if (limit < 1 || limit > 1000) {
        return send_error(res, {422, "invalid_field", "limit must be 1 to 1000.", "limit"});
      }
    }
    nlohmann::json jobs = nlohmann::json::array();
    for (const auto& record : service.failed_callbacks(limit))
      jobs.push_back(to_status_json(record));
    send_json(res, 200, {{"jobs", std::move(jobs)}});
  }

  void poll(const std::string& id, httplib::Response& res) {
    std::optional<JobRecord> record;
    if (is_valid_job_id(id)) record = service.find(id);
    if (!record) return send_error(res, {404, "not_found", "No job with id '" + id + "'.", {}});
    send_json(res, 200, to_status_json(*record));
  }

  Service& service;
  ServerOptions options;
  httplib::Server http;
  std::atomic<int> bound_port{0};
  std::atomic<socket_t> listen_socket{INVALID_SOCKET};
};

Server::Server(Service& service, ServerOptions options) {
  if (options.http_threads == 0) throw Error("Server: http_threads must be at least 1");
  if (options.port < 0 || options.port > 65535) throw Error("Server: port must be 0..65535");
  impl_ = std::make_unique<Impl>(service, std::move(options));
}

Server::~Server() {
  stop();
}

int Server::bind() {
  const auto& o = impl_->options;
  const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host)
                               : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port <= 0) {
    throw Error("cannot listen on " + o.host + ":" + std::to_string(o.port) +
                " (address in use, or not an address of this machine)");
  }
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of new connections overflows it and
  // clients see resets. Listening again on the bound socket raises the backlog.
  if (impl_->listen_socket != INVALID_SOCKET) ::listen(impl_->listen_socket, SOMAXCONN);
  impl_->bound_port = port;
  return port;
}

void Server::run() {
  if (impl_->bound_port == 0) bind();
  impl_->http.listen_after_bind();
}

void Server::stop() {
  if (impl_) impl_->http.stop();
}

int Server::port() const {
  return impl_->bound_port;
}

}  // namespace rebound

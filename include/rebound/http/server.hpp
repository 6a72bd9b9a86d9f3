// Server: the HTTP front of a JobQueue (the routes of docs/http-api.md), on Boost.Beast.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rebound/delivery/address_guard.hpp"
#include "rebound/job_queue.hpp"

namespace rebound {

/// Where each model of SageMaker's multi-model mode comes from (`POST /models` says, the
/// repository's ModelLoader reads): model name -> directory. Thread-safe.
class ModelUrls {
 public:
  void set(const std::string& name, const std::string& url) {
    std::lock_guard<std::mutex> lock(mutex_);
    urls_[name] = url;
  }
  /// Forgets `name`'s url if it is still `url` (a failed load, an unload).
  void erase(const std::string& name, const std::string& url) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = urls_.find(name);
    if (it != urls_.end() && it->second == url) urls_.erase(it);
  }
  std::optional<std::string> get(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = urls_.find(name);
    if (it == urls_.end()) return std::nullopt;
    return it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::string> urls_;
};

struct ServerOptions {
  ServerOptions() = default;
  /// Where to listen, everything else at its default: `Server server(queue, {"0.0.0.0", 8080})`.
  ServerOptions(std::string listen_host, int listen_port)
      : host(std::move(listen_host)), port(listen_port) {}

  std::string host = "0.0.0.0";
  int port = 8080;  ///< 0 picks a free port; `bind()` returns it
  /// Larger bodies get 413 (SageMaker's limit): a declared Content-Length at once, unread; a
  /// chunked body as soon as it passes the limit. Either way the connection then closes.
  std::size_t max_body_bytes = 6291456;
  /// The bytes the JSON trees of request bodies being parsed and submitted may take at once, as
  /// estimated from their text before they are built (detail::scan_json_text); a body that would
  /// pass it gets 503 `queue_full` with Retry-After, unparsed. Bounds what concurrent large
  /// bodies cost before the queue's own budget (JobQueueOptions::max_work_bytes) counts them.
  /// One body is always parsed when no other is.
  std::size_t max_parsing_bytes = std::size_t{256} << 20;
  /// The bytes of request bodies being received at once, as their Content-Length declares (a
  /// chunked body counts as max_body_bytes); a body that would pass it gets 503 `server_busy`
  /// with Retry-After, unread, and its connection closes. One body is always received.
  std::size_t max_receiving_bytes = std::size_t{256} << 20;
  /// Request line and headers together; beyond it 431 (414 for a request line over 8 KiB).
  std::size_t max_header_bytes = 65536;
  /// Threads that run the HTTP front: they read and write every connection (asynchronously: a
  /// connection costs a socket and its buffers, never a thread) and run the routes, whose store
  /// calls (a poll's read, a batch's write) may block them briefly unless `store_call_threads`
  /// takes those routes. No thread ever waits for a job or for a submission's commit: a
  /// submission is answered through `JobQueue::submit`, `Prefer: wait` through
  /// `async_wait`, `POST /invocations` from the worker that ran the model. A quarter of them at
  /// most (of the store-call threads, when there are some) take batches at once.
  std::size_t http_threads = 16;
  /// Threads of their own for the routes whose store calls may wait (a poll, a cancel, a
  /// redelivery, a batch, /metrics, the console's listings: with SQLite each read waits for the
  /// writes queued before it), so that the `http_threads` only read, route and write. 0, the
  /// default: those routes run on the HTTP threads. Submissions (answered through
  /// `JobQueue::submit`), `/invocations` and `/ping` always stay on the front.
  std::size_t store_call_threads = 0;
  /// Connections open at once; one more is closed as soon as it is accepted (the process needs as
  /// many file descriptors: rebound-server raises its soft RLIMIT_NOFILE to the hard limit).
  std::size_t max_connections = 10000;
  /// Connections open at once from one client address; 0, the default, is no limit (behind a
  /// proxy or a load balancer every connection comes from its address).
  std::size_t max_connections_per_address = 0;
  /// Requests that wait for a job at once (`Prefer: wait`); beyond it a poll gets 503
  /// `too_many_waiters` (with Retry-After) and a submission its 202 at once. Each costs its
  /// connection and a few hundred bytes. The queue's own bound on registered waits
  /// (JobQueueOptions::max_waiting) must be at least as large for all of them to wait.
  std::size_t max_waiters = 10000;
  /// Idle time allowed before a request's first byte, on a new or a kept-alive connection.
  std::chrono::milliseconds keep_alive_timeout{5000};
  /// From a request's first byte: to the end of its headers (else the connection is closed) and
  /// to the end of its body (else 408).
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{60000};
  /// A response must be taken by the client within this, from its first byte written (each
  /// write within 5 s): a client that reads a few bytes now and then cannot hold a thread.
  std::chrono::milliseconds response_timeout{60000};
  /// API keys, each "NAME:KEY" or a bare "KEY" (its own name). When any key is set, every route
  /// but `/ping`, `/openapi.json` and `/v1/webhook-keys` requires `Authorization: Bearer <key>`;
  /// else 401. With two or more names each name is a **tenant**: its jobs are its own (ids unique
  /// per tenant; another tenant's job answers 404), its callbacks are signed with its own keys
  /// (GET /v1/webhook-secret), and names must be 1-64 of `A-Z a-z 0-9 _ -`. With one name there
  /// is one tenant, as without keys. Keys that share a name are one tenant's (rotate a key by
  /// giving the new one the old one's name). A key that holds ':' is read as NAME:KEY.
  std::vector<std::string> api_keys;
  /// Operator keys, in the same forms: API keys (and tenants) that may also, when there are
  /// several tenants, read what spans them (GET /v1/callback-endpoints, GET /metrics) and pause or
  /// resume a receiver origin; a tenant's own key gets 403 there. They also use the operator
  /// console: read every tenant's jobs, cancel, redeliver, pause and resume.
  std::vector<std::string> operator_keys;
  /// Viewer keys, in the same forms: they read everything an operator key reads (the operator
  /// console at /console/, its JSON routes, GET /v1/callback-endpoints, /v1/stats, /metrics) and
  /// act on nothing (403). Operator and viewer keys turn the console on (docs/console.md); with
  /// neither, /console/ answers 404. Both kinds may also use the ordinary API as their tenant.
  std::vector<std::string> viewer_keys;
  /// How long `POST /invocations` waits for its result before answering 504 (SageMaker allows 60
  /// s).
  std::chrono::milliseconds invocation_timeout{60000};
  /// `run_until_signal`: how long the queue may drain after the first SIGINT or SIGTERM (inside
  /// SageMaker's 30 s).
  std::chrono::milliseconds drain_timeout{25000};
  /// What `GET /v1/models` says of the queue's model, served as a repository of one model
  /// (named by `Model::name()`, version "1"): its digest (`model_digest` of the spec it was made
  /// from; empty: not said) and when it was loaded (none: when the Server was made).
  std::string model_digest;
  /// The digests of a repository's versions (JobQueue built on a ModelRepository), each by
  /// "<name>/<version>"; a version without one has no `digest`.
  std::map<std::string, std::string> model_digests;
  std::optional<std::chrono::system_clock::time_point> model_loaded_at;
  /// The model repository's directory (`--model-repository`): `PUT
  /// /v1/models/{name}/versions/{version}` loads `<dir>/<name>/<version>/` through the queue's
  /// ModelLoader (404 when there is no such directory), and digests what it loaded. Empty: no
  /// version is loaded over HTTP (409 no_repository).
  std::string model_repository;
  /// SageMaker's multi-model container contract (`POST /models`, `GET /models`, `GET` and
  /// `DELETE /models/{name}`, `POST /models/{name}/invoke`): each model's directory must lie
  /// inside `model_repository` (the root, /opt/ml/models in SageMaker), and is written to
  /// `model_urls` for the queue's ModelLoader to read (rebound-server's reads it as version "1"
  /// of the model). Off: those routes answer 404.
  bool sagemaker_multi_model = false;
  std::shared_ptr<ModelUrls> model_urls;
};

/// "sha256:<hex>" over a model spec's files, as `GET /v1/models` names a version: for a directory,
/// every regular file under it (a link to a file counts; directories are not followed through
/// links, and entries this user may not open or links that lead nowhere are left out), ordered by
/// the bytes of their paths relative to the directory ('/' between parts), each as that path, a
/// NUL byte, its size in decimal, a NUL byte and its bytes (so that moving bytes between files,
/// or renaming one, changes the digest); for a file, its bytes alone; for a built-in spec
/// (`echo`, `sleep:S`), the spec's text. Reads every byte: a few seconds for gigabytes. Throws
/// rebound::Error when the spec is no readable file or directory, or a file cannot be read or
/// changes while it is.
std::string model_digest(const std::string& spec);

/// Serves a JobQueue over HTTP:
///   POST /v1/inferences, GET /v1/inferences/{id}, POST /v1/inferences/{id}/redeliver,
///   GET /v1/inferences?callback_state=failed, POST /invocations, GET /ping, GET /metrics,
///   GET /openapi.json, GET /v1/models, GET /v1/models/{name} (and more: docs/http-api.md)
/// Errors have the shape {"error": {"code", "message", "field"?}} (see docs/http-api.md); a known
/// path with another method gets 405 with `Allow`. No request can crash it or make it hold
/// memory beyond the limits of ServerOptions. HTTP/1.1 on Boost.Beast: every connection is
/// served asynchronously by `http_threads` threads, so slow and idle clients cost sockets, not
/// threads (docs/operations.md says what it withstands bare, and what nginx adds in front).
///
/// Callback URLs are checked at submission with the queue's address policy
/// (`queue.operations().callback_guard()`, set by `JobQueueOptions::allow_private_callbacks`).
///
/// Example (a whole server: serves until SIGINT or SIGTERM, then drains and returns 0):
///   rebound::JobQueue queue(std::make_unique<MyModel>(), rebound::make_store("sqlite:jobs.db"));
///   return rebound::Server(queue, {"0.0.0.0", 8080}).run_until_signal();
///
/// Or by hand:
///   rebound::Server server(queue, {"127.0.0.1", 8080});
///   server.bind();
///   std::thread t([&] { server.run(); });
///   ...
///   server.stop(); t.join();
///
/// Threads: `run` serves on the calling thread and `http_threads - 1` threads of its own.
/// Thread-safety: `stop` and `port` may be called from any thread; `bind` and `run` (or
/// `run_until_signal`) once each. The JobQueue must outlive the Server.
class Server final {
 public:
  Server(JobQueue& queue, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds the listening socket and returns the port. Throws rebound::Error when it cannot.
  int bind();

  /// Serves requests until `stop()`; binds first if `bind()` was not called. Blocks.
  void run();

  /// Serves until SIGINT or SIGTERM (binding first if `bind()` was not called), then stops
  /// taking work (submissions and `/ping` answer 503 while polls are still answered), drains the
  /// queue for up to `drain_timeout`, stops serving and returns 0; 1 when work was still in flight
  /// at the deadline, whose running inferences it then gives up (JobQueue::abandon_running: a
  /// model that polls `rebound::cancellation_requested()` returns, and their jobs stay in the
  /// store). A second signal during the drain ends it at once (status 1). While it runs,
  /// SIGINT and SIGTERM are handled through Asio's signal_set (whichever thread receives them);
  /// afterwards their former handling is back. Throws rebound::Error when it cannot bind.
  int run_until_signal();

  /// Stops serving; `run` returns. Safe to call more than once, and before `run`.
  void stop();

  /// The bound port, or 0 before `bind()`.
  int port() const;

  /// Serves `bytes` as the requests of one connection, without a socket, and returns what the
  /// server wrote back. For tests and fuzzing. Not to be called concurrently with itself.
  std::string serve_connection_bytes(std::string bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rebound

// Server: the HTTP routes of docs/http-api.md on the Beast front (http_front.hpp), translating to
// and from a JobQueue. Routes that wait for a job answer through its async_wait or async_invoke.
#include "rebound/http/server.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include "../pipeline/front_door.hpp"
#include "common/embedded_files.hpp"
#include "common/submission.hpp"
#include "common/text.hpp"
#include "common/trace_context.hpp"
#include "console.hpp"
#include "cursor_seal.hpp"
#include "http_front.hpp"
#include "list_cursor.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/detail/wire.hpp"
#include "rebound/error.hpp"
#include "rebound/tenant.hpp"
#include "rebound/version.hpp"

namespace rebound {
using namespace rebound::detail;  // the wire formats and parsers of the routes
namespace {

constexpr const char* json_type = "application/json";

// docs/openapi.json, embedded at build time, with this build's version in it.
const std::string& openapi_document() {
  static const std::string doc = [] {
    const detail::EmbeddedFile& file = detail::openapi_files().at(0);
    std::string text(file.data, file.size);
    const std::string placeholder = "\"VERSION\"";
    text.replace(text.find(placeholder), placeholder.size(), "\"" + std::string(version) + "\"");
    return text;
  }();
  return doc;
}

void send_json(HttpResponse& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(detail::dump_json(body), json_type);
}

void send_json_text(HttpResponse& res, int status, std::string body) {
  res.status = status;
  res.set_content(std::move(body), json_type);
}

// The most bytes of entries one listing answer holds: past it the page ends early, with its
// next_cursor.
constexpr std::size_t max_list_answer_bytes = 1 << 20;

void send_error(HttpResponse& res, const ApiError& error) {
  send_json(res, error.status, error.to_json());
}

// A header a route reads one value of, given more than once, is refused (400 invalid_header)
// rather than one value picked: a proxy before the server may have read the other. `advice` ends
// the message ("X is given more than once: advice.").
bool given_once(const HttpRequest& req, std::string_view name, std::string_view advice,
                HttpResponse& res) {
  if (req.header_count(name) <= 1) return true;
  std::string message(name);
  message.append(" is given more than once: ").append(advice).append(".");
  send_error(res, {400, "invalid_header", std::move(message), {}});
  return false;
}

// The error body for what the front answers itself, before any route runs.
ApiError error_for_status(int status) {
  switch (status) {
    case 413:
      return {413, "payload_too_large", "The request body is over the size limit.", {}};
    case 408:
      return {408, "request_timeout", "The request did not arrive in time.", {}};
    case 414:
      return {414, "uri_too_long", "The request URI is too long.", {}};
    case 431:
      return {431,
              "header_too_large",
              "The request line and headers (or a chunked body's trailer) are over the size limit.",
              {}};
    case 500:
      return {500, "internal_error", "The server failed to handle the request.", {}};
    default:
      return {status, "bad_request", "The request could not be read.", {}};
  }
}

// A place among at most `limit` requests that do one thing at once (wait for a job, submit a
// batch); false when all are taken. Given back when it goes, or by `release`. Movable, so that
// it travels with a wait.
class Place {
 public:
  using Count = std::shared_ptr<std::atomic<std::size_t>>;
  Place() = default;
  Place(Count taken, std::size_t limit) : taken_(std::move(taken)) {
    if (taken_->fetch_add(1) >= limit) {
      --*taken_;
      taken_.reset();
    }
  }
  Place(Place&& other) noexcept = default;
  Place& operator=(Place&& other) noexcept {
    if (this != &other) {
      release();
      taken_ = std::move(other.taken_);
    }
    return *this;
  }
  Place(const Place&) = delete;
  Place& operator=(const Place&) = delete;
  ~Place() { release(); }
  void release() {
    if (taken_) --*std::exchange(taken_, nullptr);
  }
  explicit operator bool() const { return taken_ != nullptr; }

 private:
  Count taken_;  // shared: a wait may end after the Server that counted it
};

// The 202 answer to a job accepted (or the same request again), under the id its caller gave.
nlohmann::json accepted_json(const std::string& id) {
  return {{"message", "Received"}, {"id", id}, {"status_url", "/v1/inferences/" + id}};
}

// Why a submission was refused, as its answer says it (the route's, or one job's of a batch), and
// the Retry-After seconds that go with it (0: none). The 503 answers of invocations, waits and
// redeliveries are these too.
struct RefusalAnswer {
  ApiError error;
  int retry_after = 0;
};

// The one table from rebound::errc to HTTP: status, error code, message, Retry-After. Every
// route's refusal comes from here. (`id` names the job where the message mentions it; `why` is
// the queue's reason for invalid_job and invalid_input.)
RefusalAnswer refusal_for(boost::system::error_code ec, const std::string& id = {},
                          const Submitted& why = {}) {
  if (ec.category() == error_category()) {
    switch (static_cast<errc>(ec.value())) {
      case errc::id_conflict:
        return {{409, "id_conflict", "A different job with id '" + id + "' was already submitted.",
                 "id"}};
      case errc::queue_full:
        return {{503, "queue_full", "The queue is full; retry later.", {}}, 1};
      case errc::tenant_quota:
        return {{429,
                 "tenant_quota",
                 "Your jobs hold your share of the queue; retry when some are done.",
                 {}},
                1};
      case errc::tenant_rate:
        return {
            {429, "tenant_rate", "You submit jobs faster than your rate allows; retry later.", {}},
            1};
      case errc::not_ready:
        return {{503, "not_ready", "The model is not ready yet.", {}}, 5};
      case errc::store_unavailable:
        return {{503, "store_unavailable", "The job store is failing; retry later.", {}}, 5};
      case errc::invalid_input:
        return {{422, why.reason.code, "The field 'input' " + why.reason.message, "input"}};
      case errc::invalid_job:
        return {{422, "invalid_field", why.reason.message, why.field}};
      case errc::not_failed:
        return {{409,
                 "callback_not_failed",
                 "Only a callback that was given up can be redelivered.",
                 {}}};
      case errc::already_final:
        return {{409,
                 "already_finished",
                 "The job '" + id + "' is final already and cannot be cancelled.",
                 {}}};
      case errc::no_transport:
        return {{422, "invalid_field",
                 "This server cannot deliver callbacks; leave 'callback_url' out and poll the job.",
                 "callback_url"}};
      case errc::not_found:
        return {{404, "not_found", "No job with id '" + id + "'.", {}}};
      case errc::model_not_found:
        return {{404, "model_not_found", why.reason.message, "model"}};
      case errc::version_unavailable:
        return {{409, "version_unavailable", why.reason.message, "version"}};
      // (Answers to model changes, which their routes give with their own messages.)
      case errc::load_failed:
        return {{409, "load_failed", "The model version could not be loaded.", {}}};
      case errc::version_in_route:
        return {{409, "version_in_route", "The model's route sends jobs to that version.", {}}};
      case errc::route_changed:
        return {{412, "route_changed", "The model's route changed first.", {}}};
      case errc::invalid_route:
        return {{422, "invalid_field", "The route is not one.", "split"}};
      case errc::no_loader:
        return {{409, "no_repository", "This server loads no model versions while it runs.", {}}};
      case errc::too_many_waiters:
        return {{503,
                 "too_many_waiters",
                 "Too many requests wait for jobs at once (Prefer: wait); retry, or poll without "
                 "waiting.",
                 {}},
                1};
      case errc::shutting_down:
        break;
    }
  }
  return {{503, "shutting_down", "The server is shutting down.", {}}};
}

void send_refusal(HttpResponse& res, const RefusalAnswer& refusal) {
  if (refusal.retry_after > 0) res.set_header("Retry-After", std::to_string(refusal.retry_after));
  send_error(res, refusal.error);
}

void send_store_unavailable(HttpResponse& res) {
  send_refusal(res, refusal_for(errc::store_unavailable));
}

// Longest `Prefer: wait=N` honoured, in seconds.
constexpr int max_preferred_wait = 60;

// The N of a `Prefer: wait=N` preference (RFC 7240: comma-separated preferences in one or more
// Prefer headers, names case-insensitive, an optional quoted value), capped at 60 s; nullopt when
// there is none or it is not a number.
std::optional<int> preferred_wait(const HttpRequest& req) {
  const std::size_t headers = std::min<std::size_t>(req.header_count("Prefer"), 16);
  for (std::size_t h = 0; h < headers; ++h) {
    const std::string value = req.header("Prefer", h);
    std::size_t pos = 0;
    while (pos <= value.size()) {
      std::size_t end = value.find(',', pos);
      if (end == std::string::npos) end = value.size();
      std::string_view pref = std::string_view(value).substr(pos, end - pos);
      pos = end + 1;
      pref = pref.substr(0, pref.find(';'));  // parameters of a preference mean nothing here
      while (!pref.empty() && (pref.front() == ' ' || pref.front() == '\t'))
        pref.remove_prefix(1);
      while (!pref.empty() && (pref.back() == ' ' || pref.back() == '\t'))
        pref.remove_suffix(1);
      const std::size_t eq = pref.find('=');
      if (eq == std::string_view::npos) continue;
      std::string_view name = pref.substr(0, eq), number = pref.substr(eq + 1);
      while (!name.empty() && name.back() == ' ')
        name.remove_suffix(1);
      while (!number.empty() && number.front() == ' ')
        number.remove_prefix(1);
      if (name.size() != 4 || !detail::starts_with_ignoring_case(std::string(name), "wait")) {
        continue;
      }
      if (number.size() >= 2 && number.front() == '"' && number.back() == '"') {
        number = number.substr(1, number.size() - 2);
      }
      if (number.empty() || number.find_first_not_of("0123456789") != std::string_view::npos) {
        return std::nullopt;
      }
      // Any number of digits: a wait longer than the longest is the longest.
      while (number.size() > 1 && number.front() == '0')
        number.remove_prefix(1);
      if (number.size() > 9) return max_preferred_wait;
      return std::min(std::stoi(std::string(number)), max_preferred_wait);
    }
  }
  return std::nullopt;
}

// Who may call a route, as flags; none (any_key): any API key, as its tenant. Without keys
// configured, everyone may call every route but the console's.
enum Access : unsigned {
  any_key = 0,
  open = 1,            // no key needed: /ping, /openapi.json, /v1/webhook-keys, the console's page
  acts = 2,            // not with a viewer key: it changes something, or hands out the secret
  spans = 4,           // with several tenants, an operator or a viewer key: it spans them all
  console_page = 8,    // only while the console is on (an operator or a viewer key is configured)
  console_json = 16,   // the console on, and an operator or a viewer key
  on_front = 32,       // never waits for the store: on the HTTP thread, store-call threads or not
  operates = 64,       // an operator key only (none configured: nobody): it changes the models
  loads_models = 128,  // with keys configured, an operator key (SageMaker's multi-model calls,
                       // which carry none, run on a container without keys)
  invokes = 256        // SageMaker's invocation: reads its custom attributes (and, without a
                       // model in its path, its target model) headers
};

// What a route does with a request body: none, JSON (a submission's JSON, where a form-encoded
// body is refused with a hint), or a body it reads not at all.
enum class Body { none, json, submission, ignored };

// Matches `path` against a route's pattern: literal text, `{name}` for one non-empty segment
// and `{name...}` for the rest of the path (possibly empty). The value captured goes to `param`.
bool match_route(std::string_view pattern, std::string_view path, std::string& param) {
  std::size_t p = 0, q = 0;
  while (p < pattern.size()) {
    if (pattern[p] != '{') {
      if (q >= path.size() || path[q] != pattern[p]) return false;
      ++p;
      ++q;
      continue;
    }
    const std::size_t close = pattern.find('}', p);
    const bool rest = pattern.compare(close - 3, 3, "...") == 0;
    const std::size_t end = rest ? path.size() : std::min(path.find('/', q), path.size());
    if (!rest && end == q) return false;  // a segment is never empty
    // Several parameters come joined by '/' (each is one segment: it holds none).
    if (!param.empty()) param += '/';
    param.append(path.substr(q, end - q));
    p = close + 1;
    q = end;
  }
  return q == path.size();
}

// A body sent compressed, or with a transfer coding other than plain chunked, is refused rather
// than guessed at (the front read it, within the limit); nullopt when it is plain.
std::optional<ApiError> encoding_error(const HttpRequest& req) {
  // (Every field: two would be read as one list, "identity, gzip", by a hop that joins them.)
  bool compressed = false;
  for (std::size_t i = 0; i < req.header_count("Content-Encoding"); ++i) {
    const std::string encoding = req.header("Content-Encoding", i);
    compressed =
        compressed || (!encoding.empty() && !detail::equals_ignoring_case(encoding, "identity"));
  }
  const bool coded = req.has_header("Transfer-Encoding") &&
                     (req.header_count("Transfer-Encoding") != 1 ||
                      !detail::equals_ignoring_case(req.header("Transfer-Encoding"), "chunked"));
  if (!compressed && !coded) return std::nullopt;
  return ApiError{415,
                  "unsupported_encoding",
                  "Send the body as is or chunked: no Content-Encoding, and no "
                  "Transfer-Encoding but chunked.",
                  {}};
}

}  // namespace

// One API key: whose it is, and what it may do beyond its tenant's jobs.
struct Credential {
  enum class Role { tenant, viewer, operator_ };
  std::string key;
  std::string name;    // what logs and the console call it (never the key)
  std::string tenant;  // its name; "" when the server has one tenant
  Role role = Role::tenant;
  bool bare = false;  // given without a name: its name is the key itself
  bool is_operator() const { return role == Role::operator_; }
  // Reads what spans tenants, and the console.
  bool reads_everything() const { return role != Role::tenant; }
};

// The keys of ServerOptions, parsed and checked: NAME:KEY or a bare KEY (its own name).
std::vector<Credential> parse_credentials(const ServerOptions& o) {
  std::vector<Credential> out;
  auto add = [&](const std::string& entry, Credential::Role role) {
    const char* flag = role == Credential::Role::operator_ ? "operator key"
                       : role == Credential::Role::viewer  ? "viewer key"
                                                           : "API key";
    // An empty key would be matched by "Authorization: Bearer " with nothing after it.
    if (entry.find_first_not_of(" \t\r\n") == std::string::npos) {
      throw Error(std::string("Server: an ") + flag + " must not be empty or blank");
    }
    Credential c;
    c.role = role;
    c.tenant = std::string(key_name(entry));
    if (c.tenant.size() == entry.size()) {
      c.key = entry;  // a bare key is its own name
      c.bare = true;
    } else {
      c.key = entry.substr(c.tenant.size() + 1);
      if (c.key.find_first_not_of(" \t\r\n") == std::string::npos) {
        throw Error(std::string("Server: the ") + flag + " named '" + c.tenant +
                    "' is empty or blank");
      }
    }
    out.push_back(std::move(c));
  };
  for (const auto& entry : o.api_keys)
    add(entry, Credential::Role::tenant);
  for (const auto& entry : o.operator_keys)
    add(entry, Credential::Role::operator_);
  for (const auto& entry : o.viewer_keys)
    add(entry, Credential::Role::viewer);
  std::set<std::string> names, keys;
  for (auto& c : out) {
    c.name = c.tenant;
    names.insert(c.tenant);
    if (!keys.insert(c.key).second) throw Error("Server: the same key is given twice");
  }
  // The console shows names to viewers and logs them with each action: a bare key's name is the
  // key itself, so with an operator or a viewer key every key must be named.
  const bool console = std::any_of(out.begin(), out.end(), [](const Credential& c) {
    return c.role != Credential::Role::tenant;
  });
  if (console) {
    for (const auto& c : out) {
      if (c.bare) {
        throw Error(std::string("Server: with an operator or a viewer key every key must be named, "
                                "NAME:KEY (the console shows and logs names; a bare ") +
                    (c.role == Credential::Role::operator_ ? "operator key"
                     : c.role == Credential::Role::viewer  ? "viewer key"
                                                           : "API key") +
                    " would show itself)");
      }
    }
  }
  // Keys sharing a name are one tenant's (a rotation).
  if (names.size() < 2) {
    for (auto& c : out)
      c.tenant.clear();  // one tenant: today's single queue, keys and secrets as they are
    return out;
  }
  std::size_t index = 0;
  for (const auto& c : out) {
    ++index;
    if (!is_valid_tenant_name(c.tenant)) {
      throw Error("Server: key #" + std::to_string(index) +
                  (c.tenant == c.key
                       ? " has characters other than A-Z a-z 0-9 _ - (or is longer than 64): "
                         "name it, NAME:KEY"
                       : " has a name that is not 1-64 characters of A-Z a-z 0-9 _ -"));
    }
  }
  return out;
}

namespace {
// A share of ServerOptions::max_parsing_bytes, held while a body is parsed and submitted.
class ParsingReservation {
 public:
  ParsingReservation(std::atomic<std::size_t>& total, std::size_t bytes, std::size_t limit)
      : total_(total), bytes_(bytes) {
    std::size_t now = total_.load();
    do {
      if (now > 0 && (bytes > limit || now > limit - bytes)) {
        bytes_ = 0;
        held_ = false;
        return;
      }
    } while (!total_.compare_exchange_weak(now, now + bytes));
  }
  ~ParsingReservation() { release(); }
  // Gives the share back (once the tree is the queue's, counted in its own budget).
  void release() {
    if (held_) total_ -= bytes_;
    held_ = false;
  }
  ParsingReservation(const ParsingReservation&) = delete;
  ParsingReservation& operator=(const ParsingReservation&) = delete;
  explicit operator bool() const { return held_; }

 private:
  std::atomic<std::size_t>& total_;
  std::size_t bytes_;
  bool held_ = true;
};
}  // namespace

namespace {
// Whether the Server still stands: an answer given later (below) builds itself only while it
// does, under a shared lock that the Server's destructor takes exclusively, so that no answer
// reads a Server being destroyed. The queue (which completes the waits) may outlive the Server.
struct ServerLife {
  std::shared_mutex mutex;
  bool alive = true;
};

// An answer that a route gives later (a wait, an invocation): the first of the library's
// completion and a timer answers, on the connection's strand (on the HTTP front's threads: no
// other hand-over before the answer is written); whatever comes second finds it answered.
// Only handlers of the front hold it, so it never outlives the front's io_context; the library's
// side reaches it through `when_alive`.
struct PendingAnswer : std::enable_shared_from_this<PendingAnswer> {
  using Build = std::function<void(HttpResponse&)>;

  // `fallback`: the strand's executor when the connection is gone already (the answer is then
  // dropped anyway).
  PendingAnswer(std::shared_ptr<ServerLife> server, const boost::asio::any_io_executor& fallback,
                HttpResponse r, detail::Reply rep, Place s = {})
      : life(std::move(server)),
        strand(strand_for(rep, fallback)),
        timer(strand),
        res(std::move(r)),
        reply(std::move(rep)),
        slot(std::move(s)) {}

  static boost::asio::any_io_executor strand_for(const detail::Reply& reply,
                                                 const boost::asio::any_io_executor& fallback) {
    boost::asio::any_io_executor connection = reply.executor();
    return connection ? connection
                      : boost::asio::any_io_executor(boost::asio::make_strand(fallback));
  }

  // After `timeout`, answers with what `on_time` writes (unless answered before); `on_stop`
  // answers if the Server stops first. A client that goes away first gives up the answer. From
  // any thread: the timer is armed on the strand, where everything else touches it.
  void start(std::chrono::milliseconds timeout, Build on_time, Build on_stop) {
    // Everything but the timer first: from here the strand owns this object.
    when_stopping = std::move(on_stop);
    reply.on_abandoned([weak = std::weak_ptr<PendingAnswer>(shared_from_this())] {
      if (auto self = weak.lock()) {
        boost::asio::post(self->strand, [self] { self->give_up(); });
      }
    });
    // (At once when called on the strand, as a route on the connection's thread is.)
    boost::asio::dispatch(
        strand, [self = shared_from_this(), timeout, build = std::move(on_time)]() mutable {
          if (self->done) return;  // answered, or given up, before the timer was armed
          self->timer.expires_after(timeout);
          self->timer.async_wait([self, build = std::move(build)](boost::system::error_code ec) {
            if (!ec) self->conclude_after(self->build_on, build);
          });
        });
  }

  // The Server stops: the answer is given now.
  void stop() {
    boost::asio::post(strand, [self = shared_from_this()] { self->conclude(self->when_stopping); });
  }

  // The client went away: nothing to answer, and the place is free.
  void give_up() {
    if (done) return;
    done = true;
    timer.cancel();
    slot.release();
  }

  // Answers with what `build` writes; on the strand. Once. Nothing, once the Server is gone.
  void conclude(const Build& build) {
    if (done) return;
    done = true;
    timer.cancel();
    std::shared_lock<std::shared_mutex> lock(life->mutex);
    if (!life->alive) return;
    try {
      build(res);
    } catch (...) {
      res = HttpResponse{};
      send_error(res, {500, "internal_error", "The server failed to handle the request.", {}});
    }
    reply(std::move(res));
    slot.release();  // a wait the queue still holds (until its job ends) no longer counts here
  }

  // As conclude, with the answer built on `where` first (a store-call thread: `build` reads the
  // store, which the connection's thread must not wait for), then given on the strand; whichever
  // conclusion comes first there wins. On the strand; a null `where` concludes here.
  void conclude_after(const boost::asio::any_io_executor& where, Build build) {
    if (!where) return conclude(build);
    if (done) return;
    // `res` as it stands (its headers) is the base, copied here on the strand that owns it.
    boost::asio::post(where, [self = shared_from_this(), base = res,
                              build = std::move(build)]() mutable {
      std::shared_lock<std::shared_mutex> lock(self->life->mutex);
      if (!self->life->alive) return;  // the Server is going: nobody is answered
      try {
        build(base);
      } catch (...) {
        base = HttpResponse{};
        send_error(base, {500, "internal_error", "The server failed to handle the request.", {}});
      }
      const boost::asio::any_io_executor strand = self->strand;
      boost::asio::post(strand, [self = std::move(self), built = std::move(base)]() mutable {
        self->conclude([&built](HttpResponse& out) { out = std::move(built); });
      });
    });
  }

  // Runs `then(call)` on the call's strand, from any thread (the library's completion), unless
  // the Server is gone (and its io_context with it) or the call was answered and released.
  template <typename Then>
  static void when_alive(const std::shared_ptr<ServerLife>& life,
                         const std::weak_ptr<PendingAnswer>& weak, Then then) {
    std::shared_lock<std::shared_mutex> lock(life->mutex);
    if (!life->alive) return;
    std::shared_ptr<PendingAnswer> call = weak.lock();
    if (!call) return;
    const boost::asio::any_io_executor strand = call->strand;
    boost::asio::post(strand,
                      [call = std::move(call), then = std::move(then)]() mutable { then(*call); });
  }

  std::shared_ptr<ServerLife> life;
  // Where an answer without the final record is built when it reads the store (conclude_after);
  // null: on the strand. Set before start.
  boost::asio::any_io_executor build_on;
  Build when_stopping;
  boost::asio::any_io_executor strand;  // the connection's (a strand)
  boost::asio::steady_timer timer;
  HttpResponse res;
  detail::Reply reply;
  Place slot;
  bool done = false;
};
}  // namespace

struct Server::Impl {
  Impl(JobQueue& s, ServerOptions o, std::vector<Credential> creds)
      : service(s),
        options(std::move(o)),
        credentials(std::move(creds)),
        multi_tenant(!credentials.empty() && !credentials.front().tenant.empty()),
        http(
            limits_of(options), options.http_threads,
            [this](HttpRequest& req, detail::Reply reply) { handle(req, std::move(reply)); },
            &front_error, [this](const HttpRequest& head) { return judge_head(head); }) {
    if (std::any_of(credentials.begin(), credentials.end(),
                    [](const Credential& c) { return c.reads_everything(); })) {
      std::vector<std::string> tenants;
      if (multi_tenant) {
        for (const auto& c : credentials)
          if (std::find(tenants.begin(), tenants.end(), c.tenant) == tenants.end())
            tenants.push_back(c.tenant);
        std::sort(tenants.begin(), tenants.end());
      }
      console = std::make_unique<detail::Console>(service, std::move(tenants));
    }
  }

  // What the front answers before any route: a head or body it could not take.
  static HttpResponse front_error(int status, const std::string& code) {
    HttpResponse res;
    if (code == "invalid_header") {
      send_error(res, {400,
                       "invalid_header",
                       "The request's head has a control character (NUL, a bare CR, DEL or "
                       "another).",
                       {}});
    } else if (code == "invalid_host") {
      send_error(res, {400,
                       "invalid_host",
                       "The request needs exactly one Host header (RFC 9112, section 3.2).",
                       {}});
    } else if (code == "server_busy") {
      send_refusal(res, {{503,
                          "server_busy",
                          "Too many request bodies are being received at once; retry later.",
                          {}},
                         1});
    } else {
      send_error(res, error_for_status(status));
    }
    return res;
  }

  static detail::HttpLimits limits_of(const ServerOptions& o) {
    detail::HttpLimits limits;
    limits.max_head_bytes = o.max_header_bytes;
    limits.max_body_bytes = o.max_body_bytes;
    limits.keep_alive_timeout = o.keep_alive_timeout;
    limits.header_timeout = o.header_timeout;
    limits.body_timeout = o.body_timeout;
    limits.response_timeout = o.response_timeout;
    limits.max_connections = o.max_connections;
    limits.max_connections_per_address = o.max_connections_per_address;
    limits.max_receiving_bytes = o.max_receiving_bytes;
    return limits;
  }

  // Every request, on a thread of the front: answered through `reply` now, or later by a route
  // that waits for a job (and then took `reply` with it).
  void handle(HttpRequest& req, detail::Reply reply) {
    HttpResponse res;
    try {
      dispatch(req, res, reply);
    } catch (const StoreUnavailable&) {
      // A poll, a redelivery or a listing when the store fails: the failing-store answer.
      res = HttpResponse{};
      send_store_unavailable(res);
    } catch (...) {
      res = HttpResponse{};
      send_error(res, {500, "internal_error", "The server failed to handle the request.", {}});
    }
    no_store_if_api(req, res);  // the failures' answers too
    if (reply) reply(std::move(res));
  }

  // What the API answers (jobs, results, secrets, the console's data) is never kept by a cache,
  // errors included; /ping, /openapi.json and the console's page may be.
  static void no_store_if_api(const HttpRequest& req, HttpResponse& res) {
    if (req.path.compare(0, 4, "/v1/") != 0 && req.path != "/invocations" &&
        req.path.compare(0, 7, "/models") != 0) {
      return;
    }
    for (const auto& header : res.headers)
      if (header.first == "Cache-Control") return;  // once
    res.set_header("Cache-Control", "no-store");
  }

  // A request as a route sees it: who calls, as which tenant, and what `{id}` or `{file...}`
  // named in its path. `reply` may be taken by a route that answers later (a wait).
  struct Call {
    const HttpRequest& req;
    HttpResponse& res;
    detail::Reply& reply;
    const Credential* caller;
    std::string tenant;
    std::string param;
  };

  struct Route {
    const char* method;
    const char* pattern;
    unsigned access;
    Body body;
    void (*handle)(Impl&, Call&);
  };

  // The routes of docs/http-api.md, each once: the router, the Allow lists of 405 and OPTIONS,
  // and who may call what all come from here (tests/http_api_docs.py holds /openapi.json and the
  // doc to it). A GET route answers HEAD too.
  static const std::vector<Route>& routes() {
    static const std::vector<Route> table = {
        {"GET", "/v1/inferences", any_key, Body::none,
         [](Impl& s, Call& c) { s.list_failed(c.req, c.tenant, c.res); }},
        {"POST", "/v1/inferences", any_key | on_front, Body::submission,
         [](Impl& s, Call& c) { s.submit(c); }},
        {"POST", "/v1/inferences:batch", any_key, Body::submission,
         [](Impl& s, Call& c) { s.submit_batch(c); }},
        {"GET", "/v1/inferences/{id}", any_key, Body::none,
         [](Impl& s, Call& c) { s.poll(c.req, c.tenant, c.param, c.res, c.reply); }},
        {"DELETE", "/v1/inferences/{id}", acts, Body::none,
         [](Impl& s, Call& c) { s.cancel(c.tenant, c.param, c.res); }},
        {"POST", "/v1/inferences/{id}/redeliver", acts, Body::ignored,
         [](Impl& s, Call& c) { s.redeliver(c.tenant, c.param, c.res); }},
        {"POST", "/invocations", any_key | on_front | invokes, Body::json,
         [](Impl& s, Call& c) { s.invoke(c); }},
        {"GET", "/ping", open | on_front, Body::none, [](Impl& s, Call& c) { s.ping(c.res); }},
        {"GET", "/metrics", spans, Body::none,
         [](Impl& s, Call& c) {
           c.res.set_content(s.service.telemetry().render_metrics() + s.http_metrics(),
                             "text/plain; version=0.0.4");
         }},
        {"GET", "/openapi.json", open | on_front, Body::none,
         [](Impl&, Call& c) { c.res.set_content(openapi_document(), json_type); }},
        {"GET", "/v1/callback-endpoints", spans, Body::none,
         [](Impl& s, Call& c) { s.list_endpoints(c.res); }},
        {"POST", "/v1/callback-endpoints/pause", spans | acts, Body::json,
         [](Impl& s, Call& c) { s.pause_or_resume(c, true); }},
        {"POST", "/v1/callback-endpoints/resume", spans | acts, Body::json,
         [](Impl& s, Call& c) { s.pause_or_resume(c, false); }},
        {"GET", "/v1/webhook-keys", open | on_front, Body::none,
         [](Impl& s, Call& c) { s.webhook_keys(c.req, c.caller, c.res); }},
        {"GET", "/v1/webhook-secret", acts | on_front, Body::none,
         [](Impl& s, Call& c) { s.webhook_secret(c.tenant, c.res); }},
        {"GET", "/v1/stats", spans, Body::none, [](Impl& s, Call& c) { s.stats(c.res); }},
        {"GET", "/v1/models", any_key, Body::none,
         [](Impl& s, Call& c) {
           nlohmann::json models = nlohmann::json::array();
           const std::vector<ModelInfo> all = s.service.models().list();
           for (const ModelInfo& m : all)
             models.push_back(s.model_json(m, c.caller, all.size() == 1 && m.versions.size() == 1));
           send_json(c.res, 200, {{"models", std::move(models)}});
         }},
        {"GET", "/v1/models/{name}", any_key, Body::none,
         [](Impl& s, Call& c) { s.model(c.param, c.caller, c.res); }},
        {"PUT", "/v1/models/{name}/versions/{version}", operates | acts, Body::ignored,
         [](Impl& s, Call& c) { s.load_version(c); }},
        {"DELETE", "/v1/models/{name}/versions/{version}", operates | acts, Body::none,
         [](Impl& s, Call& c) { s.unload_version(c); }},
        {"PUT", "/v1/models/{name}/route", operates | acts, Body::json,
         [](Impl& s, Call& c) { s.set_route(c); }},
        // SageMaker's multi-model container contract (ServerOptions::sagemaker_multi_model).
        {"POST", "/models", loads_models | acts, Body::json,
         [](Impl& s, Call& c) { s.mme_load(c); }},
        {"GET", "/models", any_key, Body::none, [](Impl& s, Call& c) { s.mme_list(c); }},
        {"GET", "/models/{name}", any_key, Body::none, [](Impl& s, Call& c) { s.mme_get(c); }},
        {"DELETE", "/models/{name}", loads_models | acts, Body::none,
         [](Impl& s, Call& c) { s.mme_unload(c); }},
        {"POST", "/models/{name}/invoke", any_key | on_front | invokes, Body::json,
         [](Impl& s, Call& c) {
           if (s.mme_on(c.res)) s.invoke(c, &c.param);
         }},
        // The operator console (docs/console.md): its page, and the JSON it reads.
        {"GET", "/console", console_page | on_front, Body::none,
         [](Impl&, Call& c) { c.res.set_redirect("/console/", 301); }},
        {"GET", "/console/{file...}", console_page | on_front, Body::none,
         [](Impl& s, Call& c) {
           if (!s.console->asset(c.param, c.res)) {
             send_error(c.res, {404, "not_found", "No such file of the console.", {}});
           }
         }},
        {"GET", "/v1/console/session", console_json | on_front, Body::none,
         [](Impl& s, Call& c) {
           s.console->session(c.caller->name, c.caller->is_operator(), c.res);
         }},
        {"GET", "/v1/console/overview", console_json, Body::none,
         [](Impl& s, Call& c) { s.console->overview(c.res); }},
        {"GET", "/v1/console/jobs", console_json, Body::none,
         [](Impl& s, Call& c) { s.console->jobs(c.req, c.res); }},
        {"GET", "/v1/console/jobs/{id}", console_json, Body::none,
         [](Impl& s, Call& c) {
           if (auto job = s.console_job(c.req, c.param, c.res)) s.console->job(*job, c.res);
         }},
        {"POST", "/v1/console/jobs/{id}/cancel", console_json | acts, Body::ignored,
         [](Impl& s, Call& c) { s.console_act(c, true); }},
        {"POST", "/v1/console/jobs/{id}/redeliver", console_json | acts, Body::ignored,
         [](Impl& s, Call& c) { s.console_act(c, false); }},
        {"POST", "/v1/console/dead-letters/redeliver", console_json | acts, Body::json,
         [](Impl& s, Call& c) { s.console->redeliver_all(c.req.body(), c.caller->name, c.res); }},
        {"GET", "/v1/console/servers", console_json, Body::none,
         [](Impl& s, Call& c) { s.console->servers(c.res); }},
        {"GET", "/v1/console/paused-origins", console_json, Body::none,
         [](Impl& s, Call& c) { s.console->paused(c.res); }},
    };
    return table;
  }

  // The routes a request's path names.
  struct Match {
    const Route* found = nullptr;  // the route of this method and path
    const Route* first = nullptr;  // the first route of this path, whatever its method
    std::string allow;             // the methods the path takes, for Allow
    std::string param;             // what the route's {placeholder} captured
    // Who may call: by the route asked for; for a method the path does not take (405, OPTIONS),
    // by the path's first route; an unknown path needs a key like any route.
    unsigned access() const {
      const Route* judged = found ? found : first;
      return judged ? judged->access : any_key;
    }
  };

  Match match(const HttpRequest& req) const {
    const std::string& method = req.method == "HEAD" ? std::string("GET") : req.method;
    Match m;
    for (const Route& route : routes()) {
      std::string captured;
      if (!match_route(route.pattern, req.path, captured)) continue;
      if (!m.first) m.first = &route;
      if (!m.allow.empty()) m.allow += ", ";
      m.allow += route.method;
      if (std::string_view(route.method) == "GET") m.allow += ", HEAD";
      if (!m.found && method == route.method) {
        m.found = &route;
        m.param = std::move(captured);
      }
    }
    return m;
  }

  // Whether the request's key may call what it asks for; else the 400, 401, 403 or 404 is sent.
  // Reads the head alone (the front asks before it reads a body: see judge_head).
  bool admitted(const HttpRequest& req, unsigned access, const Credential*& caller,
                HttpResponse& res) const {
    // Two Authorization headers could be read as two keys by two hops: neither is taken.
    if (!credentials.empty() && !given_once(req, "Authorization", "send one key", res)) {
      return false;
    }
    caller = authenticate(req);
    return allowed(access, caller, res);
  }

  // The front's question before it reads a body that has yet to arrive: a request its key may
  // not send, or that no route takes (404, 405), is answered now (and its body never read), so
  // that no keyless client holds the receiving budget, nor waits for its upload to hear 401.
  std::optional<HttpResponse> judge_head(const HttpRequest& req) const {
    HttpResponse res;
    no_store_if_api(req, res);
    const Credential* caller = nullptr;
    // (No route takes it, as an open GET's path with a POST: nothing would read the body.)
    if (refused(req, match(req), caller, res)) return res;
    return std::nullopt;
  }

  // Whether the head alone refuses the request (its key, its route, its query, the headers its
  // body and its route read), with the answer sent. (Past unrouted, m.found is a route.)
  bool refused(const HttpRequest& req, const Match& m, const Credential*& caller,
               HttpResponse& res) const {
    return !admitted(req, m.access(), caller, res) || unrouted(req, m, res) ||
           ambiguous_query(req, res) || unread_body(req, *m.found, res) ||
           ambiguous_invocation(req, *m.found, res);
  }

  // Whether the head says the route could not read the body, with the 400 or 415 sent.
  static bool unread_body(const HttpRequest& req, const Route& route, HttpResponse& res) {
    if (route.body != Body::json && route.body != Body::submission) return false;
    if (!given_once(req, "Content-Type", "send one", res)) return true;
    // A body is JSON; a form-encoded submission is almost always `curl -d` without -H. No
    // route takes multipart bodies.
    const std::string type = req.header("Content-Type");
    if (detail::starts_with_ignoring_case(type, "multipart/") ||
        (route.body == Body::submission &&
         detail::starts_with_ignoring_case(type, "application/x-www-form-urlencoded"))) {
      send_error(res, {415,
                       "unsupported_media_type",
                       "Send the body as JSON with Content-Type: application/json (with "
                       "curl -d, add -H 'Content-Type: application/json').",
                       {}});
      return true;
    }
    if (auto error = encoding_error(req)) {
      send_error(res, *error);
      return true;
    }
    return false;
  }

  // Whether SageMaker's headers of an invocation are ambiguous, with the 400 sent.
  static bool ambiguous_invocation(const HttpRequest& req, const Route& route, HttpResponse& res) {
    if (!(route.access & invokes)) return false;
    // Echoed as sent: one value (two would be echoed as one of them, or joined, either a guess).
    if (!given_once(req, "X-Amzn-SageMaker-Custom-Attributes", "send one", res)) return true;
    // SageMaker names the model to invoke in a header (multi-model endpoints); a route that names
    // it in its path reads no header.
    if (std::string_view(route.pattern).find('{') != std::string_view::npos) return false;
    constexpr const char* name = "X-Amzn-SageMaker-Target-Model";
    if (!given_once(req, name, "name one model", res)) return true;
    // (An empty name is no model's: SageMaker refuses it too, rather than run the default.)
    if (req.header_count(name) == 1 && req.header(name).empty()) {
      send_error(res, {400,
                       "invalid_header",
                       std::string(name) +
                           " is empty: name a model, or leave the header out for the default.",
                       {}});
      return true;
    }
    return false;
  }

  // Whether a query parameter is given twice, with the 422 sent: the route would read one value,
  // and a proxy or a cache before it may read the other.
  static bool ambiguous_query(const HttpRequest& req, HttpResponse& res) {
    const std::string* name = req.repeated_param();
    if (!name) return false;
    const std::string shown = detail::truncated_utf8(*name, 64);
    send_error(res, {422, "invalid_field",
                     "The query parameter '" + shown + "' is given more than once.", shown});
    return true;
  }

  // Whether no route takes the request, with the 404, 405 (or OPTIONS's 204) sent.
  static bool unrouted(const HttpRequest& req, const Match& m, HttpResponse& res) {
    if (!m.first) {
      send_error(res, {404, "not_found", "No route for " + req.method + " " + req.path + ".", {}});
      return true;
    }
    if (m.found) return false;
    res.set_header("Allow", m.allow);
    if (req.method == "OPTIONS") {
      res.status = 204;
      return true;
    }
    send_error(
        res, {405,
              "method_not_allowed",
              "Method " + req.method + " is not allowed on " + req.path + "; use " + m.allow + ".",
              {}});
    return true;
  }

  // Finds the route, decides who may call it, checks the body's form, and runs it.
  void dispatch(HttpRequest& req, HttpResponse& res, detail::Reply& reply) {
    no_store_if_api(req, res);  // (answers given later keep it)
    Match m = match(req);
    const Route* const found = m.found;
    std::string& param = m.param;
    const Credential* caller = nullptr;
    if (refused(req, m, caller, res)) return;
    std::string tenant = caller ? caller->tenant : std::string();
    if (store_calls && !(found->access & on_front)) {
      // A route whose store calls may wait runs on the store-call threads: the front's thread
      // goes on reading and writing. The answer goes back through the Reply.
      struct Offloaded {
        HttpRequest req;
        HttpResponse res;
        detail::Reply reply;
      };
      auto task =
          std::make_shared<Offloaded>(Offloaded{std::move(req), std::move(res), std::move(reply)});
      boost::asio::post(*store_calls, [this, life = life, task, found, caller,
                                       tenant = std::move(tenant), param = std::move(param)] {
        std::shared_lock<std::shared_mutex> alive(life->mutex);
        if (!life->alive) return;  // the Server is going: nobody is answered
        Call call{task->req, task->res, task->reply, caller, tenant, param};
        run_route(*found, call);
        if (task->reply) task->reply(std::move(task->res));
      });
      return;
    }
    Call call{req, res, reply, caller, std::move(tenant), std::move(param)};
    found->handle(*this, call);
  }

  // Runs a route on a store-call thread, answering what `handle` would answer on its failure.
  void run_route(const Route& route, Call& call) {
    try {
      route.handle(*this, call);
    } catch (const StoreUnavailable&) {
      call.res = HttpResponse{};
      send_store_unavailable(call.res);
    } catch (...) {
      call.res = HttpResponse{};
      send_error(call.res, {500, "internal_error", "The server failed to handle the request.", {}});
    }
    no_store_if_api(call.req, call.res);
  }

  // The job a console route names (its id, and ?tenant=); nullopt, with the 404 sent, when there
  // is none such.
  std::optional<JobRef> console_job(const HttpRequest& req, const std::string& id,
                                    HttpResponse& res) const {
    const auto tenant = console->tenant_param(req);
    if (!tenant || !is_valid_job_id(id)) {
      send_error(res, {404, "not_found", "No job with id '" + id + "'.", {}});
      return std::nullopt;
    }
    return JobRef(id, *tenant);
  }

  // An operator's action, in the log with the key's name (never the key).
  void log_action(const Credential* caller, std::string_view action, const nlohmann::json& what,
                  int status) const {
    nlohmann::json fields = what;
    fields["action"] = action;
    fields["key"] = caller ? caller->name : std::string();
    fields["role"] = !caller                                    ? "none"
                     : caller->is_operator()                    ? "operator"
                     : caller->role == Credential::Role::viewer ? "viewer"
                                                                : "tenant";
    fields["status"] = status;
    service.operations().logger().log(LogLevel::info, "operator_action", fields);
  }

  // POST /v1/console/jobs/{id}/cancel and /redeliver: an operator's act on any tenant's job,
  // logged with the key's name.
  void console_act(Call& c, bool cancelling) {
    const auto job = console_job(c.req, c.param, c.res);
    if (!job) return;
    const std::string& job_tenant = job->tenant;
    if (cancelling) {
      cancel(job_tenant, c.param, c.res);
    } else {
      redeliver(job_tenant, c.param, c.res);
    }
    log_action(c.caller, cancelling ? "cancel" : "redeliver",
               {{"tenant", job_tenant}, {"id", c.param}}, c.res.status);
  }

  // The bytes a JSON body's tree will take, estimated from its text before it is built.
  static std::size_t tree_bytes(const std::string& body) {
    return detail::scan_json_text(body, detail::max_json_depth, json_cost_limit).bytes;
  }

  // The answer to a body refused for max_parsing_bytes (the queue may have room: it says what is
  // full).
  static void refuse_parsing(HttpResponse& res) {
    send_refusal(
        res,
        {{503, "queue_full", "Too many large requests are being read at once; retry later.", {}},
         1});
  }

  std::atomic<bool> stop_asked{false};  // Server::stop() was called: run() returns as asked

  // Answers given later are answered at once when the Server stops (stop_pending).
  void remember(const std::shared_ptr<PendingAnswer>& call) {
    std::lock_guard<std::mutex> lock(pending_mutex);
    if (pending.size() >= 64 && pending.size() >= 2 * live_pending) {
      pending.erase(
          std::remove_if(pending.begin(), pending.end(),
                         [](const std::weak_ptr<PendingAnswer>& p) { return p.expired(); }),
          pending.end());
      live_pending = pending.size();
    }
    pending.push_back(call);
    ++live_pending;
  }

  void stop_pending() {
    stop_asked = true;
    std::vector<std::weak_ptr<PendingAnswer>> all;
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      all.swap(pending);
      live_pending = 0;
    }
    for (auto& weak : all)
      if (auto call = weak.lock()) call->stop();
  }

  // This server's HTTP front, for /metrics: connections open and requests waiting for a job.
  std::string http_metrics() const {
    return "# HELP rebound_http_connections HTTP connections open now.\n"
           "# TYPE rebound_http_connections gauge\n"
           "rebound_http_connections " +
           std::to_string(http.connections()) +
           "\n# HELP rebound_http_waiting Requests waiting for a job now (Prefer: wait).\n"
           "# TYPE rebound_http_waiting gauge\n"
           "rebound_http_waiting " +
           std::to_string(waiting->load()) + "\n";
  }

  // One model as GET /v1/models describes it (DESIGN.md's `M`): its route and generation, and its
  // versions with their states, digests and when they became ready. Counts are for a caller who
  // may read what spans tenants (as GET /v1/stats): with one version in all, the queue's (the
  // store's, shared by a fleet) as /metrics counts them (at most once a second: any API key may
  // read this, and a count of a large backlog costs the database), with several, each version's
  // jobs in this server's memory.
  nlohmann::json model_json(const ModelInfo& m, const Credential* caller,
                            std::optional<bool> alone = std::nullopt) {
    const bool warmed = service.telemetry().model_ready();
    const bool counts = !(multi_tenant && !(caller && caller->reads_everything()));
    // The only version of the only model: the store's counts are its own.
    if (!alone) alone = m.versions.size() == 1 && service.models().list().size() == 1;
    std::optional<QueueStats> stats;
    if (counts && *alone) {
      try {
        stats = service.telemetry().recent_queue_stats();
      } catch (const std::exception&) {
        // A failing store: the model is still described, without its counts (/ping says why).
      }
    }
    nlohmann::json versions = nlohmann::json::array();
    for (const ModelVersionInfo& v : m.versions) {
      // A version the queue started with is `loading` until the queue's warm-up is over.
      const bool ready = v.state == VersionState::ready;
      nlohmann::json version = {{"version", v.version},
                                {"state", ready && !warmed ? "loading" : to_string(v.state)}};
      const std::string digest = v.digest.empty() ? digest_of(m.name, v.version) : v.digest;
      if (!digest.empty()) version["digest"] = digest;
      if (v.loaded_at != std::chrono::system_clock::time_point{}) {
        // A version the queue started with: when its process loaded it (ServerOptions).
        version["loaded_at"] =
            detail::format_rfc3339(v.loaded_at <= created ? model_loaded_at : v.loaded_at);
      }
      if (stats) {
        version["queued"] = stats->queued;
        version["running"] = stats->running;
      } else if (counts && !*alone) {
        version["queued"] = v.queued;
        version["running"] = v.running;
      }
      if (v.memory_bytes > 0) version["memory_bytes"] = v.memory_bytes;
      if (v.error) {
        // The loader's message names the server's files (the repository's path): for the keys
        // that see the server's side (operators, viewers, a server with no keys); a tenant's key
        // is told what happened, not where.
        version["error"] = {
            {"code", v.error->code},
            {"message", !caller || caller->reads_everything()
                            ? v.error->message
                            : "Version " + v.version + " did not load (" + v.error->code +
                                  "): an operator's or a viewer's key sees why here, and the "
                                  "server's log says it."}};
      }
      versions.push_back(std::move(version));
    }
    nlohmann::json split = nlohmann::json::array();
    for (const ModelSplit& sp : m.route.split)
      split.push_back({{"version", sp.version}, {"percent", sp.percent}});
    return {{"name", m.name},
            {"default_version", m.route.default_version},
            {"split", std::move(split)},
            {"generation", m.generation},
            {"versions", std::move(versions)}};
  }

  // A version's digest as computed at start (ServerOptions); a version loaded later has its own
  // (ModelRepository::set_digester).
  std::string digest_of(const std::string& name, const std::string& version) {
    const std::string key = name + "/" + version;
    const auto digest = options.model_digests.find(key);
    if (digest != options.model_digests.end()) return digest->second;
    // (ServerOptions::model_digest: the model of a queue built on one Model, its version "1".)
    if (options.model_digests.empty() && !options.model_digest.empty() && version == "1" &&
        name == service.models().default_model()) {
      return options.model_digest;
    }
    return {};
  }

  void model(const std::string& name, const Credential* caller, HttpResponse& res) {
    const std::optional<ModelInfo> m = service.models().find(name);
    if (!m) {
      return send_error(res, {404,
                              "model_not_found",
                              "No model named '" + detail::truncated_utf8(name, 128) + "'.",
                              {}});
    }
    send_json(res, 200, model_json(*m, caller));
  }

  // `name/version` of a route's path, checked before anything is built from them (nothing
  // outside the repository is read: a name is a model name, a version a positive integer).
  bool model_version_param(const std::string& param, ModelRef& ref, HttpResponse& res) {
    const std::size_t slash = param.find('/');
    ref.name = param.substr(0, slash);
    ref.version = slash == std::string::npos ? std::string() : param.substr(slash + 1);
    if (!is_valid_model_name(ref.name)) {
      send_error(res, {422, "invalid_field",
                       "'" + detail::truncated_utf8(ref.name, 128) +
                           "' is not a model name (1 to 64 of a-z 0-9 . _ -, the first a letter "
                           "or a digit).",
                       "name"});
      return false;
    }
    if (!is_valid_model_version(ref.version)) {
      send_error(res, {422, "invalid_field",
                       "'" + detail::truncated_utf8(ref.version, 128) +
                           "' is not a version (a positive integer, no leading zero).",
                       "version"});
      return false;
    }
    return true;
  }

  // PUT /v1/models/{name}/versions/{version}: loads the version from the repository in the
  // background (the queue's loading thread): 202 while it loads, 200 when it is ready already.
  void load_version(Call& c) {
    ModelRef ref;
    if (!model_version_param(c.param, ref, c.res)) return;
    const nlohmann::json what = {{"model", ref.name}, {"version", ref.version}};
    if (options.model_repository.empty()) {
      send_error(c.res, {409,
                         "no_repository",
                         "This server loads no model versions while it runs: start it with "
                         "--model-repository.",
                         {}});
      return log_action(c.caller, "load_model_version", what, c.res.status);
    }
    const std::filesystem::path dir =
        std::filesystem::path(options.model_repository) / ref.name / ref.version;
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      send_error(c.res,
                 {404,
                  "model_not_found",
                  "The model repository has no directory '" + ref.name + "/" + ref.version + "'.",
                  {}});
      return log_action(c.caller, "load_model_version", what, c.res.status);
    }
    const std::optional<ModelInfo> before = service.models().find(ref.name);
    if (before) {
      for (const ModelVersionInfo& v : before->versions) {
        if (v.version == ref.version && v.state == VersionState::ready) {
          // Loaded here already; with a shared store the fleet is told (it may have unloaded it
          // through another server meanwhile).
          service.models().async_load(ref.name, ref.version,
                                      [](boost::system::error_code, ModelInfo) {});
          send_json(c.res, 200, model_json(*before, c.caller));
          return log_action(c.caller, "load_model_version", what, 200);
        }
      }
    }
    // (Its handler has nothing to do: GET /v1/models tells how the load ends; the log too.)
    service.models().async_load(ref.name, ref.version, [](boost::system::error_code, ModelInfo) {});
    const std::optional<ModelInfo> now = service.models().find(ref.name);
    if (!now) {  // refused at once: the queue is stopping
      send_refusal(c.res, refusal_for(errc::shutting_down));
      return log_action(c.caller, "load_model_version", what, c.res.status);
    }
    // Refused at once (a model being retired, whose versions are draining or unloaded): not
    // loading, nor ready, nor failed already (a load that failed before this looked).
    const bool started =
        std::any_of(now->versions.begin(), now->versions.end(), [&](const ModelVersionInfo& v) {
          return v.version == ref.version &&
                 (v.state == VersionState::loading || v.state == VersionState::ready ||
                  v.state == VersionState::failed);
        });
    if (!started) {
      send_error(c.res, {409,
                         "version_unavailable",
                         "The model '" + ref.name + "' is being retired (DELETE /models/" +
                             ref.name + "): load it once that ends.",
                         {}});
      return log_action(c.caller, "load_model_version", what, 409);
    }
    send_json(c.res, 202, model_json(*now, c.caller));
    log_action(c.caller, "load_model_version", what, 202);
  }

  // DELETE /v1/models/{name}/versions/{version}[?queued=finish|reroute]: the version drains (its
  // jobs not started run on it, or go to the route), then is unloaded.
  void unload_version(Call& c) {
    ModelRef ref;
    if (!model_version_param(c.param, ref, c.res)) return;
    const std::string queued = c.req.param("queued");
    const nlohmann::json what = {
        {"model", ref.name},
        {"version", ref.version},
        {"queued", queued.empty() ? std::string("finish") : detail::truncated_utf8(queued, 64)}};
    const auto done = [&](int status) {
      log_action(c.caller, "unload_model_version", what, status);
    };
    if (!queued.empty() && queued != "finish" && queued != "reroute") {
      send_error(c.res, {422, "invalid_field",
                         "queued=" + detail::truncated_utf8(queued, 64) +
                             " is not one of finish (the jobs not started run on the version) "
                             "and reroute (they go to the model's route).",
                         "queued"});
      return done(422);
    }
    const std::optional<ModelInfo> m = service.models().find(ref.name);
    if (!m) {
      send_error(c.res, {404, "model_not_found", "No model named '" + ref.name + "'.", {}});
      return done(404);
    }
    const ModelVersionInfo* version = nullptr;
    for (const ModelVersionInfo& v : m->versions)
      if (v.version == ref.version) version = &v;
    if (!version) {
      send_error(c.res, {404,
                         "model_not_found",
                         "The model '" + ref.name + "' has no version '" + ref.version + "'.",
                         {}});
      return done(404);
    }
    // 409 when the model's route sends jobs to the version.
    const auto refused_as_routed = [&](const ModelInfo& model) {
      bool routed = model.route.default_version == ref.version;
      for (const ModelSplit& sp : model.route.split)
        routed = routed || sp.version == ref.version;
      if (!routed) return false;
      send_error(c.res, {409,
                         "version_in_route",
                         "The route of '" + ref.name + "' sends jobs to version " + ref.version +
                             ": change the route first (PUT /v1/models/" + ref.name + "/route).",
                         {}});
      done(409);
      return true;
    };
    if (refused_as_routed(*m)) return;
    if (version->state == VersionState::loading) {
      send_error(c.res, {409,
                         "version_unavailable",
                         "Version " + ref.version + " of '" + ref.name +
                             "' is loading: unload it once it is ready or failed.",
                         {}});
      return done(409);
    }
    service.models().async_unload(ref.name, ref.version,
                                  queued == "reroute" ? QueuedJobs::reroute : QueuedJobs::finish,
                                  [](boost::system::error_code, ModelInfo) {});
    const std::optional<ModelInfo> now = service.models().find(ref.name);
    if (!now) {
      send_refusal(c.res, refusal_for(errc::shutting_down));
      return done(503);
    }
    // With a shared store the unload decides on the fleet's route as it stands, which may name
    // the version (set through another server a moment ago): then it is still ready here.
    if (refused_as_routed(*now)) return;
    // A load asked meanwhile (a failed version loaded again since the look above): the unload was
    // refused, as it is for a version loading.
    for (const ModelVersionInfo& v : now->versions) {
      if (v.version == ref.version && v.state == VersionState::loading) {
        send_error(c.res, {409,
                           "version_unavailable",
                           "Version " + ref.version + " of '" + ref.name +
                               "' is loading: unload it once it is ready or failed.",
                           {}});
        return done(409);
      }
    }
    send_json(c.res, 202, model_json(*now, c.caller));
    done(202);
  }

  // PUT /v1/models/{name}/route: {"default_version", "split": [{"version", "percent"}]}, with
  // If-Match: "<generation>" for a change that must not replace another.
  void set_route(Call& c) {
    const std::string& name = c.param;
    const std::string& body = c.req.body();
    nlohmann::json what = {{"model", truncated_utf8(name, 128)},
                           {"body", truncated_utf8(body, 512)}};
    const auto done = [&](int status) { log_action(c.caller, "set_model_route", what, status); };
    // (A name in a message is cut: it comes from the request.)
    const std::string shown = truncated_utf8(name, 128);
    const auto not_found = [&] {
      send_error(c.res, {404, "model_not_found", "No model named '" + shown + "'.", {}});
    };
    // A model that is not served is that, whatever the body and If-Match say (and again below: it
    // may be retired meanwhile).
    if (!service.models().find(name)) {
      not_found();
      return done(404);
    }
    nlohmann::json parsed;
    if (auto error = json_body_error(detail::parse_untrusted_json(body, parsed))) {
      send_error(c.res, *error);
      return done(c.res.status);
    }
    const auto invalid = [&](const std::string& message, const char* field) {
      send_error(c.res, {422, "invalid_field", message, field});
      done(422);
    };
    if (!parsed.is_object()) {
      return invalid(
          "Send {\"default_version\": \"2\", \"split\": [{\"version\": \"3\", "
          "\"percent\": 10}]}.",
          "default_version");
    }
    ModelRoute route;
    const auto def = parsed.find("default_version");
    if (def == parsed.end() || !def->is_string() ||
        !is_valid_model_version(def->get<std::string>())) {
      return invalid("default_version must be a version (a string: a positive integer).",
                     "default_version");
    }
    route.default_version = def->get<std::string>();
    const auto split = parsed.find("split");
    if (split != parsed.end() && !split->is_null()) {
      if (!split->is_array() || split->size() > 100) {
        return invalid("split must be a list of {\"version\", \"percent\"}.", "split");
      }
      for (const auto& part : *split) {
        const auto v = part.is_object() ? part.find("version") : part.end();
        const auto p = part.is_object() ? part.find("percent") : part.end();
        if (v == part.end() || !v->is_string() || !is_valid_model_version(v->get<std::string>()) ||
            p == part.end() || !p->is_number_integer() || p->get<long long>() < 1 ||
            p->get<long long>() > 100 || part.size() != 2) {
          return invalid(
              "Each split is {\"version\": \"3\", \"percent\": 1 to 100}, with no "
              "other field.",
              "split");
        }
        route.split.push_back({v->get<std::string>(), static_cast<int>(p->get<long long>())});
      }
    }
    for (const auto& [key, value] : parsed.items()) {
      if (key != "default_version" && key != "split") {
        return invalid("Unknown field '" + truncated_utf8(key, 64) + "'.", "route");
      }
    }
    std::uint64_t generation = 0;
    if (c.req.has_header("If-Match") &&
        !(c.req.header_count("If-Match") == 1 && c.req.header("If-Match") == "*")) {  // "*": any
      // An entity tag is quoted (RFC 9110 8.8.3): a bare number is not one.
      std::string tag = c.req.header("If-Match");
      const bool quoted = tag.size() >= 2 && tag.front() == '"' && tag.back() == '"';
      if (quoted) tag = tag.substr(1, tag.size() - 2);
      if (!quoted || tag.empty() || tag.size() > 19 ||
          tag.find_first_not_of("0123456789") != std::string::npos ||
          c.req.header_count("If-Match") != 1) {
        send_error(c.res, {412,
                           "route_changed",
                           "If-Match names no generation of this route: send If-Match: "
                           "\"<generation>\" as GET /v1/models/" +
                               shown + " gives it.",
                           {}});
        return done(412);
      }
      generation = std::stoull(tag);
      if (generation == 0) generation = ~std::uint64_t{0};  // (no route has generation 0)
    }
    ModelInfo after;
    const boost::system::error_code ec =
        service.models().set_route(name, std::move(route), generation, &after);
    if (ec == errc::model_not_found) {
      not_found();
    } else if (ec == errc::route_changed) {
      send_error(c.res, {412,
                         "route_changed",
                         "The route of '" + shown + "' is at generation " +
                             std::to_string(after.generation) + ": another change came first.",
                         {}});
    } else if (ec == errc::store_unavailable) {
      send_error(c.res, {503,
                         "store_unavailable",
                         "The store the servers share the route through failed; nothing changed.",
                         {}});
    } else if (ec == errc::version_unavailable) {
      send_error(c.res, {409,
                         "version_unavailable",
                         "Every version a route names must be ready (PUT "
                         "/v1/models/" +
                             shown + "/versions/{version} loads one).",
                         {}});
    } else if (ec) {
      send_error(c.res, {422, "invalid_field",
                         "The split's percentages add up to more than 100, or name a version "
                         "twice (the default version included).",
                         "split"});
    } else {
      c.res.set_header("ETag", "\"" + std::to_string(after.generation) + "\"");
      send_json(c.res, 200, model_json(after, c.caller));
    }
    done(c.res.status);
  }

  // SageMaker's multi-model container contract (ServerOptions::sagemaker_multi_model): the
  // routes answer 404 when it is off.
  bool mme_on(HttpResponse& res) const {
    if (options.sagemaker_multi_model && options.model_urls) return true;
    send_error(res, {404,
                     "not_found",
                     "SageMaker's multi-model routes are off: start the server with "
                     "--sagemaker-multi-model (or SAGEMAKER_MULTI_MODEL=true).",
                     {}});
    return false;
  }

  // Whether the model has a version that serves (ready), as the contract's "loaded".
  std::optional<ModelInfo> mme_loaded(const std::string& name) const {
    std::optional<ModelInfo> m = service.models().find(name);
    if (!m) return std::nullopt;
    for (const ModelVersionInfo& v : m->versions)
      if (v.state == VersionState::ready) return m;
    return std::nullopt;
  }

  nlohmann::json mme_entry(const std::string& name) const {
    return {{"modelName", name}, {"modelUrl", options.model_urls->get(name).value_or("")}};
  }

  // The answer to a model change (SageMaker's load and unload) given once it is done: 504 with
  // `code` and `message` if that takes over 10 minutes, 503 if the server stops first.
  std::shared_ptr<PendingAnswer> model_change_answer(Call& c, const char* code,
                                                     std::string message) {
    auto call = std::make_shared<PendingAnswer>(life, service.get_executor(), std::move(c.res),
                                                std::move(c.reply));
    call->start(
        std::chrono::minutes(10),
        [code, message = std::move(message)](HttpResponse& answer) {
          send_error(answer, {504, code, message, {}});
        },
        [](HttpResponse& answer) { send_refusal(answer, refusal_for(errc::shutting_down)); });
    remember(call);
    return call;
  }

  // POST /models {"model_name", "url"}: loads the directory `url` (inside the root) as version
  // "1" of the model, answering once it is ready: 200, or why not.
  void mme_load(Call& c) {
    if (!mme_on(c.res)) return;
    nlohmann::json parsed;
    if (auto error = json_body_error(detail::parse_untrusted_json(c.req.body(), parsed))) {
      return send_error(c.res, *error);
    }
    const auto name = parsed.is_object() ? parsed.find("model_name") : parsed.end();
    const auto url = parsed.is_object() ? parsed.find("url") : parsed.end();
    if (name == parsed.end() || !name->is_string() ||
        !is_valid_model_name(name->get<std::string>())) {
      return send_error(c.res, {422, "invalid_field",
                                "model_name must be a model name (1 to 64 of a-z 0-9 . _ -, the "
                                "first a letter or a digit).",
                                "model_name"});
    }
    if (url == parsed.end() || !url->is_string() || url->get<std::string>().empty() ||
        url->get<std::string>().size() > 4096) {
      return send_error(c.res, {422, "invalid_field", "url must be the model's directory.", "url"});
    }
    const std::string model = name->get<std::string>();
    const std::string dir = url->get<std::string>();
    const nlohmann::json what = {{"model", model}, {"url", truncated_utf8(dir, 512)}};
    // Nothing outside the root is read: the url must name a place inside it before the file
    // system is asked anything (so that no answer tells what exists elsewhere), and again once
    // links are resolved (the loader checks every file too).
    namespace fs = std::filesystem;
    const auto inside_root = [](const fs::path& p, const fs::path& root) {
      const fs::path rel = p.lexically_relative(root);
      return !root.empty() && !rel.empty() && rel != "." && *rel.begin() != "..";
    };
    const fs::path lexical_root = fs::path(options.model_repository).lexically_normal();
    if (dir[0] != '/' || dir.find('\0') != std::string::npos ||
        !inside_root(fs::path(dir).lexically_normal(), lexical_root)) {
      send_error(c.res, {403, "forbidden", "The url is not inside the model root.", {}});
      return log_action(c.caller, "load_model", what, 403);
    }
    std::error_code ec;
    const fs::path root = fs::canonical(options.model_repository, ec);
    const fs::path real = ec ? fs::path() : fs::canonical(dir, ec);
    if (real.empty() || ec || !fs::is_directory(real, ec)) {
      send_error(c.res, {404, "model_not_found", "No model directory at that url.", {}});
      return log_action(c.caller, "load_model", what, 404);
    }
    if (!inside_root(real, root)) {
      send_error(c.res, {403, "forbidden", "The url is not inside the model root.", {}});
      return log_action(c.caller, "load_model", what, 403);
    }
    // One load of a name at a time: the check and the load's start are one step.
    std::lock_guard<std::mutex> one_at_a_time(mme_mutex);
    if (const auto m = service.models().find(model)) {
      for (const ModelVersionInfo& v : m->versions) {
        if (v.state == VersionState::ready || v.state == VersionState::loading ||
            v.state == VersionState::draining) {
          send_error(c.res, {409,
                             "model_loaded",
                             "The model '" + model + "' is loaded (or loading) already.",
                             {}});
          return log_action(c.caller, "load_model", what, 409);
        }
      }
    }
    options.model_urls->set(model, dir);
    const auto call = model_change_answer(
        c, "load_timeout",
        "The model is still loading after 10 minutes; GET /models/{name} tells when it is ready.");
    log_action(c.caller, "load_model", what, 200);
    service.models().async_load(
        model, "1",
        [life = life, weak = std::weak_ptr<PendingAnswer>(call), model, url = dir,
         urls = options.model_urls](boost::system::error_code e, ModelInfo info) {
          if (e) urls->erase(model, url);  // (unless another load set it since)
          PendingAnswer::when_alive(
              life, weak, [e, info = std::move(info), model, url](PendingAnswer& pending) {
                pending.conclude([&](HttpResponse& answer) {
                  if (!e) {
                    return send_json(answer, 200, {{"modelName", model}, {"modelUrl", url}});
                  }
                  if (e == errc::load_failed) {
                    ErrorInfo why{"load_failed", "The model did not load."};
                    for (const ModelVersionInfo& v : info.versions)
                      if (v.version == "1" && v.error) why = *v.error;
                    // SageMaker's contract: 507 when the model cannot be held.
                    return send_error(
                        answer,
                        {why.code == "insufficient_memory" ? 507 : 500, why.code, why.message, {}});
                  }
                  send_refusal(answer, refusal_for(e));
                });
              });
        });
  }

  // GET /models[?max_results=N&next_page_token=T]: the models loaded, by name, a page at a time.
  void mme_list(Call& c) {
    if (!mme_on(c.res)) return;
    std::size_t max_results = 100;
    const std::string wanted = c.req.param("max_results");
    if (!wanted.empty()) {
      if (wanted.size() > 4 || wanted.find_first_not_of("0123456789") != std::string::npos ||
          std::stoul(wanted) == 0 || std::stoul(wanted) > 1000) {
        return send_error(c.res,
                          {422, "invalid_field", "max_results is 1 to 1000.", "max_results"});
      }
      max_results = std::stoul(wanted);
    }
    const std::string after = c.req.param("next_page_token");  // the last name of a page
    nlohmann::json models = nlohmann::json::array();
    std::string last;
    bool more = false;
    for (const ModelInfo& m : service.models().list()) {
      if (!after.empty() && m.name <= after) continue;
      if (!std::any_of(m.versions.begin(), m.versions.end(),
                       [](const ModelVersionInfo& v) { return v.state == VersionState::ready; })) {
        continue;
      }
      if (models.size() == max_results) {
        more = true;
        break;
      }
      models.push_back(mme_entry(m.name));
      last = m.name;
    }
    nlohmann::json body = {{"models", std::move(models)}};
    if (more) body["nextPageToken"] = last;
    send_json(c.res, 200, body);
  }

  // GET /models/{name}: a model loaded.
  void mme_get(Call& c) {
    if (!mme_on(c.res)) return;
    if (!mme_loaded(c.param)) {
      return send_error(c.res, {404,
                                "model_not_found",
                                "No model '" + truncated_utf8(c.param, 128) + "' is loaded.",
                                {}});
    }
    send_json(c.res, 200, mme_entry(c.param));
  }

  // DELETE /models/{name}: the model drains (its queued invocations and jobs finish), then is
  // unloaded; answered then.
  void mme_unload(Call& c) {
    if (!mme_on(c.res)) return;
    const std::string name = c.param;
    const nlohmann::json what = {{"model", truncated_utf8(name, 128)}};
    if (!mme_loaded(name)) {
      send_error(
          c.res,
          {404, "model_not_found", "No model '" + truncated_utf8(name, 128) + "' is loaded.", {}});
      return log_action(c.caller, "unload_model", what, 404);
    }
    const auto call = model_change_answer(
        c, "unload_timeout",
        "The model's jobs still run after 10 minutes; it unloads once they end.");
    log_action(c.caller, "unload_model", what, 200);
    service.models().async_unload_model(
        name, [life = life, weak = std::weak_ptr<PendingAnswer>(call), name,
               urls = options.model_urls](boost::system::error_code e, ModelInfo) {
          if (!e) urls->erase(name, urls->get(name).value_or(""));
          PendingAnswer::when_alive(life, weak, [e](PendingAnswer& pending) {
            pending.conclude([&](HttpResponse& answer) {
              if (!e) return send_json(answer, 200, nlohmann::json::object());
              if (e == errc::model_not_found) {
                return send_error(answer, {404, "model_not_found", "No such model is loaded.", {}});
              }
              if (e == errc::version_unavailable) {
                return send_error(answer, {409,
                                           "model_loading",
                                           "The model is loading: unload it once "
                                           "it is loaded.",
                                           {}});
              }
              send_refusal(answer, refusal_for(e));
            });
          });
        });
  }

  // GET /v1/stats: the whole queue's numbers, as the store counts them (the same on every
  // server of a shared store), and this server's own. A failing store throws: 503.

  void stats(HttpResponse& res) {
    const std::optional<QueueStats> s = service.telemetry().queue_stats();
    if (!s) {
      return send_error(
          res, {404, "not_found", "This server's job store does not count its queue.", {}});
    }
    nlohmann::json body = detail::queue_stats_json(*s);
    body["server"] = {{"in_flight", service.telemetry().in_flight()},
                      {"queue_depth", service.telemetry().queue_depth()},
                      {"work_bytes", service.telemetry().work_bytes()}};
    send_json(res, 200, body);
  }

  // At most max_listed_endpoints origins, those that need an operator's eye first (paused, a
  // circuit not closed, callbacks in flight, waiting or deferred), then the idle ones.
  static constexpr std::size_t max_listed_endpoints = 1024;

  void list_endpoints(HttpResponse& res) {
    std::vector<EndpointStatus> all = service.operations().callback_endpoints();
    const std::size_t total = all.size();
    if (total > max_listed_endpoints) {
      const auto busy = [](const EndpointStatus& e) {
        return e.paused || e.state != CircuitState::closed || e.in_flight > 0 || e.waiting > 0 ||
               e.deferred > 0;
      };
      std::stable_partition(all.begin(), all.end(), busy);
      all.resize(max_listed_endpoints);
      std::stable_sort(all.begin(), all.end(),
                       [](const EndpointStatus& a, const EndpointStatus& b) {
                         return std::tie(a.origin, a.tenant) < std::tie(b.origin, b.tenant);
                       });
    }
    nlohmann::json endpoints = nlohmann::json::array();
    for (const EndpointStatus& e : all) {
      endpoints.push_back({{"origin", e.origin},
                           {"state", to_string(e.state)},
                           {"consecutive_failures", e.consecutive_failures},
                           {"in_flight", e.in_flight},
                           {"waiting", e.waiting},
                           {"paused", e.paused},
                           {"deferred", e.deferred},
                           {"delivered", e.delivered},
                           {"failed", e.failed}});
      if (!e.tenant.empty()) endpoints.back()["tenant"] = e.tenant;
    }
    nlohmann::json body = {{"endpoints", std::move(endpoints)}};
    if (total > max_listed_endpoints) body["total"] = total;  // the list is cut
    send_json(res, 200, body);
  }

  // POST /v1/callback-endpoints/pause and /resume, with {"origin": "https://hooks.example.com"}.
  // Logged with the key's name when an operator or a viewer key calls it, whatever the answer.
  void pause_or_resume(Call& c, bool pause) {
    const char* action = pause ? "pause_origin" : "resume_origin";
    const bool logged = c.caller && c.caller->reads_everything();
    const std::string& body = c.req.body();
    try {
      set_paused(body, pause, c.res);
    } catch (...) {
      // A failing store answers 503 from the exception handler: the attempt is logged too.
      if (logged) log_action(c.caller, action, {{"body", truncated_utf8(body, 512)}}, 503);
      throw;
    }
    if (logged) log_action(c.caller, action, {{"body", truncated_utf8(body, 512)}}, c.res.status);
  }

  void set_paused(const std::string& body, bool pause, HttpResponse& res) {
    nlohmann::json parsed;
    if (auto error = json_body_error(detail::parse_untrusted_json(body, parsed))) {
      return send_error(res, *error);
    }
    const auto origin = parsed.is_object() ? parsed.find("origin") : parsed.end();
    if (!parsed.is_object() || origin == parsed.end() || !origin->is_string() ||
        OriginGate::origin_of(origin->get<std::string>()).empty()) {
      return send_error(res, {422, "invalid_origin",
                              "Send {\"origin\": \"https://host[:port]\"}: an http(s) origin or "
                              "callback URL.",
                              "origin"});
    }
    if (!service.operations().delivers_callbacks()) {
      return send_error(res, {409, "no_transport", "This server delivers no callbacks.", {}});
    }
    const std::string value = origin->get<std::string>();
    std::string key = OriginGate::origin_of(value);
    if (pause) {
      try {
        key = service.operations().pause_origin(value);
      } catch (const StoreUnavailable&) {
        throw;
      } catch (const Error& e) {  // what is checked above aside: the store's cap on pauses
        return send_error(res, {409, "too_many_paused", e.what(), "origin"});
      }
    } else {
      service.operations().resume_origin(value);
    }
    send_json(res, 200, {{"origin", key}, {"paused", pause}});
  }

  void ping(HttpResponse& res) {
    if (service.ready()) {
      res.status = 200;
      res.set_content("", "text/plain");
    } else if (auto why = service.telemetry().store_failure()) {
      send_error(res, {503, "store_unavailable", "The job store is failing: " + *why, {}});
    } else {
      send_error(res, {503, "not_ready", "The model is not ready or the server is stopping.", {}});
    }
  }

  // `reserved` (the tree's share of max_parsing_bytes) ends once the queue has the job: waits
  // (Prefer: wait) do not hold it.
  void submit(Call& c) {
    const HttpRequest& req = c.req;
    HttpResponse& res = c.res;
    ParsingReservation reserved(parsing_bytes, tree_bytes(req.body()), options.max_parsing_bytes);
    if (!reserved) return refuse_parsing(res);
    const std::string& body = req.body();
    const std::string& tenant = c.tenant;
    detail::Reply& reply = c.reply;
    SubmissionParse parsed = parse_submission(body, service.operations().callback_guard());
    if (parsed.error) return send_error(res, *parsed.error);
    Job& job = *parsed.job;
    const std::string id = job.id;
    job.tenant = tenant;  // the tenant's own: nobody else can name it
    // W3C Trace Context: kept with the job for its callbacks and log lines; an invalid header is
    // ignored, as the specification asks.
    const std::string traceparent = req.header("traceparent");
    if (detail::is_valid_traceparent(traceparent)) job.traceparent = traceparent;
    const JobRef key(id, tenant);
    // Answered once the store holds the job: at once with the memory store, else on the queue's
    // io thread (SQLite after the group commit, PostgreSQL after its commit, Redis once Redis has
    // it), or on its pump (a refusal for room, looked up in the store); this thread takes the
    // next request meanwhile.
    struct Answer {
      HttpResponse res;
      detail::Reply reply;
    };
    auto later = std::make_shared<Answer>(Answer{std::move(res), std::move(reply)});
    const std::optional<int> wait = preferred_wait(req);
    auto answer = [this, life = life, id, key, wait, later](const Submitted& submitted) {
      std::shared_lock<std::shared_mutex> alive(life->mutex);
      if (!life->alive) return;  // the Server is gone: nobody is answered
      try {
        answer_submission(submitted, id, key, wait, later->res, later->reply);
      } catch (...) {
        later->res = HttpResponse{};
        send_error(later->res,
                   {500, "internal_error", "The server failed to handle the request.", {}});
      }
      if (later->reply) later->reply(std::move(later->res));
    };
    // (A Prefer: wait starts async_wait there, which waits for no store: a store whose reads
    // wait is read on the queue's pump.)
    detail::FrontDoor::submit(service, std::move(job), answer);
    reserved.release();
  }

  // The answer to a submission the queue has answered.
  void answer_submission(const Submitted& submitted, const std::string& id, const JobRef& key,
                         std::optional<int> wait, HttpResponse& res, detail::Reply& reply) {
    if (submitted.error) return send_refusal(res, refusal_for(submitted.error, id, submitted));
    res.set_header("Location", "/v1/inferences/" + id);
    // Prefer: wait=N: the final status at once when it comes within N seconds. The job is
    // accepted whatever happens while waiting: a store failing then still answers 202, and so
    // does a request beyond max_waiters (without Preference-Applied).
    if (wait) {
      const bool waiting = await_final(
          key, *wait, res, reply,
          [id](HttpResponse& answer, const std::optional<JobRecord>& record) {
            if (record && is_final(record->status))
              return send_json(answer, 200, to_status_json(*record));
            send_json(answer, 202, accepted_json(id));
          },
          [id](HttpResponse& answer) { send_json(answer, 202, accepted_json(id)); },
          /*reads_store=*/false);
      if (waiting) return;
    }
    send_json(res, 202, accepted_json(id));
  }

  // POST /v1/inferences:batch: many submissions in one request and one write to the store
  // (JobQueue::submit_many). 200 with one result per job, in order: what the job's own
  // POST /v1/inferences would have answered (its status, and its body). Prefer: wait is not
  // honoured here; a traceparent header goes with every job.
  void submit_batch(Call& c) {
    const HttpRequest& req = c.req;
    HttpResponse& res = c.res;
    const std::string& body = req.body();
    const std::string& tenant = c.tenant;
    // A batch holds its HTTP thread for many jobs' store writes: at most a quarter of the
    // threads take batches at once, so that single requests, polls and /ping always have some.
    const Place place(
        batching, std::max<std::size_t>(
                      1, (store_calls ? options.store_call_threads : options.http_threads) / 4));
    if (!place) {
      res.set_header("Retry-After", "1");
      return send_error(
          res, {503, "queue_full", "Too many batches are being taken at once; retry later.", {}});
    }
    ParsingReservation reserved(parsing_bytes, tree_bytes(body), options.max_parsing_bytes);
    if (!reserved) return refuse_parsing(res);
    detail::BatchSubmissionParse parsed =
        detail::parse_batch_submission(body, service.operations().callback_guard());
    if (parsed.error) return send_error(res, *parsed.error);
    const std::string traceparent = req.header("traceparent");
    const bool traced = detail::is_valid_traceparent(traceparent);
    std::vector<Job> jobs;
    std::vector<std::string> ids;  // as the caller gave them
    jobs.reserve(parsed.jobs.size());
    ids.reserve(parsed.jobs.size());
    for (SubmissionParse& item : parsed.jobs) {
      if (!item.job) continue;
      Job& job = *item.job;
      ids.push_back(job.id);
      job.tenant = tenant;  // the tenant's own, as for one submission
      if (traced) job.traceparent = traceparent;
      jobs.push_back(std::move(job));
    }
    const std::vector<Submitted> statuses =
        jobs.empty() ? std::vector<Submitted>{}
                     : detail::FrontDoor::submit_many(service, std::move(jobs));  // parsed: checked
    reserved.release();
    nlohmann::json results = nlohmann::json::array();
    std::size_t accepted = 0;
    int retry_after = 0;  // the longest a refused job asks for
    std::size_t next = 0;
    for (const SubmissionParse& item : parsed.jobs) {
      if (!item.job) {
        nlohmann::json result = item.error->to_json();
        result["status"] = item.error->status;
        if (!item.id.empty()) result["id"] = item.id;
        results.push_back(std::move(result));
        continue;
      }
      const std::size_t k = next++;
      const std::string& id = ids[k];
      const Submitted& status = statuses[k];
      if (!status.error) {
        ++accepted;
        nlohmann::json result = accepted_json(id);
        result["status"] = 202;
        results.push_back(std::move(result));
        continue;
      }
      const RefusalAnswer refusal = refusal_for(status.error, id, status);
      retry_after = std::max(retry_after, refusal.retry_after);
      nlohmann::json result = refusal.error.to_json();
      result["status"] = refusal.error.status;
      result["id"] = id;
      results.push_back(std::move(result));
    }
    if (retry_after > 0) res.set_header("Retry-After", std::to_string(retry_after));
    send_json(res, 200,
              {{"accepted", accepted},
               {"refused", parsed.jobs.size() - accepted},
               {"results", std::move(results)}});
  }

  // SageMaker's synchronous inference: the body is the model input, the answer its output.
  // `target`: the model a multi-model route names in its path (else the header's, else the
  // default).
  void invoke(Call& c, const std::string* target = nullptr) {
    const HttpRequest& req = c.req;
    HttpResponse& res = c.res;
    // (SageMaker's headers are judged with the head: ambiguous_invocation.)
    const std::string& body = req.body();
    ParsingReservation reserved(parsing_bytes, tree_bytes(body), options.max_parsing_bytes);
    if (!reserved) return refuse_parsing(res);
    detail::Reply& reply = c.reply;
    const std::string attributes = req.header("X-Amzn-SageMaker-Custom-Attributes");
    if (!attributes.empty()) res.set_header("X-Amzn-SageMaker-Custom-Attributes", attributes);
    nlohmann::json input;
    if (auto error = json_body_error(detail::parse_untrusted_json(body, input, json_cost_limit,
                                                                  /*limit_amplification=*/true))) {
      return send_error(res, *error);
    }
    // The version that answers: the one its route picks now, pinned for the queue.
    ModelRef chosen{target ? *target : req.header("X-Amzn-SageMaker-Target-Model"), {}};
    if (const Submitted refused = detail::FrontDoor::choose_model(service, chosen, c.tenant);
        refused.error) {
      // (SageMaker's multi-model contract: a model not loaded, however it stands, is 404: its
      // front end loads it then.)
      if (refused.error == errc::model_not_found ||
          (options.sagemaker_multi_model && refused.error == errc::version_unavailable)) {
        return send_error(res,
                          {404,
                           "model_not_found",
                           "No model named '" + detail::truncated_utf8(chosen.name, 128) + "'.",
                           {}});
      }
      return send_error(res, {409, refused.reason.code, refused.reason.message, {}});
    }
    std::string answered_by = chosen.name + "/" + chosen.version;
    // No thread waits: the model's answer against a timer, whichever comes first.
    auto call = std::make_shared<PendingAnswer>(life, service.get_executor(), std::move(res),
                                                std::move(reply));
    call->start(
        options.invocation_timeout,
        [](HttpResponse& answer) {
          send_error(answer, {504,
                              "inference_timeout",
                              "The model did not answer within the invocation timeout.",
                              {}});
        },
        [](HttpResponse& answer) { send_refusal(answer, refusal_for(errc::shutting_down)); });
    remember(call);
    // The result handler runs on the worker that ran the model and hands the answer straight to
    // the connection's strand (JobQueue::async_invoke would complete on the queue's io thread
    // first: one hand-over more, about 70 us at one connection; docs/benchmarks.md).
    const Submitted status = detail::FrontDoor::invoke(
        service, std::move(input),
        // Who answered, as a job's body says it ("model": {"name", "version"}): on the model's
        // own answers (its output or its failure), not on the queue's refusals or a timeout.
        [life = life, weak = std::weak_ptr<PendingAnswer>(call),
         answered_by = std::move(answered_by)](boost::system::error_code ec,
                                               const Prediction& prediction) {
          PendingAnswer::when_alive(
              life, weak, [ec, prediction, answered_by](PendingAnswer& pending) {
                pending.conclude([&](HttpResponse& answer) {
                  // The queue's refusal (taken off the queue at shutdown) is told apart from a
                  // model that fails with whatever code it likes.
                  if (ec) return send_refusal(answer, refusal_for(ec));
                  answer.set_header("Rebound-Model", answered_by);
                  if (prediction.ok()) return send_json(answer, 200, prediction.output());
                  const ErrorInfo& error = prediction.error();
                  const int http_status = error.code == "invalid_input"       ? 422
                                          : error.code == "inference_timeout" ? 504
                                                                              : 500;
                  send_error(answer, {http_status, error.code, error.message, {}});
                });
              });
        },
        c.tenant, std::move(chosen));
    reserved.release();  // the queue counts the input from here
    if (!status.error) return;
    boost::asio::post(call->strand, [call, status] {
      call->conclude([&](HttpResponse& answer) {
        if (status.error == errc::invalid_input) {
          return send_error(answer,
                            {422, status.reason.code, "The input " + status.reason.message, {}});
        }
        send_refusal(answer, refusal_for(status.error));
      });
    });
  }

  // The credential whose key the request carries; null for none, or when no key is configured.
  const Credential* authenticate(const HttpRequest& req) const {
    if (credentials.empty()) return nullptr;
    // The scheme is case-insensitive (RFC 9110 11.1); one or more spaces precede the key.
    const std::string header = req.header("Authorization");
    if (!detail::starts_with_ignoring_case(header, "Bearer ")) return nullptr;
    std::string_view given = std::string_view(header).substr(std::string_view("Bearer").size());
    given.remove_prefix(std::min(given.find_first_not_of(' '), given.size()));
    const Credential* match = nullptr;
    for (const auto& c : credentials) {
      // Constant time for a given length, so a wrong key reveals nothing but its length.
      const bool same = c.key.size() == given.size() &&
                        CRYPTO_memcmp(c.key.data(), given.data(), c.key.size()) == 0;
      if (same) match = &c;
    }
    return match;
  }

  // Whether the request may go on to its route, with `caller` set; else the 401 or 403 is sent.
  // Whether `caller` may call a route of `access`; else the 401, 403 or 404 is sent.
  bool allowed(unsigned access, const Credential* caller, HttpResponse& res) const {
    if ((access & (console_page | console_json)) && !console) {
      send_error(res, {404,
                       "not_found",
                       "The operator console is off: start the server with --operator-key or "
                       "--viewer-key.",
                       {}});
      return false;
    }
    // Public keys are public: a receiver fetches them without an API key. The console's page is
    // static; what it shows comes from routes that need a key.
    if (!credentials.empty() && !(access & (open | console_page)) && !caller) {
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, {401,
                       "unauthorized",
                       "This server requires an API key: Authorization: Bearer <key>.",
                       {}});
      return false;
    }
    // A viewer never acts: not on receivers, not on jobs (its own tenant's included, which with
    // one tenant are everyone's); it may submit and poll as its tenant. Nor does it get the
    // signing secret: with it, it could sign callbacks as rebound does.
    if ((access & acts) && caller && caller->role == Credential::Role::viewer) {
      send_error(res, {403, "forbidden", "A viewer key reads; acting needs an operator key.", {}});
      return false;
    }
    if ((access & loads_models) && !credentials.empty() && !(caller && caller->is_operator())) {
      send_error(res,
                 {403, "forbidden", "Loading and unloading models needs an operator key.", {}});
      return false;
    }
    if ((access & operates) && !(caller && caller->is_operator())) {
      send_error(
          res,
          {403, "forbidden", "Changing the models needs an operator key (--operator-key).", {}});
      return false;
    }
    if ((access & console_json) && !caller->reads_everything()) {
      send_error(res, {403, "forbidden", "The console needs an operator or a viewer key.", {}});
      return false;
    }
    // What spans tenants (their receivers, the queue's numbers, pausing a receiver) is for
    // operators and viewers when there are several.
    if ((access & spans) && multi_tenant && !caller->reads_everything()) {
      send_error(res,
                 {403,
                  "forbidden",
                  "This route spans every tenant: it needs an operator key (a viewer key to read).",
                  {}});
      return false;
    }
    return true;
  }

  // The public keys that verify the caller's callbacks (its tenant's), or those of ?tenant=NAME
  // for a receiver without an API key. Every well-formed name is answered alike, known or not
  // (the keys a name would have: derived, never cached), so the route tells nobody which
  // tenants the server has.
  void webhook_keys(const HttpRequest& req, const Credential* caller, HttpResponse& res) {
    std::string tenant = caller ? caller->tenant : std::string();
    if (multi_tenant && !caller) {
      tenant = req.param("tenant");
      if (!is_valid_tenant_name(tenant)) {
        return send_error(res, {422, "invalid_field",
                                "This server has several tenants: send your API key, or name "
                                "your tenant (?tenant=NAME).",
                                "tenant"});
      }
    }
    send_json(res, 200, {{"keys", service.operations().webhook_public_keys(tenant)}});
  }

  // The shared secret a tenant's receivers verify its callbacks with.
  void webhook_secret(const std::string& tenant, HttpResponse& res) {
    if (credentials.empty()) {
      // Without keys anyone could ask, and forge callbacks with what they got.
      return send_error(res, {403,
                              "forbidden",
                              "The webhook secret is handed only to API keys; this server has "
                              "none (--api-key).",
                              {}});
    }
    for (const auto& key : service.operations().webhook_signing_keys(tenant)) {
      if (key.rfind("whsec_", 0) == 0) return send_json(res, 200, {{"secret", key}});
    }
    send_error(res, {404,
                     "no_signing_secret",
                     "Callbacks are not signed with a shared secret (--signing-secret); see "
                     "GET /v1/webhook-keys for Ed25519 keys.",
                     {}});
  }

  void redeliver(const std::string& tenant, const std::string& id, HttpResponse& res) {
    const boost::system::error_code ec =
        is_valid_job_id(id) ? service.redeliver({id, tenant}) : errc::not_found;
    if (!ec) {
      return send_json(
          res, 202,
          {{"message", "Redelivering"}, {"id", id}, {"status_url", "/v1/inferences/" + id}});
    }
    if (ec == errc::no_transport) {  // a JobQueue built without one, behind this Server
      return send_error(res, {409,
                              "no_transport",
                              "This server cannot deliver callbacks; another server on the "
                              "same store can redeliver it.",
                              {}});
    }
    send_refusal(res, refusal_for(ec, id));
  }

  void cancel(const std::string& tenant, const std::string& id, HttpResponse& res) {
    const JobRef key(id, tenant);
    if (const auto ec = is_valid_job_id(id) ? service.cancel(key) : errc::not_found)
      return send_refusal(res, refusal_for(ec, id));
    const std::optional<JobRecord> record = service.find(key);
    if (!record) return send_error(res, {404, "not_found", "No job with id '" + id + "'.", {}});
    send_json(res, 200, to_status_json(*record));
  }

  void list_failed(const HttpRequest& req, const std::string& tenant, HttpResponse& res) {
    const std::string state = req.param("callback_state");
    if (state != "failed") {
      return send_error(res, {422, "invalid_field",
                              "List jobs with callback_state=failed (the only listing offered).",
                              "callback_state"});
    }
    std::size_t limit = 100;
    if (req.has_param("limit")) {
      const auto given = detail::parse_list_limit(req.param("limit"), 1000);
      if (!given) {
        return send_error(res, {422, "invalid_field", "limit must be 1 to 1000.", "limit"});
      }
      limit = *given;
    }
    std::optional<ListCursor> after;
    if (req.has_param("cursor")) {
      // Sealed for the caller's tenant: a cursor altered, forged or handed to another tenant
      // does not open.
      if (const auto plain = cursor_seal.open(req.param("cursor"), "failed-callbacks\n" + tenant))
        after = detail::parse_list_cursor_text(*plain);
      if (!after) {
        return send_error(
            res, {400, "invalid_cursor",
                  "cursor must be a next_cursor this listing gave you, as given.", "cursor"});
      }
    }
    JobPage page = service.operations().failed_callbacks_page(tenant, after, limit);
    // At most max_list_answer_bytes of entries: the page ends early, its cursor at the last one.
    std::string jobs = "[";
    std::size_t shown = 0;
    for (const JobRecord& record : page.jobs) {
      const std::string entry = dump_json(to_list_entry_json(record));
      if (shown > 0 && jobs.size() + entry.size() + 2 > max_list_answer_bytes) {
        const JobRecord& last = page.jobs[shown - 1];
        page.next = ListCursor{last.job.created_at, key_of(last.job)};
        break;
      }
      if (shown++ > 0) jobs += ',';
      jobs += entry;
    }
    jobs += ']';
    std::string next = "null";
    if (page.next) {
      const std::string sealed = cursor_seal.seal(
          detail::list_cursor_text(*page.next, page.next->id), "failed-callbacks\n" + tenant);
      if (sealed.empty()) throw Error("the listing's cursor could not be sealed");
      next = dump_json(sealed);
    }
    send_json_text(res, 200, "{\"jobs\":" + jobs + ",\"next_cursor\":" + next + "}");
  }

  // Prefer: wait=N. Waits up to `seconds` for the job `key` to be final without holding a thread
  // (the queue's async_wait against a timer, whichever comes first), then builds the answer with
  // `answer` (given the final record, or nullopt when the time ran out or the queue would not
  // wait) and sends it through `reply`, with Preference-Applied. At most max_waiters requests
  // wait at once: false when this one would be past it, and `res` and `reply` are left to the
  // caller. A store that fails meanwhile answers what `store_failed` sets. `reads_store`: the
  // answer without the final record reads the store (a poll's), and is then built on a store-call
  // thread when there are some, not on the connection's.
  using Answer = std::function<void(HttpResponse&, const std::optional<JobRecord>&)>;
  bool await_final(const JobRef& key, int seconds, HttpResponse& res, detail::Reply& reply,
                   Answer answer, std::function<void(HttpResponse&)> store_failed,
                   bool reads_store) {
    Place slot(waiting, options.max_waiters);
    if (!slot) return false;
    res.set_header("Preference-Applied", "wait=" + std::to_string(seconds));
    auto call = std::make_shared<PendingAnswer>(life, service.get_executor(), std::move(res),
                                                std::move(reply), std::move(slot));
    if (reads_store && store_calls) call->build_on = store_calls->get_executor();
    // The answer to a final record, or (nullopt) to none within the time.
    auto build = [answer = std::move(answer),
                  store_failed = std::move(store_failed)](const std::optional<JobRecord>& record) {
      return [&answer, &store_failed, record](HttpResponse& out) {
        try {
          answer(out, record);
        } catch (const StoreUnavailable&) {
          out.body.clear();
          store_failed(out);
        }
      };
    };
    auto shared_build = std::make_shared<decltype(build)>(std::move(build));
    const auto now = [shared_build](HttpResponse& out) { (*shared_build)(std::nullopt)(out); };
    call->start(std::chrono::seconds(seconds), now, now);  // stopping: the state as it is then
    remember(call);
    // (The queue completes on its io thread; the answer is decided on the connection's strand.)
    service.async_wait(key, [life = life, weak = std::weak_ptr<PendingAnswer>(call), shared_build](
                                boost::system::error_code ec, JobRecord record) {
      PendingAnswer::when_alive(
          life, weak, [shared_build, ec, record = std::move(record)](PendingAnswer& pending) {
            // Not final: unknown, or the queue would not wait.
            if (ec) {
              return pending.conclude_after(pending.build_on, [shared_build](HttpResponse& out) {
                (*shared_build)(std::nullopt)(out);
              });
            }
            pending.conclude((*shared_build)(record));
          });
    });
    return true;
  }

  void poll(const HttpRequest& req, const std::string& tenant, const std::string& id,
            HttpResponse& res, detail::Reply& reply) {
    if (!is_valid_job_id(id)) {
      return send_error(res, {404, "not_found", "No job with id '" + id + "'.", {}});
    }
    const JobRef key(id, tenant);
    Answer answer = [this, key, id](HttpResponse& out, std::optional<JobRecord> record) {
      if (!record) record = service.find(key);
      if (!record) return send_error(out, {404, "not_found", "No job with id '" + id + "'.", {}});
      std::optional<std::size_t> position;
      // With several tenants the store's count would tell one tenant of the others' queue, and
      // turns make it wrong anyway: left out.
      if (record->status == JobStatus::queued && !multi_tenant)
        position = service.operations().queue_position(key);
      send_json(out, 200, to_status_json(*record, position));
    };
    if (const auto wait = preferred_wait(req)) {
      if (await_final(
              key, *wait, res, reply, answer,
              [](HttpResponse& out) { send_store_unavailable(out); }, /*reads_store=*/true)) {
        return;
      }
      return send_refusal(res, refusal_for(errc::too_many_waiters));
    }
    answer(res, std::nullopt);
  }

  JobQueue& service;
  ServerOptions options;
  // When the model was loaded, as GET /v1/models says (ServerOptions::model_loaded_at).
  const std::chrono::system_clock::time_point created = std::chrono::system_clock::now();
  const std::chrono::system_clock::time_point model_loaded_at =
      options.model_loaded_at.value_or(created);
  std::unique_ptr<detail::Console> console;  // null: no operator or viewer key, no console
  std::mutex mme_mutex;  // POST /models: a name's check and its load's start, one at a time
  std::atomic<std::size_t> parsing_bytes{0};  // held by ParsingReservations
  const std::vector<Credential> credentials;
  const bool multi_tenant;  // two or more names: each key's jobs are its own
  // Seals the listing's cursors, with a key derived from the webhook signing keys (random, high
  // entropy, and the same on every server of a fleet, so each opens the others' cursors; never
  // the API keys, which a cursor would let a tenant test guesses of offline). Without signing
  // keys: a random key of this server's. (With one tenant its API keys may read the shared
  // secret, and seal cursors: harmless, as the store query names the caller's tenant anyway.)
  const detail::CursorSeal cursor_seal{
      [this] {
        std::vector<std::string> keys = service.operations().webhook_signing_keys("");
        std::sort(keys.begin(), keys.end());
        std::string secret;
        for (const auto& k : keys)
          secret += k + "\n";
        return secret;
      }(),
      // A cursor's text at its longest: milliseconds, '_', the hex of a tenant's job key.
      13 + 1 + 2 * (max_tenant_name_length + 1 + detail::max_job_id_length)};
  // Requests waiting for a job now (Prefer: wait), and in submit_batch now.
  Place::Count waiting = std::make_shared<std::atomic<std::size_t>>(0);
  Place::Count batching = std::make_shared<std::atomic<std::size_t>>(0);
  std::shared_ptr<ServerLife> life = std::make_shared<ServerLife>();
  std::mutex pending_mutex;                           // guards the two below
  std::vector<std::weak_ptr<PendingAnswer>> pending;  // answers to give later, some gone
  std::size_t live_pending = 0;  // pending's size after its last pruning, plus those added
  detail::HttpFront http;        // its threads call into the members above
  // The store-call threads (store_call_threads; null: none), destroyed first: what they still
  // run finishes, what is queued is dropped (the Server is gone by then).
  std::unique_ptr<boost::asio::thread_pool> store_calls =
      options.store_call_threads > 0
          ? std::make_unique<boost::asio::thread_pool>(options.store_call_threads)
          : nullptr;
};

Server::Server(JobQueue& service, ServerOptions options) {
  if (options.http_threads == 0) throw Error("Server: http_threads must be at least 1");
  if (options.port < 0 || options.port > 65535) throw Error("Server: port must be 0..65535");
  auto credentials = parse_credentials(options);
  impl_ = std::make_unique<Impl>(service, std::move(options), std::move(credentials));
}

Server::~Server() {
  stop();
  // Answers still to come (waits the queue completes later) find the Server gone.
  std::unique_lock<std::shared_mutex> lock(impl_->life->mutex);
  impl_->life->alive = false;
}

int Server::bind() {
  return impl_->http.bind(impl_->options.host, impl_->options.port);
}

void Server::run() {
  if (impl_->http.port() == 0) bind();
  impl_->http.run();
}

void Server::stop() {
  if (!impl_) return;
  impl_->stop_pending();  // waits and invocations are answered now, and written before it ends
  impl_->http.stop();
}

int Server::run_until_signal() {
  if (impl_->http.port() == 0) bind();
  // The signals are heard through Asio's handler (whichever thread receives them) on a loop of
  // this thread; serving goes on on another thread, and the drain on a third.
  boost::asio::io_context loop(1);
  boost::asio::signal_set signals(loop, SIGINT, SIGTERM);
  bool signalled = false, forced = false, drained = false;
  std::thread drainer;
  std::thread serving([&] {
    run();
    // Neither a signal nor stop() ended it: the front lost its listening socket's loop. Said
    // loudly, since the process is about to end with status 0.
    if (!impl_->stop_asked) {
      impl_->service.operations().logger().log(
          LogLevel::error, "http_front_ended",
          {{"message", "the HTTP front stopped serving without a signal or stop()"}});
    }
    // Stopped by `stop()` without a signal: nothing to wait for any more.
    boost::asio::post(loop, [&] {
      if (!signalled) signals.cancel();
    });
  });
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (ec) return;
    signalled = true;
    drainer = std::thread([&] {
      const bool idle = impl_->service.shutdown(impl_->options.drain_timeout);
      // Past the deadline the process ends: a model that polls its cancellation flag stops now,
      // and its jobs stay in the store for another server or the next start.
      if (!idle) impl_->service.abandon_running();
      boost::asio::post(loop, [&, idle] {
        drained = idle;
        signals.cancel();  // no second signal to wait for
      });
    });
    signals.async_wait([&](const boost::system::error_code& again, int) {
      if (again) return;
      forced = true;
      impl_->service.end_drain();
    });
  });
  loop.run();  // until the drain ends, or the server was stopped without a signal
  stop();
  serving.join();
  if (drainer.joinable()) drainer.join();
  return signalled && (forced || !drained) ? 1 : 0;
}

int Server::port() const {
  return impl_->http.port();
}

std::string Server::serve_connection_bytes(std::string bytes) {
  return impl_->http.serve_bytes(std::move(bytes));
}

std::string model_digest(const std::string& spec) {
  namespace fs = std::filesystem;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!md || EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1)
    throw Error("model_digest: SHA-256 is not available");
  auto add = [&](const void* data, std::size_t size) {
    if (size > 0 && EVP_DigestUpdate(md.get(), data, size) != 1)
      throw Error("model_digest: hashing failed");
  };
  // A regular file's bytes; how many (its size may have changed since it was asked).
  auto add_file = [&](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("model_digest: cannot read " + file.string());
    char buffer[65536];
    std::uintmax_t read = 0;
    while (in) {
      in.read(buffer, sizeof buffer);
      add(buffer, static_cast<std::size_t>(in.gcount()));
      read += static_cast<std::uintmax_t>(in.gcount());
    }
    if (in.bad()) throw Error("model_digest: cannot read " + file.string());
    return read;
  };
  if (spec == "echo" || spec.rfind("sleep:", 0) == 0) {
    add(spec.data(), spec.size());
  } else {
    std::error_code ec;
    const fs::path root(spec);
    const fs::file_status status = fs::status(root, ec);
    if (ec || !fs::exists(status)) {
      throw Error("model_digest: cannot read " + spec + (ec ? ": " + ec.message() : ""));
    }
    if (fs::is_directory(status)) {
      // Regular files (a link to one counts), directories not followed through links (no
      // loops); entries this user may not open and links that lead nowhere are left out.
      std::vector<std::pair<std::string, fs::path>> files;
      for (fs::recursive_directory_iterator
               it(root, fs::directory_options::skip_permission_denied, ec),
           end;
           !ec && it != end; it.increment(ec)) {
        std::error_code kind;
        if (it->is_regular_file(kind) && !kind)
          files.emplace_back(it->path().lexically_relative(root).generic_string(), it->path());
      }
      if (ec) throw Error("model_digest: cannot list " + spec + ": " + ec.message());
      std::sort(files.begin(), files.end());  // by their relative paths' bytes
      for (const auto& [relative, file] : files) {
        const std::uintmax_t size = fs::file_size(file, ec);
        if (ec) throw Error("model_digest: cannot read " + file.string() + ": " + ec.message());
        const std::string size_text = std::to_string(size);
        add(relative.data(), relative.size() + 1);  // with its NUL
        add(size_text.data(), size_text.size() + 1);
        if (add_file(file) != size)
          throw Error("model_digest: " + file.string() + " changed while it was read");
      }
    } else if (fs::is_regular_file(status)) {
      add_file(root);
    } else {
      throw Error("model_digest: " + spec + " is neither a directory nor a regular file");
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(md.get(), digest, &length) != 1)
    throw Error("model_digest: hashing failed");
  std::string out = "sha256:";
  detail::append_hex(out, std::string_view(reinterpret_cast<const char*>(digest), length));
  return out;
}

}  // namespace rebound

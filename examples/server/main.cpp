// rebound-server: the library wired into a runnable server (the README's command line).
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include <execinfo.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "rebound/rebound.hpp"

namespace {

int default_port() {
  if (const char* env = std::getenv("SAGEMAKER_BIND_TO_PORT")) {
    try {
      const int port = std::stoi(env);
      if (port > 0 && port < 65536) return port;
    } catch (const std::exception&) {
    }
    std::cerr << "rebound-server: ignoring SAGEMAKER_BIND_TO_PORT='" << env << "'\n";
  }
  return 8080;
}

// SageMaker puts the model artefacts here (SM_MODEL_DIR overrides it).
std::string default_model_dir() {
  const char* env = std::getenv("SM_MODEL_DIR");
  return env && *env ? env : "/opt/ml/model";
}

}  // namespace

namespace {
// Each connection is a file descriptor: the soft limit (often 1,024) goes up to the hard one, so
// that --max-connections, not the process, bounds what the server holds. Says so when even the
// hard limit is lower.
void raise_open_files_limit(std::size_t connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  // Descriptors beyond the connections: the store, the callbacks' connections, the logs.
  const rlim_t wanted = static_cast<rlim_t>(connections) + 2048;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < wanted) {
    std::cerr << "rebound-server: warning: the open files limit (" << limit.rlim_cur
              << ") is below --max-connections plus room for the rest (" << wanted
              << "): raise it (ulimit -n) or lower --max-connections" << std::endl;
  }
}
}  // namespace

namespace {
// A process that dies says why on stderr, where an operator (or a test's log) reads it: the
// exception that reached std::terminate, or the fatal signal, each with a backtrace (glibc's
// execinfo; build with -rdynamic or read the addresses with addr2line for names).
void write_stderr(const char* text) {
  for (std::size_t left = std::strlen(text); left > 0;) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<std::size_t>(n);
  }
}

void write_backtrace() {
  void* frames[64];
  ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), STDERR_FILENO);
}

[[noreturn]] void on_terminate() {
  std::string why = "rebound-server: fatal: std::terminate without an active exception\n";
  if (const std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      why = std::string("rebound-server: fatal: uncaught exception: ") + e.what() + "\n";
    } catch (...) {
      why = "rebound-server: fatal: uncaught exception of an unknown type\n";
    }
  }
  write_stderr(why.c_str());
  write_backtrace();
  std::signal(SIGABRT, SIG_DFL);
  std::abort();
}

extern "C" void on_fatal_signal(int signal) {
  // Async-signal-safe only: a fixed text, write(2), backtrace (preloaded at start), re-raise.
  const char* name = signal == SIGSEGV  ? "SIGSEGV"
                     : signal == SIGBUS ? "SIGBUS"
                     : signal == SIGFPE ? "SIGFPE"
                     : signal == SIGILL ? "SIGILL"
                                        : "SIGABRT";
  write_stderr("rebound-server: fatal signal ");
  write_stderr(name);
  write_stderr("\n");
  write_backtrace();
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

void report_fatal_ends() {
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc now, not inside a signal handler
  std::set_terminate(on_terminate);
  for (const int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    std::signal(s, on_fatal_signal);
}
}  // namespace

int main(int argc, char** argv) {
  report_fatal_ends();
  // A peer that closes its end (Redis restarting while hiredis writes to it) must cost an error
  // on that connection, not the process.
  std::signal(SIGPIPE, SIG_IGN);
  // Before anything touches SQLite: no global mutex on each of its allocations.
  rebound::disable_sqlite_memory_statistics();
  CLI::App app{"rebound-server: asynchronous inference with callback delivery"};
  app.set_version_flag("--version", std::string("rebound ") + rebound::version);
  std::string host = "0.0.0.0";
  int port = default_port();
  std::string model_spec = default_model_dir();
  std::string model_repository, default_model;
  std::size_t model_memory_mib = 0;
  bool multi_model = false;
  std::size_t max_batch_size = 0;
  double max_batch_delay_ms = -1;
  std::string store_uri = "sqlite:rebound.db";
  double lease_s = 30;
  std::string server_id;
  double retention_s = 86400;
  std::size_t memory_budget_mib = 512;
  double job_ttl_s = 0;
  double inference_timeout_s = 0;
  std::string log_level = "info";
  std::size_t workers = std::max(2u, std::thread::hardware_concurrency());
  std::size_t queue_capacity = 10000;
  std::optional<std::size_t> prefetch;
  std::size_t max_work_mib = 512;
  std::vector<std::string> signing_secrets;
  std::vector<std::string> signing_keys;
  bool allow_private = false;
  std::vector<std::string> callback_allow;
  std::vector<std::string> api_keys;
  std::vector<std::string> operator_keys;
  std::vector<std::string> viewer_keys;
  std::optional<double> tenant_share;
  std::vector<std::string> tenant_specs;
  double tenant_rate = 0, tenant_burst = 0;
  std::optional<std::size_t> http_threads;
  std::optional<std::size_t> store_threads;
  std::size_t max_connections = 10000;
  std::size_t max_connections_per_address = 0;
  std::size_t max_waiters = 10000;
  double callback_timeout_s = 10;
  std::size_t callback_connections = 1024;
  std::size_t callback_per_origin = 64;
  std::string callback_proxy;
  std::size_t breaker_failures = 5;
  double breaker_cooldown_s = 30;
  double pause_recheck_s = 30;
  std::string callback_ca_file;
  rebound::backoff::Config backoff;
  double backoff_base_s = 1, backoff_cap_s = 60, max_elapsed_s = 0, retry_after_cap_s = 300;

  // `serve` is what SageMaker passes (docker run image serve); options may follow it.
  app.add_subcommand("serve", "Run the server (how SageMaker starts a container); the default")
      ->fallthrough();
  app.require_subcommand(0, 1);
  app.add_option("--host", host, "Address to listen on")->capture_default_str();
  app.add_option("--port", port, "Port to listen on (default: $SAGEMAKER_BIND_TO_PORT, else 8080)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  auto* model_option =
      app.add_option("--model", model_spec,
                     "Model: a directory with a TorchScript model.pt and optional config.json, "
                     "echo, or sleep:<seconds> (answers \"OK\"). Default: $SM_MODEL_DIR, else "
                     "/opt/ml/model")
          ->capture_default_str();
  app.add_option("--model-repository", model_repository,
                 "Several models: DIR/<name>/<version>/, each version a --model directory or a "
                 "config.json naming a built-in ({\"backend\": \"echo\"}); every version is "
                 "served, each model's highest its default (docs/models.md); with "
                 "--sagemaker-multi-model, the root the models' urls must lie in")
      ->envname("REBOUND_MODEL_REPOSITORY")
      ->excludes(model_option);
  app.add_flag("--sagemaker-multi-model", multi_model,
               "SageMaker's multi-model container contract: no model at start; POST /models "
               "loads one from a directory inside --model-repository (default /opt/ml/models), "
               "DELETE /models/{name} unloads it, POST /models/{name}/invoke runs it (env "
               "SAGEMAKER_MULTI_MODEL=true)")
      ->envname("SAGEMAKER_MULTI_MODEL");
  app.add_option("--model-memory-mib", model_memory_mib,
                 "With --model-repository or --sagemaker-multi-model: the memory the loaded "
                 "versions may hold together (each counted for its files' size); a load makes "
                 "room by unloading the least recently used versions no route names and no job "
                 "holds, else fails insufficient_memory (507 on POST /models). 0: no bound")
      ->envname("REBOUND_MODEL_MEMORY_MIB")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 30));
  app.add_option("--default-model", default_model,
                 "With --model-repository: the model a job that names none goes to (needed when "
                 "there are several)")
      ->envname("REBOUND_DEFAULT_MODEL");
  app.add_option("--max-batch-size", max_batch_size,
                 "Jobs and invocations per model call (default: the (default) model's "
                 "config.json, else 1)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{65536}));
  app.add_option(
         "--max-batch-delay-ms", max_batch_delay_ms,
         "Longest wait for a batch to fill, in ms (default: the (default) model's config.json, "
         "else 0)")
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--store", store_uri,
                 "Job store: sqlite:<path> (durable: accepted jobs survive a crash), memory, or "
                 "redis://host[:port][/db][?prefix=name][&replicas=N] (several servers share one "
                 "queue; on a Redis Cluster any node; replicas: each write acknowledged once N "
                 "replicas have it; a password comes from $REBOUND_REDIS_PASSWORD), or "
                 "postgresql://[user@]host[:port]/db[?schema=name] (several servers share one "
                 "queue in that schema; a password comes from $PGPASSWORD or ~/.pgpass; more "
                 "query parameters: prepared=1 for prepared statements, notify=1 for the servers "
                 "to wake each other with NOTIFY, each for a direct connection or a session-mode "
                 "pooler only)")
      ->capture_default_str();
  app.add_option("--lease", lease_s,
                 "Seconds a claim on a job or a callback lasts without renewal: how soon another "
                 "server takes over the work of one that died")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  std::string otlp_endpoint;
  app.add_option("--otlp-endpoint", otlp_endpoint,
                 "Export OpenTelemetry traces (OTLP/HTTP, JSON) to this URL's /v1/traces (default: "
                 "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, or $OTEL_EXPORTER_OTLP_ENDPOINT; "
                 "none: no traces)");
  app.add_option("--server-id", server_id,
                 "This server's name in lease holders and logs (default: host, pid and a random "
                 "suffix)");
  app.add_option("--retention", retention_s,
                 "Seconds a finished job stays in a sqlite store before it is pruned (0: forever)")
      ->check(CLI::Range(0.0, 10.0 * 365 * 86400))
      ->capture_default_str();
  app.add_option("--memory-store-mib", memory_budget_mib,
                 "Budget of the memory store in MiB: finished jobs are forgotten oldest first to "
                 "stay within it; when unfinished ones fill it, 503 queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--workers", workers, "Inferences run at once")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}))
      ->capture_default_str();
  app.add_option("--max-work-mib", max_work_mib,
                 "Memory the work in memory may hold, in MiB: inputs of jobs waiting or running "
                 "(as parsed), bodies of callback attempts under way; beyond it 503 queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--queue-capacity", queue_capacity,
                 "Work accepted and unfinished at once (jobs waiting, in memory or parked in the "
                 "store beyond --prefetch, or running; callback attempts under way; retries "
                 "waiting for their time are in the store and not counted); beyond it 503 "
                 "queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000000}))
      ->capture_default_str();
  app.add_option("--prefetch", prefetch,
                 "Jobs held in memory waiting for a worker; accepted jobs beyond it wait in the "
                 "store only, claimed as the workers drain (0: all in memory; default 1024 with "
                 "the memory and SQLite stores, 0 with Redis; not applied with tenant shares)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{100000000}));
  app.add_option("--log-level", log_level,
                 "Structured (JSON lines) job logs on stderr: debug, info, warn, error or off")
      ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  app.add_option("--job-ttl", job_ttl_s,
                 "Seconds a job may wait before it runs; older jobs end expired (0: no limit)")
      ->check(CLI::Range(0.0, 30.0 * 86400))
      ->capture_default_str();
  app.add_option("--inference-timeout", inference_timeout_s,
                 "Seconds a model call may take before its jobs fail with inference_timeout "
                 "(0: no limit)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--http-threads", http_threads,
                 "Threads of the HTTP front (Boost.Beast): they serve every connection "
                 "asynchronously; no thread waits for a job, and none for a submission's write "
                 "(default: one per four cores, at least 1)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}));
  app.add_option("--store-threads", store_threads,
                 "Threads for the routes whose store calls may wait (polls, cancels, redeliveries, "
                 "batches, /metrics, the console's listings), so that the HTTP threads never do "
                 "(default: 16 with SQLite, Redis and PostgreSQL, whose calls wait for a disk or a "
                 "round trip; 0 with the memory store: those routes run on the HTTP threads)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1024}));
  app.add_option("--max-connections", max_connections,
                 "HTTP connections open at once; one more is closed at once")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}))
      ->capture_default_str();
  app.add_option("--max-connections-per-address", max_connections_per_address,
                 "HTTP connections open at once from one client address (0: no limit; behind a "
                 "proxy every connection comes from its address)")
      ->capture_default_str();
  app.add_option("--max-waiters", max_waiters,
                 "Requests waiting for a job at once (Prefer: wait); beyond it a poll gets 503 "
                 "too_many_waiters and a submission its 202 at once")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000000}))
      ->capture_default_str();
  app.add_option("--api-key", api_keys,
                 "[NAME:]KEY: require Authorization: Bearer <key> on every route but /ping, "
                 "/openapi.json and /v1/webhook-keys. Each name is a tenant, with its own jobs "
                 "and callback secret; keys sharing a name are one tenant's (rotation); a bare "
                 "key is its own name (env REBOUND_API_KEY)")
      ->envname("REBOUND_API_KEY");
  app.add_option("--tenant-share", tenant_share,
                 "The share of --queue-capacity one tenant's jobs may hold at once; beyond it "
                 "its submissions get 429 tenant_quota (default 0.5 with several tenants, else 1)")
      ->check(CLI::Range(0.0001, 1.0));
  app.add_option("--tenant", tenant_specs,
                 "NAME:weight=W,rate=R,burst=B (any of them; repeatable): one tenant's turns for "
                 "the workers (W jobs in a row, default 1) and its submissions per second (R, "
                 "with bursts of B; beyond it 429 tenant_rate), in place of the defaults below");
  app.add_option("--tenant-rate", tenant_rate,
                 "Jobs per second each tenant may submit to this server, sustained (0: no "
                 "limit); beyond it 429 tenant_rate")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--tenant-burst", tenant_burst,
                 "Jobs each tenant may submit at once above --tenant-rate (0: one second's worth)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--operator-key", operator_keys,
                 "[NAME:]KEY: an API key that may also, with several tenants, list receiver "
                 "origins, read /metrics and pause or resume origins, that loads, unloads and "
                 "routes model versions (/v1/models/...) and SageMaker's /models, and that uses "
                 "the operator console at "
                 "/console/ to read and act (env REBOUND_OPERATOR_KEY)")
      ->envname("REBOUND_OPERATOR_KEY");
  app.add_option("--viewer-key", viewer_keys,
                 "[NAME:]KEY: an API key that may also read everything an operator key reads, the "
                 "console at /console/ included, and act on nothing (env REBOUND_VIEWER_KEY)")
      ->envname("REBOUND_VIEWER_KEY");

  auto* delivery = "Callback delivery";
  app.add_option(
         "--signing-secret", signing_secrets,
         "Sign callbacks (Standard Webhooks) with this whsec_... secret; repeat to sign with "
         "several during a rotation (env REBOUND_SIGNING_SECRET)")
      ->envname("REBOUND_SIGNING_SECRET")
      ->group(delivery);
  app.add_option("--signing-key", signing_keys,
                 "Sign callbacks with this Ed25519 whsk_... key (Standard Webhooks v1a); receivers "
                 "verify with its public key from GET /v1/webhook-keys. Repeat for a rotation "
                 "(env REBOUND_SIGNING_KEY)")
      ->envname("REBOUND_SIGNING_KEY")
      ->group(delivery);
  app.add_option("--callback-timeout", callback_timeout_s, "Seconds per attempt")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--max-tries", backoff.max_tries, "Attempts per callback before giving up")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str()
      ->group(delivery);
  const std::map<std::string, rebound::backoff::Schedule> schedules{
      {"exponential", rebound::backoff::Schedule::exponential},
      {"constant", rebound::backoff::Schedule::constant},
      {"fibonacci", rebound::backoff::Schedule::fibonacci},
      {"decorrelated", rebound::backoff::Schedule::decorrelated}};
  std::string schedule_name = "exponential";
  app.add_option("--backoff", schedule_name,
                 "Schedule between attempts: exponential, constant, fibonacci or decorrelated")
      ->check(CLI::IsMember(schedules))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--backoff-base", backoff_base_s, "First delay, in seconds")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--backoff-factor", backoff.factor, "Growth per attempt (exponential)")
      ->check(CLI::Range(1.0, 100.0))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--backoff-cap", backoff_cap_s, "Longest delay, in seconds")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str()
      ->group(delivery);
  const std::map<std::string, rebound::backoff::Jitter> jitters{
      {"full", rebound::backoff::Jitter::full},
      {"equal", rebound::backoff::Jitter::equal},
      {"none", rebound::backoff::Jitter::none}};
  std::string jitter_name = "full";
  app.add_option("--jitter", jitter_name,
                 "Randomisation of each delay: full, equal or none (decorrelated is its own)")
      ->check(CLI::IsMember(jitters))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--max-elapsed", max_elapsed_s,
                 "Give up when the next attempt would start this many seconds after the first "
                 "(0: no limit)")
      ->check(CLI::Range(0.0, 30.0 * 86400))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--retry-after-cap", retry_after_cap_s,
                 "Honour a receiver's Retry-After up to this many seconds (0: ignore it)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str()
      ->group(delivery);
  app.add_flag("--allow-private-callbacks", allow_private,
               "Allow callbacks to loopback and private addresses (development and tests)")
      ->group(delivery);
  app.add_option("--callback-allow", callback_allow,
                 "Allow callbacks to this host, *.domain, address or CIDR range even if private "
                 "(repeatable)")
      ->group(delivery);
  app.add_option("--callback-connections", callback_connections,
                 "Callback requests in flight at once, in all (the last eighth kept for receivers "
                 "that answer); more wait their turn")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--callback-per-origin", callback_per_origin,
                 "Callback requests in flight at once to one receiver origin (scheme://host:port)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--callback-breaker-failures", breaker_failures,
                 "Consecutive failures that open a receiver origin's circuit (0: no breaker)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1000000}))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--callback-breaker-cooldown", breaker_cooldown_s,
                 "Seconds an open circuit holds deliveries back before one probe")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--callback-pause-recheck", pause_recheck_s,
                 "Seconds between the returns of a paused origin's callbacks from the store to "
                 "find out whether it was resumed: how soon they go after a resume")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str()
      ->group(delivery);
  app.add_option("--callback-proxy", callback_proxy,
                 "Send callbacks through this proxy (http://host:port); the proxy then decides "
                 "which addresses may be reached")
      ->group(delivery);
  app.add_option("--callback-ca-file", callback_ca_file,
                 "PEM file of certificate authorities for https callbacks (default: the system's)")
      ->check(CLI::ExistingFile)
      ->group(delivery);
  CLI11_PARSE(app, argc, argv);

  try {
    // A blank line in a container template sets a variable to nothing: that must not turn
    // authentication or signing off without a word.
    for (const char* name : {"REBOUND_API_KEY", "REBOUND_OPERATOR_KEY", "REBOUND_VIEWER_KEY",
                             "REBOUND_SIGNING_SECRET", "REBOUND_SIGNING_KEY"}) {
      const char* value = std::getenv(name);
      if (value && std::string(value).find_first_not_of(" \t\r\n") == std::string::npos) {
        throw rebound::Error(std::string(name) + " is set but empty: unset it, or give it a value");
      }
    }
    for (const auto& key : api_keys) {
      if (key.find_first_not_of(" \t\r\n") == std::string::npos) {
        throw rebound::Error("--api-key must not be empty");
      }
    }
    for (const auto& key : operator_keys) {
      if (key.find_first_not_of(" \t\r\n") == std::string::npos) {
        throw rebound::Error("--operator-key must not be empty");
      }
    }
    for (const auto& key : viewer_keys) {
      if (key.find_first_not_of(" \t\r\n") == std::string::npos) {
        throw rebound::Error("--viewer-key must not be empty");
      }
    }
    for (const auto& secret : signing_secrets) {
      if (!rebound::is_valid_webhook_secret(secret)) {
        throw rebound::Error("--signing-secret must look like whsec_<base64>");
      }
    }
    for (const auto& key : signing_keys) {
      if (!rebound::is_valid_webhook_signing_key(key)) {
        throw rebound::Error("--signing-key must look like whsk_<base64 of a 32-byte key>");
      }
    }
    auto ms = [](double seconds) {
      return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
    };
    backoff.schedule = schedules.at(schedule_name);
    backoff.jitter = jitters.at(jitter_name);
    backoff.base = ms(backoff_base_s);
    backoff.cap = ms(backoff_cap_s);
    backoff.max_elapsed = ms(max_elapsed_s);
    backoff.retry_after_cap = ms(retry_after_cap_s);
    // Everything that can refuse the configuration is built before the model loads: a mistake
    // in a cheap flag is reported without waiting for it.
    rebound::AddressGuard(allow_private, callback_allow);  // a bad --callback-allow, said now
    rebound::StoreSettings store_settings;
    store_settings.retention = std::chrono::seconds(static_cast<long long>(retention_s));
    store_settings.memory_max_bytes = memory_budget_mib << 20;
    // Never on the command line, which every user of the machine can read.
    if (const char* password = std::getenv("REBOUND_REDIS_PASSWORD")) {
      store_settings.redis_password = password;
    }
    auto store = rebound::make_store(store_uri, store_settings);
    rebound::JobQueueOptions options;
    options.workers = workers;
    options.queue_capacity = queue_capacity;
    // A shared store's queue is claimed by every server: there each keeps what it accepts.
    const bool shared_store =
        store_uri.rfind("redis", 0) == 0 || store_uri.rfind("postgres", 0) == 0;
    options.prefetch = prefetch.value_or(shared_store ? 0 : 1024);
    options.max_work_bytes = max_work_mib << 20;
    // Every HTTP request that waits (Prefer: wait) is one of the queue's registered waits.
    options.max_waiting = std::max(options.max_waiting, max_waiters);
    {
      std::set<std::string_view> names;
      for (const auto* keys : {&api_keys, &operator_keys, &viewer_keys})
        for (const auto& key : *keys)
          names.insert(rebound::key_name(key));
      options.tenant_share = tenant_share.value_or(names.size() > 1 ? 0.5 : 1.0);
      options.tenant_defaults.rate = tenant_rate;
      options.tenant_defaults.burst = tenant_burst;
      for (const auto& spec : tenant_specs) {
        // What a --tenant leaves out is the defaults' (--tenant-rate, --tenant-burst).
        auto [name, settings] = rebound::parse_tenant_spec(spec, options.tenant_defaults);
        if (!names.count(name)) {
          throw rebound::Error("--tenant names '" + name +
                               "', which no --api-key, --operator-key or --viewer-key names");
        }
        // With one name the server has one tenant, the default (empty) one.
        const std::string key = names.size() > 1 ? name : std::string();
        if (options.tenants.count(key)) throw rebound::Error("--tenant names '" + name + "' twice");
        options.tenants.emplace(key, settings);
      }
      if (names.size() > 1) {
        for (const auto* keys : {&api_keys, &operator_keys, &viewer_keys}) {
          for (const auto& key : *keys) {
            if (key.find(':') == std::string::npos) {
              std::cerr << "rebound-server: warning: a key without a name is its own tenant "
                           "name, which shows in logs and webhook ids; name it (NAME:KEY)\n";
            }
          }
        }
      }
    }
    options.job_ttl = ms(job_ttl_s);
    options.inference_timeout = ms(inference_timeout_s);
    options.lease = ms(lease_s);
    options.server_id = server_id;
    options.drain_on_destroy = std::chrono::milliseconds(0);  // run_until_signal drained already
    options.logger = rebound::Logger::to_stream(*rebound::parse_log_level(log_level), std::cerr);
    if (max_batch_size > 0) options.max_batch_size = max_batch_size;
    if (max_batch_delay_ms >= 0) {
      options.max_queue_delay =
          std::chrono::microseconds(static_cast<long long>(max_batch_delay_ms * 1000));
    }
    options.delivery.backoff = rebound::backoff::make_policy(backoff);
    options.delivery.timeout = ms(callback_timeout_s);
    options.delivery.signing_secrets = signing_secrets;
    options.delivery.signing_secrets.insert(options.delivery.signing_secrets.end(),
                                            signing_keys.begin(), signing_keys.end());
    options.allow_private_callbacks = allow_private;
    options.callback_allow = callback_allow;
    options.origins.max_total = callback_connections;
    options.origins.max_per_origin = callback_per_origin;
    options.origins.breaker_failures = breaker_failures;
    options.origins.breaker_cooldown = ms(breaker_cooldown_s);
    options.origins.paused_retry = ms(pause_recheck_s);
    rebound::CurlTransportOptions transport_options;
    transport_options.max_total = callback_connections;
    transport_options.proxy = callback_proxy;
    transport_options.ca_cert_file = callback_ca_file;
    // One event loop (the queue's io thread) for callbacks: their timers, their bookkeeping and
    // the transport's sockets. Sharing it saves two thread hand-offs per callback; a loop of the
    // transport's own cost a third more CPU per delivered job (docs/benchmarks.md).
    options.transport = [transport_options](boost::asio::any_io_executor io,
                                            const rebound::AddressGuard& guard) mutable {
      transport_options.guard = guard;
      return std::make_unique<rebound::CurlTransport>(std::move(io), transport_options);
    };
    rebound::ServerOptions server_options;
    server_options.host = host;
    server_options.port = port;
    // No submission waits on an HTTP thread (the memory store answers at once; SQLite after its
    // group commit, Redis from its batch thread, PostgreSQL from its writer), so a few threads
    // keep up with the rest of the pipeline (the queue's io thread, the workers); more only take
    // cores from them: on 2 cores, 1 thread ran 16,700 jobs/s end to end with the memory store
    // and 10,600 with SQLite, 2 threads 14,300 and 9,300; with Redis, 16 threads (when its puts
    // held them) took 11,400 submissions a second, 1 thread 21,400 (docs/benchmarks.md). The
    // routes whose store calls wait (a read behind SQLite's writes, a round trip to Redis or
    // PostgreSQL) run on threads of their own.
    const std::size_t quarter_of_cores = std::thread::hardware_concurrency() / 4;
    server_options.http_threads = http_threads.value_or(std::max<std::size_t>(1, quarter_of_cores));
    const bool memory_store = store_uri.rfind("memory", 0) == 0;
    server_options.store_call_threads = store_threads.value_or(memory_store ? 0 : 16);
    server_options.max_connections = max_connections;
    server_options.max_connections_per_address = max_connections_per_address;
    server_options.max_waiters = max_waiters;
    raise_open_files_limit(max_connections);
    server_options.api_keys = api_keys;
    server_options.operator_keys = operator_keys;
    server_options.viewer_keys = viewer_keys;
    // SIGTERM/SIGINT: stop taking work (submissions and /ping get 503) while still answering
    // polls, finish what is in flight up to a deadline inside SageMaker's 30 s, then stop HTTP.
    server_options.drain_timeout = std::chrono::seconds(25);

    if (!default_model.empty() && model_repository.empty()) {
      std::cerr << "rebound-server: warning: --default-model (or REBOUND_DEFAULT_MODEL) is "
                   "ignored without --model-repository"
                << std::endl;
    }
    if (multi_model && (model_option->count() > 0 || !default_model.empty())) {
      std::cerr << "rebound-server: warning: --model and --default-model are ignored with "
                   "--sagemaker-multi-model: models come from POST /models"
                << std::endl;
    }
    rebound::ModelRepository models;
    if (multi_model) {
      // Nothing at start: each model is loaded from the url POST /models gives, which must lie
      // inside the root, as version "1" of its name.
      const std::string root = model_repository.empty() ? "/opt/ml/models" : model_repository;
      auto urls = std::make_shared<rebound::ModelUrls>();
      models.set_loader([root, urls](const rebound::ModelRef& ref) {
        const std::optional<std::string> url = urls->get(ref.name);
        if (!url || ref.version != "1") {
          throw rebound::Error("no url was given for '" + ref.name + "/" + ref.version +
                               "' (POST /models loads version 1 of a model)");
        }
        return rebound::RepositoryDir(root).load_path(*url);
      });
      models.set_digester([urls](const rebound::ModelRef& ref) {
        const std::optional<std::string> url = urls->get(ref.name);
        return url ? rebound::model_digest(*url) : std::string();
      });
      models.set_sizer([root, urls](const rebound::ModelRef& ref) {
        const std::optional<std::string> url = urls->get(ref.name);
        return url ? rebound::RepositoryDir(root).bytes_of_path(*url) : std::size_t{0};
      });
      // SageMaker places models on each instance itself: a load or an unload is this server's
      // own, whatever store its jobs are in.
      models.share_models(false);
      server_options.sagemaker_multi_model = true;
      server_options.model_urls = urls;
      server_options.model_repository = root;
    } else if (model_repository.empty()) {
      auto model = rebound::make_model(model_spec);
      if (!rebound::is_valid_model_name(model->name())) {
        // Served all the same; but a submission cannot ask for it by name ("model").
        std::cerr << "rebound-server: warning: the model's name '" << model->name()
                  << "' is not a model name (1 to 64 of a-z 0-9 . _ -, the first a letter or a "
                     "digit): jobs name it, but cannot ask for it"
                  << std::endl;
      }
      models = rebound::ModelRepository(std::move(model));
    } else {
      models = rebound::make_model_repository(model_repository, default_model);
      // Versions loaded while it runs (PUT /v1/models/{name}/versions/{version}) come from the
      // same directory, each with the digest of its files.
      server_options.model_repository = model_repository;
      models.set_digester([dir = model_repository](const rebound::ModelRef& ref) {
        return rebound::model_digest(dir + "/" + ref.name + "/" + ref.version);
      });
    }
    if (model_memory_mib > 0) {
      if (model_repository.empty() && !multi_model) {
        std::cerr << "rebound-server: warning: --model-memory-mib is ignored without "
                     "--model-repository or --sagemaker-multi-model"
                  << std::endl;
      }
      models.set_memory_budget(model_memory_mib << 20);
    }
    // GET /v1/models names what was loaded: a digest of each version's files, and when. A model
    // whose directory holds a file this user cannot read is still served, its digest left out.
    server_options.model_loaded_at = std::chrono::system_clock::now();
    for (const rebound::ModelRef& ref :
         multi_model ? std::vector<rebound::ModelRef>() : models.list()) {
      const std::string spec = model_repository.empty()
                                   ? model_spec
                                   : model_repository + "/" + ref.name + "/" + ref.version;
      try {
        const std::string digest = rebound::model_digest(spec);
        if (model_repository.empty()) {
          server_options.model_digest = digest;
        } else {
          server_options.model_digests[ref.name + "/" + ref.version] = digest;
        }
      } catch (const std::exception& e) {
        std::cerr << "rebound-server: warning: " << e.what()
                  << " (GET /v1/models leaves the digest of " << ref.name << "/" << ref.version
                  << " out)" << std::endl;
      }
    }
    // Traces: every job's submission, run and callback attempts, as OpenTelemetry spans.
    std::shared_ptr<rebound::OtlpTracer> tracer;
    std::optional<std::string> traces_url;
    if (!otlp_endpoint.empty()) {
      traces_url = rebound::otlp_traces_endpoint(otlp_endpoint);
    } else {
      traces_url = rebound::otlp_traces_endpoint_from_environment();
    }
    if (traces_url) {
      for (const char* name :
           {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"}) {
        const char* protocol = std::getenv(name);
        if (protocol && *protocol && std::string(protocol) != "http/json") {
          std::cerr << "rebound-server: warning: " << name << "=" << protocol
                    << " is not supported: traces go as http/json to " << *traces_url << "\n";
          break;
        }
      }
      std::cout << "rebound-server: traces to " << *traces_url << " (OTLP/HTTP, JSON)" << std::endl;
      rebound::OtlpTracerOptions to;
      to.endpoint = *traces_url;
      const char* service = std::getenv("OTEL_SERVICE_NAME");
      to.service_name = service && *service ? service : "rebound-server";
      to.server_id = server_id;
      to.model_name = models.default_model();
      tracer = std::make_shared<rebound::OtlpTracer>(to);
      options.observers.push_back(tracer);
      options.trace_submissions = true;
    }

    // (The tracer outlives the queue: it exports what the drain traced; it counts into the
    // queue's metrics while they last, through Observer::on_metrics.)
    std::string serving;  // "iris/2, echo/1"
    for (const rebound::ModelRef& ref : models.list())
      serving += (serving.empty() ? "" : ", ") + ref.name + "/" + ref.version;
    if (!model_repository.empty()) serving = "models " + serving;
    if (multi_model) serving = "SageMaker multi-model, root " + server_options.model_repository;
    rebound::JobQueue queue(std::move(models), std::move(store), options);
    rebound::Server server(queue, server_options);
    const int bound = server.bind();
    if (const auto resumed = queue.telemetry().batch_stats().resumed) {
      std::cout << "rebound-server: resumed " << resumed << " unfinished jobs from "
                << rebound::redacted_store_uri(store_uri) << std::endl;
    }
    std::cout << "rebound-server " << rebound::version << " listening on " << host << ":" << bound
              << " ("
              << (model_repository.empty() && !multi_model ? "model " + queue.model()->name()
                                                           : serving)
              << ", store " << rebound::redacted_store_uri(store_uri) << ", workers " << workers
              << ", batches up to " << queue.telemetry().max_batch_size() << " within "
              << queue.telemetry().max_queue_delay().count() / 1000.0 << " ms)" << std::endl;
    const int status = server.run_until_signal();
    if (status != 0) {
      if (store_uri.rfind("memory", 0) == 0) {
        std::cerr << "rebound-server: jobs still in flight at the end of the drain are lost (the "
                     "memory store)\n";
      } else {
        std::cerr << "rebound-server: jobs still in flight at the end of the drain stay in the "
                     "store ("
                  << rebound::redacted_store_uri(store_uri)
                  << "): they run again at the next start, or on another server of the store\n";
      }
    }
    const rebound::BatchStats stats = queue.telemetry().batch_stats();
    if (stats.batches > 0) {
      std::cout << "rebound-server: " << stats.items << " inferences in " << stats.batches
                << " batches, mean batch "
                << static_cast<double>(stats.items) / static_cast<double>(stats.batches)
                << ", largest " << stats.largest_batch << std::endl;
    }
    return status;  // 1: work was left at the end of the drain
  } catch (const rebound::Error& e) {
    std::cerr << "rebound-server: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "rebound-server: fatal: " << e.what() << "\n";
    return 3;
  }
}

// JobQueueOptions: how a JobQueue runs: its workers and batches, its bounds, leases and clocks,
// callback delivery, and where its events go.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "rebound/delivery/address_guard.hpp"
#include "rebound/delivery/callback_sender.hpp"
#include "rebound/delivery/callback_transport.hpp"
#include "rebound/delivery/origin_gate.hpp"
#include "rebound/log.hpp"
#include "rebound/observer.hpp"
#include "rebound/tenant.hpp"

namespace rebound {

struct JobQueueOptions {
  /// Batches run at once. The one-line constructor starts a thread pool of this size; with your
  /// own executors, size their pool to it.
  std::size_t workers = 4;
  /// Jobs and invocations handed to `Model::predict_batch` at once; unset: the model's preference
  /// (`Model::batching()`), which defaults to 1 (no batching).
  std::optional<std::size_t> max_batch_size;
  /// Longest wait for a batch to fill; unset: the model's preference.
  std::optional<std::chrono::microseconds> max_queue_delay;
  /// A job still waiting this long after it was accepted is not run: it ends `expired` (error
  /// code "expired") and its callback says so, as SageMaker's RequestTTLSeconds. 0: no limit.
  /// Measured from `created_at`, so it holds across restarts with a durable store.
  std::chrono::milliseconds job_ttl{0};
  /// A batch whose model call has not returned after this long is answered at once: its jobs end
  /// `failed` with code "inference_timeout" (invocations get it too) and the late result is
  /// discarded. The model call itself cannot be interrupted, so its worker stays busy until it
  /// returns. 0: no limit.
  std::chrono::milliseconds inference_timeout{0};
  /// Work in memory at once, at most: jobs waiting for a worker or running, and callback
  /// attempts under way. A callback waiting for its next attempt is in the store, not in memory,
  /// and holds no slot. Submissions beyond it are refused with `queue_full`, so memory stays
  /// bounded however slow the model or the receivers are.
  std::size_t queue_capacity = 10000;
  /// The most jobs held in memory waiting for a worker; 0: no bound (every accepted job waits in
  /// memory as well as in the store, up to `queue_capacity`). With a bound, a job accepted beyond
  /// it (or behind jobs waiting so already) is stored unclaimed and keeps only its capacity slot:
  /// it costs the store's bytes and none in this process, and the queue claims it from the store
  /// as its workers drain what is in memory, oldest first within a priority (the store's order).
  /// `queue_capacity` still bounds the jobs accepted and not finished, parked ones included.
  /// Jobs submitted with async_submit are always held (their end must not pass unseen). Not
  /// applied with tenant shares (`tenant_share` below 1): tenants take turns in memory, so every
  /// job is held there. With a store shared by several servers, a parked job may be run by
  /// another server; its slot here is freed when this queue next finds the store without
  /// claimable jobs. rebound-server: --prefetch.
  std::size_t prefetch = 0;
  /// The bytes that work in memory may hold at once: the inputs of jobs waiting for a worker or
  /// running (as their parsed trees really take, rebound::detail::json_footprint) and the bodies
  /// of callback attempts under way. Submissions beyond it are refused with `queue_full`, and jobs
  /// in the store are claimed only as it frees up; one job larger than all of it is still taken
  /// when nothing else is in memory. Not counted: what a MemoryJobStore keeps (its own
  /// `max_bytes`), and the request being parsed. rebound-server: --max-work-mib.
  std::size_t max_work_bytes = std::size_t{512} << 20;
  /// The share of `queue_capacity` that one tenant's submissions may hold at once (a job's tenant
  /// is the part of its id before '/', rebound/tenant.hpp); beyond it its submissions are refused
  /// with `tenant_quota` while the others are still accepted. 1: no limit (one tenant).
  /// rebound-server sets 0.5 when it has several tenants (--tenant-share).
  double tenant_share = 1.0;
  /// What every tenant gets unless `tenants` names it (the default: equal turns, no rate limit).
  /// The default tenant of a queue without names (the empty one) is a tenant here too.
  TenantOptions tenant_defaults;
  /// Per tenant (by name), in place of `tenant_defaults`.
  std::map<std::string, TenantOptions, std::less<>> tenants;
  CallbackSenderOptions delivery;
  /// Each callback receiver origin's limits and circuit breaker (rebound::OriginGate, put in
  /// front of the transport). A callback that cannot go now (its origin's circuit open, paused,
  /// or at its limits) goes back to the store, due when it can: it holds no slot and no memory.
  /// Unless set, `origins.max_waiting_per_origin` is a quarter of `queue_capacity` (at least 64),
  /// so that one slow receiver cannot hold every slot.
  OriginGateOptions origins;
  /// A callback still deferred this long after its delivery started (its receiver's circuit open
  /// or paused all along) is given up, with the reason as its last error: a dead letter to
  /// redeliver, not a row that waits forever.
  std::chrono::milliseconds callback_max_deferral{std::chrono::hours(24)};
  /// While the store fails, how often a write for an accepted job (its outcome, its callback's
  /// end) is tried again. The job keeps its slot meanwhile, so nothing accepted is lost.
  std::chrono::milliseconds store_retry_interval{1000};
  /// How long a claim on work (a job to run, a callback attempt) lasts without renewal. Jobs are
  /// renewed every third of it while they wait or run; work whose server died is claimed by
  /// another (or by this one after a restart) once its lease runs out. Longer than the callback
  /// timeout, so that an attempt never outlives its lease.
  std::chrono::milliseconds lease{30000};
  /// How often the store is asked for due work that this server did not schedule itself (other
  /// servers' jobs, leases that ran out). Retries this server scheduled wake it on time, and so
  /// does a store that tells of other servers' work (FleetStore::watch_work: PostgreSQL with
  /// `notify`).
  std::chrono::milliseconds poll_interval{1000};
  /// `async_wait` calls registered at once, at most (beyond: errc::too_many_waiters);
  /// `async_submit` is bounded by `queue_capacity` instead.
  std::size_t max_waiting = 1024;
  /// The callback address policy (SSRF, docs/delivery.md): false refuses loopback, private,
  /// link-local, CGNAT, unspecified and multicast addresses. The only place it is set: the
  /// default transport and rebound::Server read it from here
  /// (`queue.operations().callback_guard()`).
  bool allow_private_callbacks = false;
  /// Hosts, `*.domains`, addresses and CIDR ranges allowed even when private.
  std::vector<std::string> callback_allow;
  /// Builds the callback transport on the queue's io executor, with the address guard above.
  /// Unset: the libcurl transport when the program links rebound::http (rebound::rebound), else
  /// none, and a job with a callback URL is refused (errc::no_transport).
  std::function<std::unique_ptr<CallbackTransport>(boost::asio::any_io_executor io,
                                                   const AddressGuard& guard)>
      transport;
  /// The owning constructor's destructor first drains for this long (JobQueue::shutdown).
  std::chrono::milliseconds drain_on_destroy{25000};
  /// The name of this server in lease holders (logs, the store). Empty: host name, process id and
  /// a random suffix.
  std::string server_id;
  /// The clock of every time the queue stores or compares (created_at, leases, next attempts,
  /// time-to-live) and of the store pump's schedule (its polls, lease renewals and sweeps). Tests
  /// inject one to move time on without sleeping: the pump sees a moved clock within a quarter
  /// second, and a frozen one never polls by itself (a submission or a freed slot still wakes
  /// it). A clock stepped back (an NTP step) delays no poll or renewal by the step. Other timers
  /// wait in real time for the difference to the injected clock. Called often, from several
  /// threads, some under a lock: it must be cheap and never block.
  std::function<std::chrono::system_clock::time_point()> clock = [] {
    return std::chrono::system_clock::now();
  };
  /// Where job events go (accepted, completed, expired, callback attempts, deliveries, give-ups,
  /// resumed jobs, store errors). The default logs nothing.
  Logger logger;
  /// More listeners to the pipeline's events, after the metrics and the log (see
  /// Observer: thread-safe, short, never called under a queue lock).
  std::vector<std::shared_ptr<Observer>> observers;
  /// Every accepted job gets a W3C trace context: the submission becomes a span (a child of the
  /// submission's `traceparent` when it had one, else the root of a new trace), the job is stored
  /// with a `traceparent` naming that span, and its run and callback attempts continue the trace
  /// (each attempt's `traceparent` header names the attempt's own span). Observers hear
  /// on_submission_traced. rebound::OtlpTracer (rebound::http) turns it into OTLP spans.
  bool trace_submissions = false;
};

}  // namespace rebound

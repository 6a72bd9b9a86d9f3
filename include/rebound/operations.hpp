// rebound::Operations: what operators and the operator console need of a JobQueue, apart from
// its data plane (submit, wait, invoke, find, cancel, redeliver, shutdown): listings and their
// pages, dead letters, queue positions, receiver origins and their pause and resume, the servers
// of a shared store, signing keys, the address policy and the logger. Reached through
// `JobQueue::operations()`; lives as long as its queue.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "rebound/delivery/address_guard.hpp"
#include "rebound/delivery/origin_gate.hpp"
#include "rebound/job.hpp"
#include "rebound/log.hpp"
#include "rebound/store/job_store.hpp"
#include "rebound/tenant.hpp"

namespace rebound {

class JobQueue;
namespace detail {
struct Pipeline;
}  // namespace detail

/// Thread-safety: every method is thread-safe.
///
/// Example (what the console's dead-letter page reads):
///   const rebound::JobPage page = queue.operations().failed_callbacks_page("", std::nullopt, 50);
///   for (const rebound::JobRecord& r : page.jobs) queue.redeliver({r.job.id, r.job.tenant});
class Operations {
 public:
  Operations(const Operations&) = delete;
  Operations& operator=(const Operations&) = delete;

  /// How many queued jobs run before the queued job `job` names (JobStore::queue_position):
  /// nullopt when it is not queued or the store cannot tell. Throws StoreUnavailable when the
  /// store fails.
  std::optional<std::size_t> queue_position(const JobRef& job) const;

  /// Jobs whose callback was given up, most recent first, at most `limit`. Throws
  /// StoreUnavailable when the store fails.
  std::vector<JobRecord> failed_callbacks(std::size_t limit) const;

  /// A page of the jobs whose callback was given up, newest first, from `after` (none: the
  /// newest; a page's `next` goes on), at most `limit`, of the jobs whose key starts with
  /// `id_prefix` ("tenant/" for one tenant's: rebound::key_of; "" is every job). Entries carry no
  /// input and no result (`find` has them), so one page's memory depends on `limit`, not on the
  /// jobs. Throws StoreUnavailable when the store fails.
  JobPage failed_callbacks_page(const std::string& tenant, const std::optional<ListCursor>& after,
                                std::size_t limit) const;

  /// A page of the jobs that match `filter` (JobFilter: status, callback state, priority, and an
  /// id prefix, "tenant/" for one tenant's), newest first, from `after`, at most `limit`
  /// (JobStore::list_jobs); entries without input, result or attempt log. What the operator
  /// console lists. Throws StoreUnavailable when the store fails.
  JobPage list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                    std::size_t limit) const;

  /// The servers working on this queue's store in the last hour, this one among them (on a
  /// shared store, every server's), most recently seen first; each reports every third of a
  /// lease. Throws StoreUnavailable when the store fails.
  std::vector<ServerSeen> servers() const;

  /// The logger of JobQueueOptions::logger: front ends (rebound::Server) log what operators do
  /// with it.
  const Logger& logger() const;

  /// This queue's server id (JobQueueOptions::server_id, or the one made for it): what its
  /// leases are named after.
  const std::string& server_id() const;

  /// The callback receivers' origins being delivered to, failing, open or paused: circuit state,
  /// failures, requests in flight and deferred (OriginGate::endpoints).
  std::vector<EndpointStatus> callback_endpoints() const;

  /// Stops sending callbacks to `origin` ("https://hooks.example.com", or any URL of it) until
  /// `resume_origin`: its callbacks wait in the store, due again every
  /// `origins.paused_retry`, spending no attempts. Returns the origin as endpoints name it
  /// ("https://hooks.example.com:443"). Throws rebound::Error for a value that is not an http(s)
  /// URL, or when the queue delivers no callbacks, and StoreUnavailable when the store fails.
  /// On a store that shares pauses (JobStore::set_origin_paused: Redis) every queue of the store
  /// holds it within a second, and it outlives restarts; otherwise it is this queue's.
  std::string pause_origin(const std::string& origin);

  /// Sends to `origin` again, here and (on a store that shares pauses) on every queue of the
  /// store; its waiting callbacks go out as they come due (within `origins.paused_retry`). False
  /// when it was not paused here. Throws StoreUnavailable when the store fails.
  bool resume_origin(const std::string& origin);

  /// The origins paused now, sorted.
  std::vector<std::string> paused_origins() const;

  /// The callback address policy in force (`allow_private_callbacks`, `callback_allow`): the
  /// transport connects only where it allows, and rebound::Server checks submissions with it.
  const AddressGuard& callback_guard() const;

  /// True when callback jobs can be accepted: a transport was given or built.
  bool delivers_callbacks() const;

  /// The "whpk_..." public keys that verify this queue's Ed25519 (`v1a`) callback signatures.
  const std::vector<std::string>& webhook_public_keys() const;

  /// The keys the callbacks of `tenant`'s jobs are signed with ("whsec_..." and "whsk_...":
  /// derived from `delivery.signing_secrets` and the name, or set in
  /// `delivery.tenant_signing_secrets`; "" is the queue's own). What GET /v1/webhook-secret hands
  /// to the tenant.
  std::vector<std::string> webhook_signing_keys(const std::string& tenant) const;

  /// The public keys of `tenant`'s signing keys.
  std::vector<std::string> webhook_public_keys(const std::string& tenant) const;

 private:
  friend class JobQueue;
  explicit Operations(detail::Pipeline& core) : core_(core) {}
  detail::Pipeline& core_;
};

}  // namespace rebound

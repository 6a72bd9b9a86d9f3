// Tenants: the owners of jobs. Each API key of rebound-server is a tenant; a job belongs to the
// tenant that submitted it (Job::tenant), ids are unique per tenant, and no tenant can name
// another's job: every call that takes a job takes its tenant too (JobRef). The default tenant
// (one, or no, API key) is the empty name. In a store a job's key is "<tenant>/<id>" (job_key);
// its tenant is kept as a field of its own.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "rebound/job.hpp"

namespace rebound {

/// Longest tenant name.
inline constexpr std::size_t max_tenant_name_length = 64;

/// A tenant name: 1 to 64 characters from `A-Z a-z 0-9 _ -` (it appears in store keys, webhook
/// ids and log lines).
inline bool is_valid_tenant_name(std::string_view name) {
  if (name.empty() || name.size() > max_tenant_name_length) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

/// The key of job `id` of `tenant` in a store: "tenant/id", or `id` for the default tenant "".
/// Job ids and tenant names never hold a '/', so a key names one job; what a store hands back
/// carries the tenant and the id as fields (Job::tenant, Job::id), never split from a key.
inline std::string job_key(std::string_view tenant, std::string_view id) {
  if (tenant.empty()) return std::string(id);
  std::string key;
  key.reserve(tenant.size() + 1 + id.size());
  key.append(tenant).append(1, '/').append(id);
  return key;
}

/// The store key of `job` (job_key of its tenant and id).
inline std::string key_of(const Job& job) {
  return job_key(job.tenant, job.id);
}

/// Names one job in the calls that take a job (JobQueue::find, cancel, redeliver, async_wait):
/// its id and its tenant. An id alone names the single tenant's job, so `queue.find("job-1")`
/// reads as before tenants; `queue.find({"job-1", "acme"})` names acme's.
struct JobRef {
  JobRef(std::string job_id, std::string job_tenant = {})  // NOLINT: an id converts
      : id(std::move(job_id)), tenant(std::move(job_tenant)) {}
  JobRef(const char* job_id) : id(job_id) {}  // NOLINT: an id converts
  std::string id;
  std::string tenant;
};

/// The store key of the job `ref` names.
inline std::string key_of(const JobRef& ref) {
  return job_key(ref.tenant, ref.id);
}

/// The id in a key of `tenant`'s job (what job_key added taken off again): for stores that keep
/// the key and the tenant, and not the id, as columns. The key as it is when it does not start
/// with "tenant/".
inline std::string_view id_in_key(std::string_view key, std::string_view tenant) {
  if (tenant.empty() || key.size() <= tenant.size() || key[tenant.size()] != '/' ||
      key.compare(0, tenant.size(), tenant) != 0)
    return key;
  return key.substr(tenant.size() + 1);
}

/// The `webhook-id` of a job's callback: "msg_<id>", or "msg_<tenant>.<id>" for a named tenant, so
/// that two tenants' jobs with one id never share it.
inline std::string webhook_id_of(const Job& job) {
  std::string out = "msg_";
  if (!job.tenant.empty()) out.append(job.tenant).append(1, '.');
  out.append(job.id);
  return out;
}

/// The name of an API key given as "NAME:KEY" or a bare "KEY" (its own name), as
/// rebound::Server reads ServerOptions::api_keys.
inline std::string_view key_name(std::string_view spec) {
  const auto colon = spec.find(':');
  return colon == std::string_view::npos ? spec : spec.substr(0, colon);
}

}  // namespace rebound

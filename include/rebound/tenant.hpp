// Tenants: the owners of jobs. Each API key of rebound-server is a tenant; a job belongs to the
// tenant that submitted it (Job::tenant), ids are unique per tenant, and no tenant can name
// another's job: every call that takes a job takes its tenant too (JobRef). The default tenant
// (one, or no, API key) is the empty name. In a store a job's key is "<tenant>/<id>" (job_key);
// its tenant is kept as a field of its own.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "rebound/error.hpp"
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

/// What the operator decides for one tenant (rebound-server: `--tenant NAME:weight=W,rate=R,
/// burst=B`; JobQueueOptions::tenant_defaults and ::tenants).
struct TenantOptions {
  /// Jobs the tenant takes in a row at its turn for the workers (at least 1). Tenants with jobs
  /// waiting take turns, so a job's priority orders only its own tenant's jobs; a weight of 3
  /// gives a tenant three jobs to another's one while both have jobs waiting.
  unsigned weight = 1;
  /// Jobs per second the tenant may submit, sustained (a token bucket, one token a job, also
  /// inside batches); beyond it its submissions are refused with errc::tenant_rate. Counted per
  /// server. 0: no limit.
  double rate = 0;
  /// Jobs the tenant may submit at once above its rate (the bucket's size, at least 1); 0: the
  /// rate's worth of one second (at least 1).
  double burst = 0;
};

/// Reads one tenant's settings as rebound-server's `--tenant` takes them:
/// "NAME:weight=W,rate=R,burst=B", any of the three, each at most once (weight: an integer from
/// 1 to 1000; rate: jobs per second, 0 to 1,000,000; burst: jobs, 0 or 1 to 1,000,000; see
/// TenantOptions). What the spec leaves out is as in `base` (rebound-server: the defaults of
/// --tenant-rate and --tenant-burst). Throws rebound::Error saying what is wrong.
inline std::pair<std::string, TenantOptions> parse_tenant_spec(std::string_view spec,
                                                               TenantOptions base = {}) {
  const auto fail = [&](const std::string& why) {
    return Error("--tenant '" + std::string(spec) + "': " + why +
                 " (expected NAME:weight=W,rate=R,burst=B)");
  };
  const auto colon = spec.find(':');
  if (colon == std::string_view::npos) throw fail("no settings after the name");
  std::pair<std::string, TenantOptions> out{std::string(spec.substr(0, colon)), base};
  if (!is_valid_tenant_name(out.first)) throw fail("not a tenant name");
  std::string_view rest = spec.substr(colon + 1);
  bool seen[3] = {false, false, false};
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) throw fail("'" + std::string(item) + "' is not NAME=VALUE");
    const std::string_view key = item.substr(0, eq);
    const std::string value(item.substr(eq + 1));
    const int which = key == "weight" ? 0 : key == "rate" ? 1 : key == "burst" ? 2 : -1;
    if (which < 0) throw fail("unknown setting '" + std::string(key) + "'");
    if (seen[which]) throw fail("'" + std::string(key) + "' given twice");
    seen[which] = true;
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size() || errno != 0 || !std::isfinite(v) ||
        v < 0 || v > 1e6) {
      throw fail(std::string(key) + " must be a number from 0 to 1000000");
    }
    if (which == 0) {
      if (v < 1 || v > 1000 || v != std::floor(v)) throw fail("weight must be from 1 to 1000");
      out.second.weight = static_cast<unsigned>(v);
    } else if (which == 1) {
      out.second.rate = v;
    } else {
      if (v > 0 && v < 1) throw fail("burst must be 0 (one second's worth) or at least 1");
      out.second.burst = v;
    }
  }
  if (!seen[0] && !seen[1] && !seen[2]) throw fail("no settings after the name");
  return out;
}

}  // namespace rebound

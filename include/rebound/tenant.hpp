// Tenants: the owners of jobs. Each API key of rebound-server is a tenant; a job belongs to the
// tenant that submitted it, and its key in the store is "<tenant>/<id>", so that ids are unique per
// tenant and no tenant can name another's job. The default tenant (one, or no, API key) is the
// empty name: its keys are the ids as they are.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

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

/// The key of job `id` of `tenant` in the store (and in every JobQueue call that takes an id):
/// "tenant/id", or `id` for the default tenant "". Job ids never hold a '/'.
inline std::string job_key(std::string_view tenant, std::string_view id) {
  if (tenant.empty()) return std::string(id);
  std::string key;
  key.reserve(tenant.size() + 1 + id.size());
  key.append(tenant).append(1, '/').append(id);
  return key;
}

/// The tenant of a job key ("" for the default tenant).
inline std::string_view tenant_of(std::string_view key) {
  const auto slash = key.rfind('/');
  return slash == std::string_view::npos ? std::string_view() : key.substr(0, slash);
}

/// The id its tenant gave the job: the key without its tenant. What polls, lists and callbacks
/// show.
inline std::string_view id_of(std::string_view key) {
  const auto slash = key.rfind('/');
  return slash == std::string_view::npos ? key : key.substr(slash + 1);
}

/// The `webhook-id` of a job's callback: "msg_<id>", or "msg_<tenant>.<id>" for a named tenant, so
/// that two tenants' jobs with one id never share it.
inline std::string webhook_id_of(std::string_view key) {
  const std::string_view tenant = tenant_of(key);
  std::string out = "msg_";
  if (!tenant.empty()) out.append(tenant).append(1, '.');
  out.append(id_of(key));
  return out;
}

/// The name of an API key given as "NAME:KEY" or a bare "KEY" (its own name), as
/// rebound::Server reads ServerOptions::api_keys.
inline std::string_view key_name(std::string_view spec) {
  const auto colon = spec.find(':');
  return colon == std::string_view::npos ? spec : spec.substr(0, colon);
}

}  // namespace rebound

// TenantRates: a token bucket per tenant, one token a submitted job, so that no tenant can submit
// faster than the operator allows (JobQueueOptions::tenant_defaults, ::tenants).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "rebound/job_queue_options.hpp"

namespace rebound::detail {

class TenantRates {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  TenantRates(TenantOptions defaults, std::map<std::string, TenantOptions, std::less<>> tenants)
      : defaults_(defaults), tenants_(std::move(tenants)) {
    limited_ = defaults_.rate > 0 || std::any_of(tenants_.begin(), tenants_.end(),
                                                 [](const auto& t) { return t.second.rate > 0; });
  }

  /// Takes a token of `tenant`'s bucket at `now`: false when it has none (the job is refused).
  /// A clock that steps back adds nothing for the step; the refill goes on from the new time.
  bool take(std::string_view tenant, TimePoint now) {
    if (!limited_) return true;
    const TenantOptions& o = options_of(tenant);
    if (o.rate <= 0) return true;
    const double burst = burst_of(o);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = buckets_.find(std::string(tenant));
    if (it == buckets_.end()) {
      // A full bucket is what a tenant not seen has: past the bound, the full ones go.
      if (buckets_.size() >= max_buckets) drop_full(now);
      if (buckets_.size() >= max_buckets) {  // all busy: the one idle longest starts again
        buckets_.erase(std::min_element(buckets_.begin(), buckets_.end(), [](auto& a, auto& b) {
          return a.second.at < b.second.at;
        }));
      }
      it = buckets_.emplace(std::string(tenant), Bucket{burst, now}).first;
    }
    Bucket& b = it->second;
    // A clock stepped back restarts the refill from the new time: nothing is added for the step,
    // and the bucket does not wait for the old time to come round again.
    if (now > b.at) {
      b.tokens =
          std::min(burst, b.tokens + o.rate * std::chrono::duration<double>(now - b.at).count());
    }
    b.at = now;
    if (b.tokens < 1.0) return false;
    b.tokens -= 1.0;
    return true;
  }

  /// Returns the token a job took and did not use (refused for another reason).
  void give_back(std::string_view tenant) {
    if (!limited_) return;
    const TenantOptions& o = options_of(tenant);
    if (o.rate <= 0) return;
    const double burst = burst_of(o);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = buckets_.find(std::string(tenant));
    if (it != buckets_.end()) it->second.tokens = std::min(burst, it->second.tokens + 1.0);
  }

 private:
  static constexpr std::size_t max_buckets = 4096;
  struct Bucket {
    double tokens;
    TimePoint at;
  };

  // At least one job, so that a bucket always fills to one.
  static double burst_of(const TenantOptions& o) {
    return std::max(o.burst > 0 ? o.burst : o.rate, 1.0);
  }

  const TenantOptions& options_of(std::string_view tenant) const {
    const auto it = tenants_.find(tenant);
    return it == tenants_.end() ? defaults_ : it->second;
  }

  void drop_full(TimePoint now) {
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      const TenantOptions& o = options_of(it->first);
      const double burst = burst_of(o);
      const double seconds =
          now > it->second.at ? std::chrono::duration<double>(now - it->second.at).count() : 0;
      const bool full = it->second.tokens + o.rate * seconds >= burst;
      it = full ? buckets_.erase(it) : std::next(it);
    }
  }

  const TenantOptions defaults_;
  const std::map<std::string, TenantOptions, std::less<>> tenants_;
  bool limited_ = false;
  std::mutex mutex_;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace rebound::detail

// Claim: what a piece of work in memory holds, a capacity slot and (for stored work) the lease on
// it, as one move-only object that gives both back when it goes, on every path.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "admission.hpp"
#include "leases.hpp"
#include "store_access.hpp"

namespace rebound::detail {

/// A capacity slot, and while `holds_lease()` the lease `holder` has on the stored work `id`,
/// renewed by Leases until the claim lets it go. Destroying it (or `release`) stops renewing the
/// lease and frees the slot: the lease then runs out in the store unless the work was
/// acknowledged. Move-only; not thread-safe itself (one owner at a time).
class Claim {
 public:
  Claim() = default;

  /// A slot taken with Admission::admit or take_slot (for `tenant`, charged with `bytes`), without
  /// a lease yet.
  static Claim slot(Admission& admission, std::string_view tenant = {}, std::size_t bytes = 0) {
    Claim c;
    c.admission_ = &admission;
    c.tenant_ = std::string(tenant);
    c.bytes_ = bytes;
    return c;
  }

  Claim(Claim&& other) noexcept { *this = std::move(other); }
  Claim& operator=(Claim&& other) noexcept {
    if (this != &other) {
      release();
      admission_ = std::exchange(other.admission_, nullptr);
      leases_ = std::exchange(other.leases_, nullptr);
      id_ = std::move(other.id_);
      holder_ = std::move(other.holder_);
      tenant_ = std::move(other.tenant_);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;
  ~Claim() { release(); }

  explicit operator bool() const { return admission_ != nullptr; }
  bool holds_lease() const { return leases_ != nullptr; }
  const std::string& holder() const { return holder_; }

  /// Keeps this claim's slot for another lease (a job's callback after the job): the lease held
  /// so far, if any, is let go.
  void take_lease(Leases& leases, std::string id, std::string holder, bool is_job = true) {
    drop_lease();
    leases.hold(id, holder, is_job);
    leases_ = &leases;
    id_ = std::move(id);
    holder_ = std::move(holder);
  }

  /// The leased work ended here (acknowledged, or taken over): stop renewing it; keep the slot.
  void drop_lease() {
    if (leases_) std::exchange(leases_, nullptr)->unhold(id_, holder_);
  }

  /// What the slot's work holds in memory from now on (Admission::charge): a job read from the
  /// store, a callback's body instead of the job's input.
  void charge(std::size_t bytes) {
    if (!admission_) return;
    admission_->charge(bytes_, bytes);
    bytes_ = bytes;
  }

  /// Ends the lease in the store now, so that another claim may take the work at once, then
  /// frees the slot.
  void hand_back(StoreAccess& store, const char* during) {
    if (leases_) std::exchange(leases_, nullptr)->hand_back(store, during, id_, holder_);
    release();
  }

  /// Keeps the slot taken for a job left in the store unclaimed (Admission::park): no lease, no
  /// bytes. The pump's claim of the job takes the slot back (Admission::unpark).
  void park(int priority) {
    drop_lease();
    if (admission_) std::exchange(admission_, nullptr)->park(std::exchange(bytes_, 0), priority);
  }

  /// Lets the lease go and frees the slot. Safe to call more than once.
  void release() {
    drop_lease();
    if (admission_) std::exchange(admission_, nullptr)->release(tenant_, std::exchange(bytes_, 0));
  }

 private:
  Admission* admission_ = nullptr;
  Leases* leases_ = nullptr;
  std::string id_;
  std::string holder_;
  std::string tenant_;     // whose slot it is
  std::size_t bytes_ = 0;  // what it is charged with
};

}  // namespace rebound::detail

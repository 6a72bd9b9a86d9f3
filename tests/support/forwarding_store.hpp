// ForwardingStore: a JobStore that passes every call of the lease protocol and the reads the
// queue makes to another store, which several of them may share: one store for several queues, as
// the servers of a fleet share one Redis. Tests derive from it to change one call (a partition, a
// store that forgets); what it does not forward answers as JobStore's defaults do.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rebound/store/job_store.hpp"

namespace rebound::test {

class ForwardingStore : public JobStore {
 public:
  using TimePoint = JobStore::TimePoint;

  explicit ForwardingStore(std::shared_ptr<JobStore> inner) : inner_(std::move(inner)) {}

  using JobStore::put;
  PutOutcome put(const Job& job, const std::optional<Lease>& claim) override {
    return inner_->put(job, claim);
  }
  std::optional<JobRecord> get(const std::string& id) const override { return inner_->get(id); }
  std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now) override {
    return inner_->claim_jobs(max, lease, now);
  }
  bool renew(const std::string& id, const Lease& lease, TimePoint now) override {
    return inner_->renew(id, lease, now);
  }
  void mark_running(const std::string& id, TimePoint now) override {
    inner_->mark_running(id, now);
  }
  bool finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                  const std::optional<Lease>& deliver, TimePoint now) override {
    return inner_->finish_job(id, holder, outcome, deliver, now);
  }
  CancelOutcome cancel(const std::string& id, const JobOutcome& outcome, TimePoint now) override {
    return inner_->cancel(id, outcome, now);
  }
  std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease,
                                         TimePoint now) override {
    return inner_->claim_callbacks(max, lease, now);
  }
  using JobStore::record_attempt;
  bool record_attempt(const std::string& id, const std::string& holder, const CallbackInfo& after,
                      TimePoint now, const std::optional<CallbackAttempt>& attempt) override {
    return inner_->record_attempt(id, holder, after, now, attempt);
  }
  RedeliverOutcome redeliver(const std::string& id, const Lease& claim, TimePoint now) override {
    return inner_->redeliver(id, claim, now);
  }
  void complete(const std::string& id, const JobOutcome& outcome) override {
    inner_->complete(id, outcome);
  }
  void update_callback(const std::string& id, const CallbackInfo& callback) override {
    inner_->update_callback(id, callback);
  }
  std::vector<JobRecord> list_failed_callbacks(std::size_t limit) const override {
    return inner_->list_failed_callbacks(limit);
  }
  std::vector<JobRecord> list_unfinished(std::size_t limit) const override {
    return inner_->list_unfinished(limit);
  }

 protected:
  std::shared_ptr<JobStore> inner_;
};

}  // namespace rebound::test

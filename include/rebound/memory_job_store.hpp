// MemoryJobStore: a JobStore in process memory, bounded by the number of finished jobs it keeps.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rebound/error.hpp"
#include "rebound/job_store.hpp"

namespace rebound {

/// A JobStore that keeps everything in memory: fast, and lost when the process ends.
///
/// Memory stays bounded: once more than `max_finished` jobs are finished (final, and their callback
/// delivered, given up or not wanted), the oldest finished ones are forgotten, and polling them
/// answers 404. Unfinished jobs are never dropped; the JobQueue's capacity bounds them.
///
/// Thread-safety: all methods are thread-safe (one mutex; no user code runs under it).
class MemoryJobStore final : public JobStore {
 public:
  explicit MemoryJobStore(std::size_t max_finished = 100000) : max_finished_(max_finished) {
    if (max_finished == 0) throw Error("MemoryJobStore: max_finished must be at least 1");
  }

  PutOutcome put(const Job& job) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = jobs_.try_emplace(job.id);
    if (!inserted) {
      return it->second.job.same_request_as(job) ? PutOutcome::duplicate : PutOutcome::conflict;
    }
    it->second.job = job;
    it->second.status = JobStatus::queued;
    return PutOutcome::created;
  }

  std::optional<JobRecord> get(const std::string& id) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return std::nullopt;
    return it->second;
  }

  void mark_running(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it != jobs_.end() && it->second.status == JobStatus::queued) {
      it->second.status = JobStatus::running;
    }
  }

  void complete(const std::string& id, const JobOutcome& outcome) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    it->second.status = outcome.status;
    it->second.outcome = outcome;
    note_if_finished(it->first, it->second);
  }

  void update_callback(const std::string& id, const CallbackInfo& callback) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    it->second.callback = callback;
    note_if_finished(it->first, it->second);
  }

  std::vector<JobRecord> list_unfinished(std::size_t limit) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<JobRecord> out;
    for (const auto& [id, record] : jobs_) {
      if (!is_finished(record)) out.push_back(record);
    }
    std::sort(out.begin(), out.end(), [](const JobRecord& a, const JobRecord& b) {
      return a.job.created_at < b.job.created_at;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
  }

  std::vector<JobRecord> list_failed_callbacks(std::size_t limit) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<JobRecord> out;
    for (const auto& [id, record] : jobs_) {
      if (record.callback.state == CallbackState::failed) out.push_back(record);
    }
    std::sort(out.begin(), out.end(), [](const JobRecord& a, const JobRecord& b) {
      return a.job.created_at > b.job.created_at;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
  }

  /// Jobs held now, finished or not.
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return jobs_.size();
  }

 private:
  static bool is_finished(const JobRecord& record) {
    if (!is_final(record.status)) return false;
    if (record.job.callback_url.empty()) return true;
    return record.callback.state == CallbackState::delivered ||
           record.callback.state == CallbackState::failed;
  }

  // Called under mutex_. Entries can go stale (a job redelivered after it finished, or noted
  // twice); eviction skips those, so the deque holds at most one entry per finish event.
  void note_if_finished(const std::string& id, const JobRecord& record) {
    if (!is_finished(record)) return;
    finished_order_.push_back(id);
    while (finished_order_.size() > max_finished_) {
      auto victim = jobs_.find(finished_order_.front());
      finished_order_.pop_front();
      if (victim != jobs_.end() && is_finished(victim->second)) jobs_.erase(victim);
    }
  }

  std::size_t max_finished_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, JobRecord> jobs_;
  std::deque<std::string> finished_order_;
};

}  // namespace rebound

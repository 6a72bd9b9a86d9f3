// The batch runner: the worker step. A batch from the queue goes through the model (under a
// watchdog when there is an inference timeout); each job's outcome is acknowledged to the store
// and its callback handed to delivery; each invocation is answered.
#pragma once

#include <cassert>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <nlohmann/json.hpp>

#include "admission.hpp"
#include "delivery.hpp"
#include "leases.hpp"
#include "observers.hpp"
#include "rebound/model.hpp"
#include "rebound/service.hpp"
#include "store_access.hpp"
#include "work_item.hpp"

namespace rebound::detail {

/// `run` is called by the queue's workers, on the inference executor, never under a lock; the
/// watchdog runs on `timer_executor`. `owner` (the Service's core) is kept alive by the work in
/// flight (a watchdog, a write being retried).
class BatchRunner {
 public:
  BatchRunner(Model& model, StoreAccess& store, Leases& leases, Delivery& delivery,
              Admission& admission, Observers& observe, Clock clock,
              boost::asio::any_io_executor timer_executor, std::chrono::milliseconds job_ttl,
              std::chrono::milliseconds inference_timeout)
      : model_(model), store_(store), leases_(leases), delivery_(delivery), admission_(admission),
        observe_(observe), clock_(std::move(clock)), timer_executor_(std::move(timer_executor)),
        job_ttl_(job_ttl), inference_timeout_(inference_timeout) {}

  void set_owner(std::weak_ptr<const void> owner) { owner_ = std::move(owner); }

  /// The worker step for one batch.
  void run(std::vector<Service::WorkItem> batch);

  /// batches, items and the largest batch so far (`resumed` is the pump's).
  BatchStats stats() const;

 private:
  // Runs the model on a batch. Never throws: a model that throws, or returns the wrong number of
  // predictions, fails every item of the batch with model_error.
  std::vector<Prediction> predict(std::vector<nlohmann::json>& inputs);

  // Answers one item with its prediction: an invocation's handler, or a job's outcome.
  // inference_ms < 0: the model never answered (a timeout).
  void settle(Service::WorkItem& item, Prediction& prediction, std::size_t batch_size,
              double inference_ms);

  // Acknowledges a final outcome to the store and starts its callback (or frees the slot when
  // none is wanted, or when the lease was lost: another claim has the job).
  void finish(const JobRecord& record, const std::string& holder);

  Model& model_;
  StoreAccess& store_;
  Leases& leases_;
  Delivery& delivery_;
  Admission& admission_;
  Observers& observe_;
  const Clock clock_;
  boost::asio::any_io_executor timer_executor_;
  const std::chrono::milliseconds job_ttl_;
  const std::chrono::milliseconds inference_timeout_;
  // What async work holds to keep the parts alive; set_owner comes before any work.
  std::shared_ptr<const void> owner() const {
    auto keep = owner_.lock();
    assert(keep);
    return keep;
  }
  std::weak_ptr<const void> owner_;
  mutable std::mutex stats_mutex_;
  BatchStats stats_;
};

}  // namespace rebound::detail

// The model backend interface, and the two built-in models (echo and sleep) for demos and benches.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "rebound/error.hpp"
#include "rebound/job.hpp"

namespace rebound {

/// The result of one inference: the model's output, or an error that says why there is none.
///
/// A model returns `Prediction::failure` for input it cannot use (`code` such as "invalid_input");
/// the job then ends `failed` with that code and message, and the caller sees them.
class Prediction {
 public:
  static Prediction success(nlohmann::json output) {
    Prediction p;
    p.output_ = std::move(output);
    return p;
  }
  static Prediction failure(std::string code, std::string message) {
    Prediction p;
    p.error_ = ErrorInfo{std::move(code), std::move(message)};
    return p;
  }

  bool ok() const { return !error_.has_value(); }
  const nlohmann::json& output() const { return output_; }
  nlohmann::json& output() { return output_; }
  /// Precondition: `!ok()`.
  const ErrorInfo& error() const { return *error_; }

 private:
  Prediction() = default;
  nlohmann::json output_;
  std::optional<ErrorInfo> error_;
};

/// How a model would like concurrent requests grouped (see JobQueueOptions). A server's own
/// settings (flags) override it.
struct BatchingPreference {
  std::size_t max_batch_size = 1;                ///< 1: no batching
  std::chrono::microseconds max_queue_delay{0};  ///< longest wait for a batch to fill
};

/// True while the model call running on this thread serves only jobs that were cancelled
/// (`DELETE /v1/inferences/{id}`, `JobQueue::cancel`), taken over by another server, past their
/// inference timeout or given up by a stopping server (`JobQueue::abandon_running`): their
/// results will be discarded, so a long `predict` may poll this and return early (any
/// Prediction; it is thrown away). For a batch, true once every job in it is cancelled; never for
/// a batch with an invocation. False outside a model call. Cheap and thread-safe.
///
/// Example:
///   for (int step = 0; step < steps; ++step) {
///     if (rebound::cancellation_requested()) return rebound::Prediction::failure("cancelled", "");
///     ...
///   }
bool cancellation_requested() noexcept;

/// A model name: 1 to 64 characters from `a-z 0-9 . _ -`, the first a letter or a digit (safe as
/// one path segment of a model repository: never "." or "..", never a '/'). A submission may
/// name a model (Job::model) only by such a name; rebound-server warns at start when its model's
/// `name()` is not one.
inline bool is_valid_model_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
  }
  return true;
}

/// A model version: a positive integer's decimal text, 1 to 18 digits, no leading zero ("1",
/// "12"); versions are ordered as the numbers they write.
inline bool is_valid_model_version(std::string_view version) {
  if (version.empty() || version.size() > 18 || version[0] == '0') return false;
  for (const char c : version)
    if (c < '0' || c > '9') return false;
  return true;
}

/// An inference backend. Derive from it to serve your own model.
///
/// Contract:
/// - `predict` and `predict_batch` are called from JobQueue worker threads, concurrently, up to
///   the worker count at once: implementations must be thread-safe (or serialise internally).
/// - A long call may poll `rebound::cancellation_requested()` and stop early when it is true.
/// - The model never owns its inputs: they stay owned by the caller for the duration of the call.
///   The returned Prediction is owned by the caller.
/// - Bad input is reported as `Prediction::failure`, not by throwing. Anything a model does throw
///   is caught at this boundary and the job ends `failed` with code "model_error"; the worker
///   carries on.
/// - `ready()` is polled by `GET /ping` and by every submission; it must be cheap and never block.
/// - `validate()` runs inside every `JobQueue::submit`, `async_submit` and `invoke`, on the
///   submitting thread, before anything is stored, so that bad input is refused at once (HTTP 422,
///   rebound::errc::invalid_input). An exception it throws refuses the input too. `predict` must
///   still cope with any input: jobs taken over from a store were validated by another build.
class Model {
 public:
  virtual ~Model() = default;

  /// A short name for logs and metrics, e.g. "echo": constant, and a model name
  /// (is_valid_model_name), for every job's `model` names it and a submission may ask for it.
  virtual std::string name() const = 0;

  /// True once the model can take work. Submissions are refused with 503 `not_ready` until then,
  /// and a JobQueue claims no job from its store for it (a job another run or server left there
  /// waits until the model can run it).
  virtual bool ready() const { return true; }
  /// Called once by the JobQueue when the model is first ready, before the queue takes a
  /// submission or runs a job: a backend runs a few inferences here so that the first jobs do not
  /// pay for lazy initialisation (TorchScript optimises a graph on its first calls, CUDA loads its
  /// kernels). Until it returns the queue is not ready (`/ping` 503). A model ready when the queue
  /// is built is warmed up in the queue's constructor, one that gets ready later on a thread of
  /// its own. What it throws is logged (`model_warm_up_failed`) and the model serves all the
  /// same. The default does nothing.
  virtual void warm_up() {}

  /// What the model holds in memory once loaded, in bytes, for a queue's memory budget
  /// (ModelRepository::set_memory_budget, rebound-server's `--model-memory-mib`): asked once,
  /// after the load. 0 (the default): not known, and the repository's estimate stands (for
  /// make_model_repository, the size of the version's files).
  virtual std::size_t memory_bytes() const { return 0; }

  /// Checks an input without running the model: nullopt when usable, else why not
  /// (code "invalid_input" and a sentence). Cheap and thread-safe. The default accepts anything.
  virtual std::optional<ErrorInfo> validate(const nlohmann::json& /*input*/) const {
    return std::nullopt;
  }

  /// How this model would like to be batched; the default is no batching.
  virtual BatchingPreference batching() const { return {}; }

  /// Runs one inference.
  virtual Prediction predict(const nlohmann::json& input) = 0;

  /// Runs several inferences at once; returns exactly one Prediction per input, in order.
  /// The default calls `predict` for each input; batching backends override it.
  virtual std::vector<Prediction> predict_batch(const std::vector<nlohmann::json>& inputs) {
    std::vector<Prediction> out;
    out.reserve(inputs.size());
    for (const auto& input : inputs)
      out.push_back(predict(input));
    return out;
  }
};

/// Returns its input unchanged. Thread-safe.
class EchoModel final : public Model {
 public:
  std::string name() const override { return "echo"; }
  Prediction predict(const nlohmann::json& input) override { return Prediction::success(input); }
};

/// The seed's "heavy work": waits a fixed time, then answers "OK". Thread-safe.
/// The wait occupies the worker thread, as a real model's computation would, and ends early when
/// its job is cancelled or given up (`rebound::cancellation_requested()`).
class SleepModel final : public Model {
 public:
  explicit SleepModel(std::chrono::microseconds duration) : duration_(duration) {
    if (duration.count() < 0) throw Error("sleep model: duration must not be negative");
  }
  std::string name() const override { return "sleep"; }
  Prediction predict(const nlohmann::json&) override {
    // In steps of at most 10 ms, so that a cancelled or given-up job (a stopping server) ends
    // within one.
    const auto end = std::chrono::steady_clock::now() + duration_;
    for (auto now = std::chrono::steady_clock::now(); now < end;
         now = std::chrono::steady_clock::now()) {
      if (cancellation_requested())
        return Prediction::failure("cancelled", "the job was cancelled");
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(end - now, std::chrono::milliseconds(10)));
    }
    return Prediction::success("OK");
  }
  std::chrono::microseconds duration() const { return duration_; }

 private:
  std::chrono::microseconds duration_;
};

/// Makes a built-in model from a spec: "echo", or "sleep:<seconds>" (e.g. "sleep:5", "sleep:0.25").
/// Throws rebound::Error for any other spec, with a message that lists the accepted ones.
inline std::unique_ptr<Model> make_builtin_model(std::string_view spec) {
  if (spec == "echo") return std::make_unique<EchoModel>();
  constexpr std::string_view sleep_prefix = "sleep:";
  if (spec.substr(0, sleep_prefix.size()) == sleep_prefix) {
    const std::string seconds(spec.substr(sleep_prefix.size()));
    std::size_t used = 0;
    double value = -1;
    try {
      value = std::stod(seconds, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != seconds.size() || seconds.empty() || !(value >= 0) || value > 86400) {
      throw Error("model spec '" + std::string(spec) +
                  "': sleep needs seconds between 0 and 86400, e.g. sleep:5");
    }
    return std::make_unique<SleepModel>(
        std::chrono::microseconds(static_cast<long long>(value * 1e6)));
  }
  throw Error("unknown model spec '" + std::string(spec) + "': expected echo or sleep:<seconds>");
}

}  // namespace rebound

// TorchScriptModel: serves a TorchScript model.pt with libtorch (target rebound::torch).
// This header does not include libtorch: only src/torch/torchscript_model.cpp does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rebound/model.hpp"

namespace rebound {

/// What `<dir>/config.json` may say (every field optional):
/// ```json
/// {"name": "iris", "labels": ["setosa", "versicolor", "virginica"], "input_shape": [4],
///  "batching": {"max_batch_size": 32, "max_queue_delay_ms": 2}}
/// ```
struct TorchScriptModelConfig {
  std::string name = "torchscript";
  /// Class names: when the output per sample is a vector of this length, the answer also carries
  /// "label", the name at the argmax.
  std::vector<std::string> labels;
  /// The shape of one sample; empty: any shape (samples of the same shape are batched together).
  std::vector<std::int64_t> input_shape;
  BatchingPreference batching;
};

/// A Model backed by a TorchScript module on the CPU.
///
/// Input: a sample as (nested) arrays of numbers of `input_shape`, e.g. `[5.1, 3.5, 1.4, 0.2]`;
/// or several samples, one dimension more, e.g. `[[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]`.
/// Output: `{"scores": [...], "label": "setosa"}` for a sample (`label` only with labels), and
/// `{"predictions": [{...}, ...]}` for several. Samples of concurrent requests are stacked into
/// one forward pass by `predict_batch`.
///
/// Bad input (not numbers, ragged, wrong shape) is reported by `validate` and as
/// `Prediction::failure("invalid_input", ...)`; libtorch exceptions stop here and become
/// `model_error` failures. Thread-safety: predict and predict_batch may run concurrently.
class TorchScriptModel final : public Model {
 public:
  /// Loads `<directory>/model.pt` and the optional `<directory>/config.json`.
  /// Throws rebound::Error, with the path and the reason, when either cannot be used.
  explicit TorchScriptModel(const std::string& directory);
  ~TorchScriptModel() override;

  std::string name() const override;
  std::optional<ErrorInfo> validate(const nlohmann::json& input) const override;
  BatchingPreference batching() const override;
  /// With an `input_shape`: runs the module on zeros of it, one sample and a full batch
  /// (`max_batch_size`, at most 16 MiB of zeros), three times each, so that libtorch's profiling
  /// executor has optimised the graph before the first job. Throws rebound::Error when the module
  /// refuses them (the queue logs it and serves all the same). Without an `input_shape` there is
  /// nothing to run.
  void warm_up() override;
  Prediction predict(const nlohmann::json& input) override;
  std::vector<Prediction> predict_batch(const std::vector<nlohmann::json>& inputs) override;

  const TorchScriptModelConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Reads a config.json as TorchScriptModel does. Throws rebound::Error on a bad file.
TorchScriptModelConfig load_torchscript_config(const std::string& path);

}  // namespace rebound

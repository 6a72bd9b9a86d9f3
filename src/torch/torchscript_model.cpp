// TorchScriptModel: JSON to tensors, stacked forward passes, tensors back to JSON. The only
// translation unit of rebound that includes libtorch.
#include "rebound/torch/torchscript_model.hpp"

#include <torch/script.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "rebound/error.hpp"

namespace rebound {
namespace {

constexpr std::size_t max_elements = 1 << 24;  // 16M floats (64 MiB) per input, at most

// An input turned into numbers: its shape and its values in row-major order.
struct Parsed {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Walks nested arrays of numbers; returns why not when the input is not a rectangular array.
std::optional<std::string> parse_numbers(const nlohmann::json& j, std::size_t depth, Parsed& out) {
  if (j.is_number()) {
    if (depth != out.shape.size()) return "is ragged (a number where an array was expected)";
    if (out.values.size() >= max_elements) return "has more than 16,777,216 numbers";
    out.values.push_back(j.get<float>());
    return std::nullopt;
  }
  if (!j.is_array()) return "must be an array of numbers (or nested arrays)";
  if (j.empty()) return "must not contain empty arrays";
  if (depth > 8) return "is nested more than 8 deep";
  if (depth == out.shape.size()) {
    if (!out.values.empty()) return "is ragged (an array where a number was expected)";
    out.shape.push_back(static_cast<std::int64_t>(j.size()));
  } else if (out.shape[depth] != static_cast<std::int64_t>(j.size())) {
    return "is ragged (rows of different lengths)";
  }
  for (const auto& element : j) {
    if (auto why = parse_numbers(element, depth + 1, out)) return why;
  }
  return std::nullopt;
}

nlohmann::json tensor_to_json(const torch::Tensor& t) {
  if (t.dim() == 0) return t.item<float>();
  nlohmann::json out = nlohmann::json::array();
  for (std::int64_t i = 0; i < t.size(0); ++i)
    out.push_back(tensor_to_json(t[i]));
  return out;
}

}  // namespace

TorchScriptModelConfig load_torchscript_config(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw Error("cannot read " + path);
  nlohmann::json j = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw Error(path + " is not a JSON object");
  TorchScriptModelConfig config;
  try {
    if (j.contains("name")) config.name = j.at("name").get<std::string>();
    if (j.contains("labels")) config.labels = j.at("labels").get<std::vector<std::string>>();
    if (j.contains("input_shape")) {
      config.input_shape = j.at("input_shape").get<std::vector<std::int64_t>>();
      for (auto d : config.input_shape) {
        if (d < 1) throw Error(path + ": input_shape dimensions must be positive");
      }
    }
    if (j.contains("batching")) {
      const auto& b = j.at("batching");
      const auto size = b.value("max_batch_size", 1);
      const auto delay_ms = b.value("max_queue_delay_ms", 0.0);
      if (size < 1 || size > 65536) throw Error(path + ": max_batch_size must be 1..65536");
      if (delay_ms < 0 || delay_ms > 60000)
        throw Error(path + ": max_queue_delay_ms must be 0..60000");
      config.batching.max_batch_size = static_cast<std::size_t>(size);
      config.batching.max_queue_delay =
          std::chrono::microseconds(static_cast<long long>(delay_ms * 1000));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": " + e.what());
  }
  return config;
}

struct TorchScriptModel::Impl {
  TorchScriptModelConfig config;
  torch::jit::Module module;

  // How many samples an input holds (1 for one sample), or why it cannot be used.
  std::optional<std::string> check(const Parsed& p, std::int64_t& samples) const {
    const auto& want = config.input_shape;
    if (want.empty()) {
      samples = 1;
      return std::nullopt;
    }
    if (p.shape == want) {
      samples = 1;
      return std::nullopt;
    }
    if (p.shape.size() == want.size() + 1 &&
        std::equal(want.begin(), want.end(), p.shape.begin() + 1)) {
      samples = p.shape[0];
      return std::nullopt;
    }
    return "has shape " + shape_text(p.shape) + "; expected " + shape_text(want) + " or [n, " +
           shape_text(want).substr(1);
  }

  nlohmann::json answer_for(const torch::Tensor& row) const {
    nlohmann::json out = {{"scores", tensor_to_json(row)}};
    if (!config.labels.empty() && row.dim() == 1 &&
        row.size(0) == static_cast<std::int64_t>(config.labels.size())) {
      out["label"] = config.labels[static_cast<std::size_t>(row.argmax().item<std::int64_t>())];
    }
    return out;
  }
};

TorchScriptModel::TorchScriptModel(const std::string& directory) : impl_(std::make_unique<Impl>()) {
  namespace fs = std::filesystem;
  const fs::path dir(directory);
  const fs::path model_path = dir / "model.pt";
  if (!fs::is_directory(dir)) throw Error("model directory " + directory + " does not exist");
  if (!fs::is_regular_file(model_path)) {
    throw Error("no model.pt in " + directory + " (a TorchScript file made by torch.jit.save)");
  }
  if (fs::exists(dir / "config.json"))
    impl_->config = load_torchscript_config((dir / "config.json").string());
  try {
    impl_->module = torch::jit::load(model_path.string(), torch::kCPU);
    impl_->module.eval();
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw Error("cannot load " + model_path.string() + ": " + what.substr(0, what.find('\n')));
  }
}

TorchScriptModel::~TorchScriptModel() = default;

std::string TorchScriptModel::name() const {
  return impl_->config.name;
}

BatchingPreference TorchScriptModel::batching() const {
  return impl_->config.batching;
}

void TorchScriptModel::warm_up() {
  const auto& shape = impl_->config.input_shape;
  if (shape.empty()) return;
  // One sample and a full batch (the executor specialises the graph to the shapes it meets),
  // the batch of at most 16 MiB of zeros.
  std::int64_t per_sample = 1;
  for (const std::int64_t d : shape)
    per_sample *= std::max<std::int64_t>(d, 1);
  const std::int64_t most_rows = std::max<std::int64_t>(
      1, static_cast<std::int64_t>((std::size_t{16} << 20) / sizeof(float)) / per_sample);
  std::vector<std::int64_t> sizes{1};
  const auto batch = static_cast<std::int64_t>(impl_->config.batching.max_batch_size);
  if (batch > 1 && most_rows > 1) sizes.push_back(std::min(batch, most_rows));
  for (const std::int64_t rows : sizes) {
    std::vector<std::int64_t> dims{rows};
    dims.insert(dims.end(), shape.begin(), shape.end());
    try {
      c10::InferenceMode guard;
      const torch::Tensor zeros = torch::zeros(dims, torch::kFloat32);
      for (int run = 0; run < 3; ++run)
        impl_->module.forward({zeros});
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw Error("the warm-up batch of shape " + shape_text(dims) +
                  " failed: " + what.substr(0, what.find('\n')));
    }
  }
}

const TorchScriptModelConfig& TorchScriptModel::config() const {
  return impl_->config;
}

std::optional<ErrorInfo> TorchScriptModel::validate(const nlohmann::json& input) const {
  Parsed parsed;
  if (auto why = parse_numbers(input, 0, parsed)) return ErrorInfo{"invalid_input", *why};
  std::int64_t samples = 0;
  if (auto why = impl_->check(parsed, samples)) return ErrorInfo{"invalid_input", *why};
  return std::nullopt;
}

Prediction TorchScriptModel::predict(const nlohmann::json& input) {
  return std::move(predict_batch({input}).front());
}

std::vector<Prediction> TorchScriptModel::predict_batch(const std::vector<nlohmann::json>& inputs) {
  std::vector<Prediction> out(inputs.size(), Prediction::failure("model_error", "not run"));
  // Inputs whose samples share a shape go through one forward pass together.
  struct Member {
    std::size_t index;     // into inputs
    std::int64_t first;    // first row in the stacked tensor
    std::int64_t samples;  // rows it contributes
    bool several;          // it sent [n, ...shape]
  };
  struct Group {
    std::vector<float> values;
    std::int64_t rows = 0;
    std::vector<Member> members;
  };
  std::map<std::vector<std::int64_t>, Group> groups;  // by sample shape
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Parsed parsed;
    std::int64_t samples = 0;
    std::optional<std::string> why = parse_numbers(inputs[i], 0, parsed);
    if (!why) why = impl_->check(parsed, samples);
    if (why) {
      out[i] = Prediction::failure("invalid_input", "The input " + *why + ".");
      continue;
    }
    const bool several = !impl_->config.input_shape.empty() &&
                         parsed.shape.size() == impl_->config.input_shape.size() + 1;
    std::vector<std::int64_t> sample_shape =
        several ? std::vector<std::int64_t>(parsed.shape.begin() + 1, parsed.shape.end())
                : parsed.shape;
    Group& group = groups[sample_shape];
    group.members.push_back({i, group.rows, samples, several});
    group.rows += samples;
    group.values.insert(group.values.end(), parsed.values.begin(), parsed.values.end());
  }

  for (auto& [shape, group] : groups) {
    try {
      std::vector<std::int64_t> dims{group.rows};
      dims.insert(dims.end(), shape.begin(), shape.end());
      const torch::Tensor batch = torch::from_blob(group.values.data(), dims, torch::kFloat32);
      torch::Tensor result;
      {
        c10::InferenceMode guard;
        result =
            impl_->module.forward({batch}).toTensor().to(torch::kCPU, torch::kFloat32).contiguous();
      }
      if (result.dim() == 0 || result.size(0) != group.rows) {
        throw std::runtime_error("the model returned " +
                                 std::to_string(result.dim() ? result.size(0) : 0) + " rows for " +
                                 std::to_string(group.rows) + " samples");
      }
      for (const Member& m : group.members) {
        if (!m.several) {
          out[m.index] = Prediction::success(impl_->answer_for(result[m.first]));
          continue;
        }
        nlohmann::json predictions = nlohmann::json::array();
        for (std::int64_t r = 0; r < m.samples; ++r)
          predictions.push_back(impl_->answer_for(result[m.first + r]));
        out[m.index] = Prediction::success({{"predictions", std::move(predictions)}});
      }
    } catch (const std::exception& e) {
      // libtorch's errors (c10::Error) stop at this boundary.
      std::string what = e.what();
      const auto failure = Prediction::failure(
          "model_error", "inference failed: " + what.substr(0, what.find('\n')));
      for (const Member& m : group.members)
        out[m.index] = failure;
    }
  }
  return out;
}

}  // namespace rebound

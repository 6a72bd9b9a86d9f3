// make_model: a Model from a spec ("echo", "sleep:S", or a model directory), as rebound-server's
// --model takes it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "rebound/error.hpp"
#include "rebound/model.hpp"
// A model directory needs rebound::torch, which defines REBOUND_HAS_TORCH for its users.
#if defined(REBOUND_HAS_TORCH)
#include "rebound/torch/torchscript_model.hpp"
#endif

namespace rebound {

// With rebound::torch or without, make_model is a function of its own (an inline namespace), so
// that two parts of one program built with different rebound targets never share one definition.
#if defined(REBOUND_HAS_TORCH)
#define REBOUND_DETAIL_MODELS models_torch
#else
#define REBOUND_DETAIL_MODELS models_builtin
#endif
inline namespace REBOUND_DETAIL_MODELS {

/// Makes a Model from a spec:
/// - `echo`: answers its input; `sleep:<seconds>`: waits, then answers "OK" (the seed's model);
/// - anything else is a model directory (TorchScript `model.pt` and an optional `config.json`),
///   loaded by TorchScriptModel when the program links rebound::torch.
/// Throws rebound::Error with a clear message for a bad spec, a directory without rebound::torch,
/// or a model that cannot be loaded.
///
/// Example:
///   rebound::JobQueue queue(rebound::make_model("sleep:0.5"));
///
/// Thread-safety: any thread; each call makes a new model.
inline std::unique_ptr<Model> make_model(std::string_view spec) {
  if (spec == "echo" || spec.substr(0, 6) == "sleep:") return make_builtin_model(spec);
  if (spec.empty()) throw Error("model spec is empty: use echo, sleep:<seconds> or a directory");
#if defined(REBOUND_HAS_TORCH)
  return std::make_unique<TorchScriptModel>(std::string(spec));
#else
  throw Error("model '" + std::string(spec) +
              "': this program has no TorchScript support (link rebound::torch); use echo or "
              "sleep:<seconds>");
#endif
}

}  // namespace REBOUND_DETAIL_MODELS
}  // namespace rebound

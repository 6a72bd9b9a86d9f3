// make_model: a Model from a spec ("echo", "sleep:S", or a model directory), as rebound-server's
// --model takes it; make_model_repository: a ModelRepository from a directory of models and
// versions, as --model-repository takes it.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rebound/error.hpp"
#include "rebound/model.hpp"
#include "rebound/model_repository.hpp"
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

/// One version of a repository, the directory `dir`: a `config.json` that names a built-in
/// (`{"backend": "echo"}`, `{"backend": "sleep", "seconds": S}`), else what make_model makes of
/// the directory (TorchScript `model.pt` and an optional `config.json`). Throws rebound::Error.
inline std::unique_ptr<Model> make_model_version(const std::filesystem::path& dir) {
  const auto config = dir / "config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config, ec)) {
    std::ifstream in(config);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      throw Error("model version " + dir.string() + ": config.json is not a JSON object");
    }
    if (const auto backend = j.find("backend"); backend != j.end()) {
      if (*backend == "echo") return make_builtin_model("echo");
      if (*backend == "sleep") {
        const auto seconds = j.find("seconds");
        if (seconds == j.end() || !seconds->is_number() || *seconds < 0) {
          throw Error("model version " + dir.string() +
                      ": the sleep backend needs \"seconds\", a number >= 0");
        }
        return make_builtin_model("sleep:" + seconds->dump());
      }
      throw Error("model version " + dir.string() + ": unknown backend " + backend->dump() +
                  " (echo or sleep; TorchScript needs no backend, only model.pt)");
    }
  }
  return make_model(dir.string());
}

/// A ModelRepository from a directory laid out as `DIR/<name>/<version>/` (rebound-server's
/// `--model-repository`): every version is loaded (make_model_version), each model's highest is
/// its default; `default_model` (may be empty when there is one model) is the model a job that
/// names none goes to. Every name is checked before a path is built from it: a directory whose
/// name is not a model name (is_valid_model_name) or version (is_valid_model_version) is refused,
/// as is a version that leads outside `DIR` (a link); entries starting with '.' and plain files
/// are passed over. Throws rebound::Error saying which entry is wrong, or for a repository
/// without a model.
///
/// Example:
///   rebound::JobQueue queue(rebound::make_model_repository("/srv/models", "iris"));
inline ModelRepository make_model_repository(const std::string& dir,
                                             const std::string& default_model = {}) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  if (ec || !fs::is_directory(root, ec)) {
    throw Error("model repository " + dir + ": not a directory" +
                (ec ? " (" + ec.message() + ")" : ""));
  }
  const auto inside = [&](const fs::path& p) {
    const auto rel = p.lexically_relative(root);
    return !rel.empty() && *rel.begin() != "..";
  };
  // `path` (`label` in messages) with its links resolved: refused when that leads nowhere, loops,
  // or leaves the repository.
  const auto resolved = [&](const fs::path& path, const std::string& label) {
    std::error_code e;
    const fs::path real = fs::canonical(path, e);
    if (e) {
      throw Error("model repository " + dir + ": '" + label +
                  "' cannot be resolved (a link that leads nowhere, or a loop)");
    }
    if (!inside(real)) {
      throw Error("model repository " + dir + ": '" + label + "' leads outside the repository");
    }
    return real;
  };
  // Entries by name, so that errors and loads come in the same order everywhere.
  auto entries = [&](const fs::path& at) {
    std::vector<fs::path> out;
    for (fs::directory_iterator it(at, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      std::error_code e;
      if (it->is_symlink(e) && !fs::exists(it->path(), e)) {
        // (Not passed over as a plain file would be: a version deployed as a link that broke.)
        resolved(it->path(), it->path().lexically_relative(root).string());
      }
      if (!it->is_directory(e)) continue;
      out.push_back(it->path());
    }
    if (ec) throw Error("model repository: cannot list " + at.string() + ": " + ec.message());
    std::sort(out.begin(), out.end());
    return out;
  };
  ModelRepository repository;
  for (const fs::path& model_dir : entries(root)) {
    const std::string name = model_dir.filename().string();
    if (!is_valid_model_name(name)) {
      throw Error("model repository " + dir + ": '" + name +
                  "' is not a model name (1 to 64 of a-z 0-9 . _ -, the first a letter or a "
                  "digit)");
    }
    const fs::path real_model_dir = resolved(model_dir, name);
    std::vector<std::string> versions;
    for (const fs::path& version_dir : entries(real_model_dir)) {
      const std::string version = version_dir.filename().string();
      if (!is_valid_model_version(version)) {
        throw Error("model repository " + dir + ": '" + name + "/" + version +
                    "' is not a version (a positive integer, no leading zero)");
      }
      versions.push_back(version);
    }
    if (versions.empty()) {
      throw Error("model repository " + dir + ": the model '" + name + "' has no version");
    }
    for (const std::string& version : versions) {
      const std::string label = name + "/" + version;
      // Nothing outside the repository is read: a version that is a link elsewhere is refused,
      const fs::path version_dir = resolved(real_model_dir / version, label);
      // and so is a file in it that links elsewhere (the model's files, what its digest reads).
      for (fs::recursive_directory_iterator it(version_dir, ec), end; !ec && it != end;
           it.increment(ec)) {
        std::error_code e;
        if (!it->is_symlink(e)) continue;
        resolved(it->path(), label + "/" + it->path().lexically_relative(version_dir).string());
      }
      if (ec) {
        throw Error("model repository: cannot list " + version_dir.string() + ": " + ec.message());
      }
      try {
        repository.add(name, version, make_model_version(version_dir));
      } catch (const std::exception& e) {  // (a backend may throw its own: torch's c10::Error)
        throw Error("model repository " + dir + ": '" + label + "': " + e.what());
      }
    }
  }
  const std::vector<ModelRef> loaded = repository.list();
  if (loaded.empty()) throw Error("model repository " + dir + ": no model in it");
  if (!default_model.empty()) {
    repository.set_default_model(default_model);
  } else if (loaded.front().name != loaded.back().name) {
    throw Error("model repository " + dir +
                ": it holds several models; name the one a job without \"model\" goes to "
                "(--default-model)");
  }
  return repository;
}

}  // namespace REBOUND_DETAIL_MODELS
}  // namespace rebound

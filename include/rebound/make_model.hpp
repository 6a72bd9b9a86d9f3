// make_model: a Model from a spec ("echo", "sleep:S", or a model directory), as rebound-server's
// --model takes it; make_model_repository: a ModelRepository from a directory of models and
// versions, as --model-repository takes it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

/// A model repository's directory (`DIR/<name>/<version>/`) and its checks: names and versions
/// are checked before a path is built from them, and a model, a version or a file inside one
/// that is a link leading outside `DIR`, nowhere or in a loop is refused. Throws rebound::Error.
class RepositoryDir {
 public:
  explicit RepositoryDir(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    root_ = std::filesystem::canonical(dir, ec);
    if (ec || !std::filesystem::is_directory(root_, ec)) {
      throw Error("model repository " + dir + ": not a directory" +
                  (ec ? " (" + ec.message() + ")" : ""));
    }
  }

  /// The model directories' names, then (versions) a model's versions' names: entries starting
  /// with '.' and plain files passed over, by name; a link that leads nowhere is refused.
  std::vector<std::string> models() const { return entries(root_); }
  std::vector<std::string> versions(const std::string& name) const {
    return entries(model_dir(name));
  }

  /// Whether `DIR/<name>/<version>/` is there (after the checks on the two names).
  bool has(const ModelRef& ref) const {
    check(ref);
    std::error_code ec;
    return std::filesystem::is_directory(root_ / ref.name / ref.version, ec);
  }

  /// Loads `DIR/<name>/<version>/` (make_model_version) after every check.
  std::unique_ptr<Model> load(const ModelRef& ref) const {
    check(ref);
    const std::string label = ref.name + "/" + ref.version;
    return load_checked(resolved(model_dir(ref.name) / ref.version, label), label);
  }

  /// The size of `DIR/<name>/<version>/`'s files in bytes (after the checks on the two names), or
  /// of the model directory `path` inside `DIR` (bytes_of_path): what a memory budget counts for
  /// a version before it loads. A directory that cannot be read: 0.
  std::size_t bytes(const ModelRef& ref) const {
    check(ref);
    return bytes_in(root_ / ref.name / ref.version);
  }
  std::size_t bytes_of_path(const std::string& path) const {
    return !path.empty() && path[0] == '/' ? bytes_in(path) : 0;
  }

  /// Loads the model directory `path` (SageMaker's multi-model `url`): it and every file in it
  /// must lead inside `DIR` once links are resolved.
  std::unique_ptr<Model> load_path(const std::string& path) const {
    if (path.empty() || path[0] != '/') {
      throw Error("model repository " + dir_ + ": '" + path + "' is not an absolute path");
    }
    return load_checked(resolved(path, path), path);
  }

 private:
  std::size_t bytes_in(const std::filesystem::path& at) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path real = fs::canonical(at, ec);
    if (ec || !inside(real)) return 0;  // nothing outside the repository is looked at
    std::uintmax_t total = 0;
    for (fs::recursive_directory_iterator it(real, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code e;
      if (it->is_symlink(e)) {
        const fs::path target = fs::canonical(it->path(), e);
        if (e || !inside(target)) continue;  // (a load refuses it anyway)
      }
      if (!it->is_regular_file(e)) continue;
      const std::uintmax_t size = it->file_size(e);
      if (!e) total += size;
    }
    return static_cast<std::size_t>(total);
  }

  std::unique_ptr<Model> load_checked(const std::filesystem::path& version_dir,
                                      const std::string& label) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    // Nothing outside the repository is read: a file of the version that links elsewhere is
    // refused too (the model's files, what its digest reads).
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
      return make_model_version(version_dir);
    } catch (const std::exception& e) {  // (a backend may throw its own: torch's c10::Error)
      throw Error("model repository " + dir_ + ": '" + label + "': " + e.what());
    }
  }

  void check(const ModelRef& ref) const {
    if (!is_valid_model_name(ref.name)) {
      throw Error("model repository " + dir_ + ": '" + ref.name +
                  "' is not a model name (1 to 64 of a-z 0-9 . _ -, the first a letter or a "
                  "digit)");
    }
    if (!is_valid_model_version(ref.version)) {
      throw Error("model repository " + dir_ + ": '" + ref.name + "/" + ref.version +
                  "' is not a version (a positive integer, no leading zero)");
    }
  }

  std::filesystem::path model_dir(const std::string& name) const {
    if (!is_valid_model_name(name)) check({name, "1"});
    return resolved(root_ / name, name);
  }

  bool inside(const std::filesystem::path& p) const {
    const auto rel = p.lexically_relative(root_);
    return !rel.empty() && rel != "." && *rel.begin() != "..";
  }

  // `path` (`label` in messages) with its links resolved: refused when that leads nowhere, loops,
  // or leaves the repository.
  std::filesystem::path resolved(const std::filesystem::path& path,
                                 const std::string& label) const {
    std::error_code e;
    const std::filesystem::path real = std::filesystem::canonical(path, e);
    if (e) {
      throw Error("model repository " + dir_ + ": '" + label +
                  "' cannot be resolved (a link that leads nowhere, a loop, or nothing there)");
    }
    if (!inside(real)) {
      throw Error("model repository " + dir_ + ": '" + label + "' leads outside the repository");
    }
    return real;
  }

  std::vector<std::string> entries(const std::filesystem::path& at) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<std::string> out;
    for (fs::directory_iterator it(at, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      std::error_code e;
      if (it->is_symlink(e) && !fs::exists(it->path(), e)) {
        // (Not passed over as a plain file would be: a version deployed as a link that broke.)
        resolved(it->path(), it->path().lexically_relative(root_).string());
      }
      if (!it->is_directory(e)) continue;
      out.push_back(name);
    }
    if (ec) throw Error("model repository: cannot list " + at.string() + ": " + ec.message());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string dir_;
  std::filesystem::path root_;
};

/// A ModelRepository from a directory laid out as `DIR/<name>/<version>/` (rebound-server's
/// `--model-repository`): every version is loaded (make_model_version), each model's highest is
/// its default; `default_model` (may be empty when there is one model) is the model a job that
/// names none goes to. Every name is checked before a path is built from it: a directory whose
/// name is not a model name (is_valid_model_name) or version (is_valid_model_version) is refused,
/// as is a model, a version or a file in one that is a link leading outside `DIR`, nowhere or in
/// a loop; entries starting with '.' and plain files are passed over. Throws rebound::Error
/// saying which entry is wrong, or for a repository without a model. Its loader
/// (ModelRepository::set_loader) loads further versions from the same directory, with the same
/// checks, while the queue runs (ServedModels::async_load).
///
/// Example:
///   rebound::JobQueue queue(rebound::make_model_repository("/srv/models", "iris"));
inline ModelRepository make_model_repository(const std::string& dir,
                                             const std::string& default_model = {}) {
  auto root = std::make_shared<const RepositoryDir>(dir);
  ModelRepository repository;
  for (const std::string& name : root->models()) {
    if (!is_valid_model_name(name)) {
      throw Error("model repository " + dir + ": '" + name +
                  "' is not a model name (1 to 64 of a-z 0-9 . _ -, the first a letter or a "
                  "digit)");
    }
    const std::vector<std::string> versions = root->versions(name);
    if (versions.empty()) {
      throw Error("model repository " + dir + ": the model '" + name + "' has no version");
    }
    for (const std::string& version : versions)
      repository.add(name, version, root->load({name, version}));
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
  repository.set_loader([root](const ModelRef& ref) { return root->load(ref); });
  repository.set_sizer([root](const ModelRef& ref) { return root->bytes(ref); });
  return repository;
}

}  // namespace REBOUND_DETAIL_MODELS
}  // namespace rebound

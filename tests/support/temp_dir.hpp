// A fresh temporary folder for a test, removed with everything in it when the test ends.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

namespace rebound::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char pattern[] = "/tmp/rebound-test-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
  }
  /// A file's bytes from `offset` on (empty when there is no such file).
  std::string read(const std::string& name, std::uintmax_t offset = 0) const {
    std::ifstream in(path / name);
    in.seekg(static_cast<std::streamoff>(offset));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  /// A file's size (0 when there is no such file).
  std::uintmax_t size(const std::string& name) const {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path / name, ec);
    return ec ? 0 : bytes;
  }
  /// Its last `bytes` bytes (a server's log, for a failure's message).
  std::string tail(const std::string& name, std::uintmax_t bytes = 2000) const {
    const auto total = size(name);
    return read(name, total > bytes ? total - bytes : 0);
  }
};

}  // namespace rebound::test

// A private temporary directory (mode 0700, from mkdtemp) removed with its
// contents when the owner dies. Submitted problem sources are written here so
// that the reference bridge and the evaluator can load them as files without
// any other user reading them. Move-only; not thread-safe.
#pragma once

#include <string>

#include "common/status.h"

namespace ks::server {

class TempDir {
 public:
  static StatusOr<TempDir> Make(const std::string& prefix);
  TempDir() = default;
  TempDir(TempDir&& o) noexcept;
  TempDir& operator=(TempDir&& o) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }

 private:
  void Remove();
  std::string path_;
};

}  // namespace ks::server

#include "server/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "common/files.h"

namespace ks::server {

StatusOr<TempDir> TempDir::Make(const std::string& prefix) {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = (base / (prefix + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) return PosixError("mkdtemp " + tmpl, errno);
  TempDir d;
  d.path_ = tmpl;
  return d;
}

TempDir::TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, "")) {}

TempDir& TempDir::operator=(TempDir&& o) noexcept {
  if (this != &o) {
    Remove();
    path_ = std::exchange(o.path_, "");
  }
  return *this;
}

TempDir::~TempDir() { Remove(); }

void TempDir::Remove() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  path_.clear();
}

}  // namespace ks::server

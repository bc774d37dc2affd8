// TempDir: a fresh directory under $TMPDIR (or /tmp) for one test, removed with
// everything in it when the object goes out of scope (also when the test fails).
//
// Ownership: the object owns the directory. Thread-safety: one test thread.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace l2l::testing {

class TempDir {
 public:
  // <parent>/<prefix>-XXXXXX, parent "" = $TMPDIR or /tmp; aborts the test binary when
  // mkdtemp fails.
  explicit TempDir(const std::string& prefix = "l2l_test", const std::string& parent = "");
  // The same, as an error instead of an abort (mkdtemp's errno, naming the template).
  static Result<std::unique_ptr<TempDir>> Create(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // Writes `contents` to <dir>/name (creating parent dirs) and returns the path.
  std::string Write(const std::string& name, const std::string& contents) const;

 private:
  struct Made {};
  TempDir(Made, std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// The whole file (empty when it cannot be read).
std::string ReadAll(const std::string& path);

}  // namespace l2l::testing

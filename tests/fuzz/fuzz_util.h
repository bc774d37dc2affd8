// Helpers shared by the libFuzzer targets of tests/fuzz: a per-process scratch directory
// for readers that take a path (the fuzz input is written to a file there), and quiet
// logging so the fuzzer's own output stays readable.
//
// Ownership: the scratch directory is created on first use and removed at exit.
// Thread-safety: for the fuzzer's single input thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/logging.h"

namespace l2l::fuzz {

inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/l2l-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      std::perror("l2l fuzz: mkdtemp");
      std::abort();
    }
    static std::string copy = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(copy, ec);
    });
    return tmpl;
  }();
  return dir;
}

// Writes data[0..size) to <scratch>/<name> (replacing it) and returns the path.
inline std::string WriteScratchFile(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(("l2l fuzz: write " + path).c_str());
    std::abort();
  }
  return path;
}

// Refusing the input is the expected outcome of most runs: logging is off.
inline void QuietLogs() {
  static const bool once = [] {
    (void)InitLogging("off");
    return true;
  }();
  (void)once;
}

}  // namespace l2l::fuzz

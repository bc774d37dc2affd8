// See temp_dir.h.
#include "tests/testing/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace l2l::testing {
namespace {

std::string Template(const std::string& prefix, const std::string& parent = "") {
  const char* base = std::getenv("TMPDIR");
  const std::string dir = !parent.empty() ? parent : base && *base ? base : "/tmp";
  return dir + "/" + prefix + "-XXXXXX";
}

}  // namespace

TempDir::TempDir(const std::string& prefix, const std::string& parent) : path_(Template(prefix, parent)) {
  if (::mkdtemp(path_.data()) == nullptr) {
    std::perror(("mkdtemp " + path_).c_str());
    std::abort();
  }
}

Result<std::unique_ptr<TempDir>> TempDir::Create(const std::string& prefix) {
  std::string path = Template(prefix);
  if (::mkdtemp(path.data()) == nullptr) return ErrnoError("mkdtemp", path, errno);
  return std::unique_ptr<TempDir>(new TempDir(Made{}, std::move(path)));
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Write(const std::string& name, const std::string& contents) const {
  const std::string p = File(name);
  std::filesystem::create_directories(std::filesystem::path(p).parent_path());
  std::ofstream f(p, std::ios::binary);
  f << contents;
  return p;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace l2l::testing

// Tests for the size cap on files read whole (common/file_util.h ReadFileToString,
// L2L_MAX_FILE_BYTES): a file past the cap is refused before it is read, by its size,
// naming the file, its size, the cap and the variable that raises it; the configs read
// through it (config.json, YAML) inherit the cap; the variable moves the cap and a bad
// value is an error naming it. The 2 GiB files are sparse (no disk blocks).
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/file_util.h"
#include "common/formats/model_config.h"
#include "common/yaml_util.h"
#include "tests/testing/scoped_env.h"
#include "tests/testing/temp_dir.h"

namespace l2l {
namespace {

using testing::ScopedEnv;
using testing::TempDir;

bool Has(const Status& s, const std::string& part) { return s.message().find(part) != std::string::npos; }

// A sparse file of `bytes` bytes: it reads as zeros and takes no disk blocks.
std::string SparseFile(const TempDir& dir, const std::string& name, uint64_t bytes) {
  const std::string path = dir.Write(name, "{");
  std::filesystem::resize_file(path, bytes);
  return path;
}

constexpr uint64_t k2GiB = uint64_t{2} << 30;

TEST_CASE("A 2 GiB config.json is refused by its size, naming the file, its size, the cap and the variable",
          "[common][file_util]") {
  ScopedEnv unset("L2L_MAX_FILE_BYTES", "");  // the default cap, 1 GiB
  TempDir dir;
  const std::string path = SparseFile(dir, "config.json", k2GiB);
  const Result<formats::ModelConfig> c = formats::ReadHfConfig(path);
  REQUIRE_FALSE(c.ok());
  INFO(c.status().ToString());
  CHECK(c.status().code() == StatusCode::kInvalidArgument);
  for (const std::string& part : {path, std::string("2147483648 bytes"), std::string("1073741824-byte limit"),
                                  std::string("L2L_MAX_FILE_BYTES")}) {
    CHECK(Has(c.status(), part));
  }
  // The YAML loader (job and daemon configs) reads through the same cap.
  const std::string yaml = SparseFile(dir, "job.yaml", k2GiB);
  const auto y = LoadYamlFile(yaml);
  REQUIRE_FALSE(y.ok());
  CHECK(Has(y.status(), yaml + ": 2147483648 bytes"));
}

TEST_CASE("L2L_MAX_FILE_BYTES moves the cap on files read whole, and a bad value is an error naming it",
          "[common][file_util]") {
  TempDir dir;
  const std::string at = dir.Write("at.json", std::string(100, ' '));
  const std::string over = dir.Write("over.json", std::string(101, ' '));
  {
    ScopedEnv cap("L2L_MAX_FILE_BYTES", "100");
    REQUIRE(MaxFileBytes().ok());
    CHECK(*MaxFileBytes() == 100);
    CHECK(ReadFileToString(at).ok());
    const Result<std::string> r = ReadFileToString(over);
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.status(), over + ": 101 bytes, more than the 100-byte limit"));
    // Not a regular file: counted while reading.
    const Result<std::string> z = ReadFileToString("/dev/zero");
    REQUIRE_FALSE(z.ok());
    CHECK(Has(z.status(), "/dev/zero"));
    CHECK(Has(z.status(), "counted while reading"));
  }
  {
    ScopedEnv unset("L2L_MAX_FILE_BYTES", "");
    CHECK(*MaxFileBytes() == (uint64_t{1} << 30));
    CHECK(ReadFileToString(over).ok());
  }
  for (const char* bad : {"0", "-5", "1GiB"}) {
    ScopedEnv cap("L2L_MAX_FILE_BYTES", bad);
    const Result<std::string> r = ReadFileToString(at);
    INFO(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.status(), std::string("environment L2L_MAX_FILE_BYTES=") + bad));
  }
  // An explicit cap wins over the variable.
  CHECK_FALSE(ReadFileToString(at, 99).ok());
  CHECK(ReadFileToString(at, 100).ok());
}

}  // namespace
}  // namespace l2l

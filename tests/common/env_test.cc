// Tests of the environment-variable registry (common/env.h): the table is complete and in
// order, values are read by type with the table's defaults, bad values are errors naming
// the variable, the snapshot holds until reset, and docs/operations.md lists every row.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/env.h"
#include "tests/testing/scoped_env.h"

namespace l2l {
namespace {

using testing::ScopedEnv;

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// An enum of the shape the registry's enum variables map to (kernels' precisions).
enum class Gemm { kFp32, kBf16 };
Result<Gemm> ParseGemm(std::string_view s) {
  if (s == "fp32") return Gemm::kFp32;
  if (s == "bf16") return Gemm::kBf16;
  return InvalidArgument("'" + std::string(s) + "' is not one of: fp32, bf16");
}

TEST_CASE("The environment registry has one row per EnvVar, in order, each documented", "[env]") {
  const auto table = EnvRegistry();
  REQUIRE(table.size() == static_cast<size_t>(EnvVar::kCount));
  std::set<std::string> names;
  for (size_t i = 0; i < table.size(); ++i) {
    const EnvVarInfo& info = table[i];
    INFO(info.name);
    CHECK(static_cast<size_t>(info.var) == i);
    CHECK(&EnvInfo(info.var) == &info);
    CHECK(std::string(info.name).rfind("L2L_", 0) == 0);
    CHECK(names.insert(info.name).second);
    CHECK(std::string(info.values).size() > 0);
    CHECK(std::string(info.read_by).size() > 0);
    CHECK(std::string(info.doc).size() > 0);
    // A bool or int default is a value of its type; an enum's names are what it accepts.
    if (info.type == EnvType::kBool) CHECK(ParseEnvBool(info, info.default_value).ok());
    if (info.type == EnvType::kInt) CHECK(ParseEnvInt(info, info.default_value).ok());
    if (info.type == EnvType::kEnum) {
      std::string_view rest = info.values;
      while (!rest.empty()) {
        const size_t bar = rest.find('|');
        CHECK(CheckEnvChoice(info, std::string(rest.substr(0, bar))).ok());
        rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
      }
    }
  }
}

TEST_CASE("Environment values are read by type: bool, int, string, enum", "[env]") {
  const EnvVarInfo info{EnvVar::kCpuPin, "L2L_EXAMPLE", EnvType::kBool, "0|1", "0", "a test", "a test"};
  SECTION("bool") {
    for (const char* yes : {"1", "true", "YES", "on"}) CHECK(*ParseEnvBool(info, yes));
    for (const char* no : {"0", "false", "No", "OFF"}) CHECK_FALSE(*ParseEnvBool(info, no));
    const Result<bool> bad = ParseEnvBool(info, "2");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
    CHECK(Has(bad.status().message(), "environment L2L_EXAMPLE=2: expected 1 or 0"));
  }
  SECTION("int") {
    CHECK(*ParseEnvInt(info, "42") == 42);
    CHECK(*ParseEnvInt(info, "-7") == -7);
    for (const char* bad : {"", "1.5", "12x", "99999999999999999999"}) {
      const Result<int64_t> r = ParseEnvInt(info, bad);
      INFO(bad);
      REQUIRE_FALSE(r.ok());
      CHECK(Has(r.status().message(), "environment L2L_EXAMPLE="));
      CHECK(Has(r.status().message(), "expected a whole number"));
    }
  }
  SECTION("string") {
    ScopedEnv eps("L2L_EPS", "10.0.0.5:7500");
    CHECK(EnvString(EnvVar::kEps) == "10.0.0.5:7500");
    ScopedEnv state("L2L_STATE_DIR", "");  // "" = unset
    CHECK(EnvString(EnvVar::kStateDir).empty());
    CHECK_FALSE(EnvText(EnvVar::kStateDir).has_value());
  }
  SECTION("bool from the environment, with the table's default") {
    {
      ScopedEnv pin("L2L_CPU_PIN", "");
      CHECK_FALSE(*EnvBool(EnvVar::kCpuPin));
    }
    {
      ScopedEnv pin("L2L_CPU_PIN", "yes");
      CHECK(*EnvBool(EnvVar::kCpuPin));
    }
    ScopedEnv pin("L2L_CPU_PIN", "maybe");
    const Result<bool> bad = EnvBool(EnvVar::kCpuPin);
    REQUIRE_FALSE(bad.ok());
    CHECK(Has(bad.status().message(), "environment L2L_CPU_PIN=maybe: expected 1 or 0"));
  }
  SECTION("enum: unset, a name, a bad name listing the accepted ones") {
    {
      ScopedEnv gemm("L2L_CPU_GEMM", "");
      const auto none = EnvEnum(EnvVar::kCpuGemm, ParseGemm);
      REQUIRE(none.ok());
      CHECK_FALSE(none->has_value());
    }
    {
      ScopedEnv gemm("L2L_CPU_GEMM", "bf16");
      const auto bf16 = EnvEnum(EnvVar::kCpuGemm, ParseGemm);
      REQUIRE(bf16.ok());
      CHECK(**bf16 == Gemm::kBf16);
    }
    ScopedEnv gemm("L2L_CPU_GEMM", "fp16");
    const auto bad = EnvEnum(EnvVar::kCpuGemm, ParseGemm);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
    CHECK(bad.status().message() == "environment L2L_CPU_GEMM=fp16: expected one of fp32, bf16");
  }
}

TEST_CASE("The environment is read once: a change shows only after a reset", "[env]") {
  ScopedEnv eps("L2L_EPS", "first:1");
  CHECK(EnvString(EnvVar::kEps) == "first:1");
  ::setenv("L2L_EPS", "second:2", 1);  // behind the registry's back
  CHECK(EnvString(EnvVar::kEps) == "first:1");
  ResetEnvForTesting();
  CHECK(EnvString(EnvVar::kEps) == "second:2");
}

TEST_CASE("The --help-env text lists every variable with its values, default and doc line", "[env]") {
  ScopedEnv gemm("L2L_CPU_GEMM", "bf16");
  const std::string help = EnvHelpText();
  for (const EnvVarInfo& info : EnvRegistry()) {
    INFO(info.name);
    CHECK(Has(help, std::string(info.name) + "=" + info.values));
    CHECK(Has(help, info.doc));
    CHECK(Has(help, std::string("default: ") + info.default_value));
  }
  CHECK(Has(help, "set here: bf16"));
  CHECK(Has(help, "L2L_CUDA_EMU_"));
}

TEST_CASE("docs/operations.md lists every registry variable, row for row", "[env][docs]") {
  const std::string path = std::string(L2L_SOURCE_DIR) + "/docs/operations.md";
  std::ifstream f(path);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const EnvVarInfo& info : EnvRegistry()) {
    const std::string row = EnvMarkdownRow(info);
    INFO(path << " \"Environment variables\" needs this row (common/env.cc's table):\n" << row);
    CHECK(Has(doc, row + "\n"));
  }
}

}  // namespace
}  // namespace l2l

// Tests of the daemon's settings file (eps_server/eps_config.*): the example shipped in
// configs/ loads, publish_dtype "" means "the job's", and bad values name key and line.
#include <catch2/catch.hpp>

#include <string>

#include "common/dtype.h"
#include "eps_server/eps_config.h"

namespace l2l::eps {
namespace {

TEST_CASE("configs/eps.yaml, the shipped example, loads as documented", "[eps][config]") {
  auto cfg = LoadEpsConfig(std::string(L2L_SOURCE_DIR) + "/configs/eps.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->listen == "127.0.0.1:0");
  CHECK_FALSE(cfg->publish_dtype.has_value());  // "" = the job's publish dtype
}

TEST_CASE("publish_dtype: empty keeps the job's, f32 and bf16 override, others are errors", "[eps][config]") {
  auto none = ParseEpsConfig("publish_dtype: \"\"\n", "<t>");
  REQUIRE(none.ok());
  CHECK_FALSE(none->publish_dtype.has_value());
  auto bf16 = ParseEpsConfig("publish_dtype: bf16\n", "<t>");
  REQUIRE(bf16.ok());
  REQUIRE(bf16->publish_dtype.has_value());
  CHECK(*bf16->publish_dtype == DType::kBF16);
  auto bad = ParseEpsConfig("listen: 127.0.0.1:0\npublish_dtype: fp8\n", "<t>");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("<t>:2") != std::string::npos);
  CHECK(bad.status().message().find("publish_dtype") != std::string::npos);
}

}  // namespace
}  // namespace l2l::eps

// Tests of the daemon's settings file (eps_server/eps_config.*): the example shipped in
// configs/ loads, publish_dtype "" means "the job's", and bad values name key and line.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "eps_server/eps_config.h"
#include "tests/testing/temp_dir.h"

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

TEST_CASE("memory.guard_bytes is read (0 = unbounded undo copies) and must not be negative", "[eps][config]") {
  auto cfg = ParseEpsConfig("memory:\n  host_bytes: 1000000\n  guard_bytes: 400000\n", "<t>");
  REQUIRE(cfg.ok());
  CHECK(cfg->guard_bytes == 400000);
  CHECK(ParseEpsConfig("listen: 127.0.0.1:0\n", "<t>")->guard_bytes == 0);
  auto bad = ParseEpsConfig("memory:\n  guard_bytes: -1\n", "<t>");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("memory.guard_bytes") != std::string::npos);
}

TEST_CASE("The daemon config's errors name file:line and the key path, as the job config's do", "[eps][config]") {
  auto expect = [](const std::string& yaml, std::initializer_list<const char*> parts) {
    auto cfg = ParseEpsConfig(yaml, "<t>");
    REQUIRE_FALSE(cfg.ok());
    INFO(cfg.status().message());
    for (const char* p : parts) CHECK(cfg.status().message().find(p) != std::string::npos);
  };
  expect("listen: a:1\nmemory:\n  page_bytse: 4096\n", {"<t>:3", "unknown key memory.page_bytse"});
  expect("spill:\n  queue_depth: 0\n", {"<t>:2", "spill.queue_depth", "expected an integer in [1, 4096], found '0'"});
  expect("expected_workers: two\n", {"<t>:1", "expected_workers", "found 'two'"});
  expect("on_worker_loss: wait\n", {"<t>:1", "on_worker_loss", "pause"});
  expect("memory: 5\n", {"<t>:1", "memory", "expected a map"});
  // Cross-field rules (EpsConfig::Validate) point at the key's line too.
  expect("listen: a:1\nmemory:\n  page_bytes: 5000\n", {"<t>:3", "memory.page_bytes=5000"});
  auto empty = ParseEpsConfig("# only a comment\n", "<t>");
  REQUIRE(empty.ok());
  CHECK(empty->expected_workers == 1);
}

TEST_CASE("paths.models / data / presets: lists of directories, relative to the config file", "[eps][config]") {
  auto c = ParseEpsConfig("paths:\n  models: /m\n  data: [/d1, /d2]\n  presets: []\n", "<t>");
  REQUIRE(c.ok());
  CHECK(c->paths.models == std::vector<std::string>{"/m"});
  CHECK(c->paths.data == std::vector<std::string>{"/d1", "/d2"});
  CHECK(c->paths.presets.empty());
  auto none = ParseEpsConfig("listen: 127.0.0.1:0\n", "<t>");
  REQUIRE(none.ok());
  CHECK((none->paths.models.empty() && none->paths.data.empty() && none->paths.presets.empty()));
  auto typo = ParseEpsConfig("paths:\n  dta: [/d]\n", "<t>");
  REQUIRE_FALSE(typo.ok());
  CHECK(typo.status().message().find("paths.dta") != std::string::npos);
  auto nested = ParseEpsConfig("paths:\n  data: {a: b}\n", "<t>");
  REQUIRE_FALSE(nested.ok());
  CHECK(nested.status().message().find("<t>:2") != std::string::npos);
  testing::TempDir tmp("l2l-epscfg");
  auto file = LoadEpsConfig(tmp.Write("eps.yaml", "paths:\n  data: [corpus, /abs]\n  models: ../m\n"));
  REQUIRE(file.ok());
  CHECK(file->paths.data == std::vector<std::string>{tmp.path() + "/corpus", "/abs"});
  CHECK(file->paths.models ==
        std::vector<std::string>{std::filesystem::path(tmp.path() + "/../m").lexically_normal().string()});
  auto shipped = LoadEpsConfig(std::string(L2L_SOURCE_DIR) + "/configs/eps.yaml");
  REQUIRE(shipped.ok());
  CHECK(shipped->paths.data.empty());  // the state dir and a job file's directory only
}

}  // namespace
}  // namespace l2l::eps

// RunLog (eps_server/run_log.h): the file is read back here with nlohmann-json line by
// line (independently of ReadRunLog), for the fields scripts/plot_run.py reads; crash
// leftovers (a torn last line) and resume truncation are checked on real files.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eps_server/run_log.h"
#include "tests/common/temp_dir.h"

namespace l2l::eps {
namespace {

using Json = nlohmann::json;

std::vector<Json> ReadLines(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::vector<Json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(Json::parse(line));  // throws (fails) on a bad line
  return out;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

StepRecord Full(int64_t step) {
  StepRecord r;
  r.step = step;
  r.time = 1716200000.0 + step;
  r.loss = 5.0 - 0.1 * step;
  r.tokens_per_s = 1000.0 * step;
  r.lr = 3e-4;
  r.forward_s = 0.25;
  r.recompute_s = 0.125;
  r.backward_s = 0.5;
  r.wait_layer_s = 0.0625;
  r.wait_push_s = 0.03125;
  r.update_s = 0.015625;
  return r;
}

TEST_CASE("RunLog writes one JSON object per step with the fields plot_run.py reads", "[eps][run_log]") {
  testing::TempDir dir;
  const std::string state = dir.File("state");  // created by Open
  {
    auto log = RunLog::Open(state);
    REQUIRE(log.ok());
    CHECK((*log)->path() == state + "/run.jsonl");
    for (int64_t s = 1; s <= 3; ++s) REQUIRE((*log)->Append(Full(s)).ok());
    StepRecord partial;  // unknown phases and a NaN loss are left out, not written as junk
    partial.step = 4;
    partial.loss = NAN;
    partial.tokens_per_s = 42.0;
    REQUIRE((*log)->Append(partial).ok());
    REQUIRE((*log)->Sync().ok());
  }
  const auto lines = ReadLines(state + "/run.jsonl");
  REQUIRE(lines.size() == 4);
  for (int64_t s = 1; s <= 3; ++s) {
    const Json& j = lines[s - 1];
    const StepRecord want = Full(s);
    CHECK(j.at("step").get<int64_t>() == s);
    CHECK(j.at("time").get<double>() == want.time);
    CHECK(j.at("loss").get<double>() == *want.loss);
    CHECK(j.at("tokens_per_s").get<double>() == *want.tokens_per_s);
    CHECK(j.at("lr").get<double>() == *want.lr);
    CHECK(j.at("forward_s").get<double>() == 0.25);
    CHECK(j.at("recompute_s").get<double>() == 0.125);
    CHECK(j.at("backward_s").get<double>() == 0.5);
    CHECK(j.at("wait_layer_s").get<double>() == 0.0625);
    CHECK(j.at("wait_push_s").get<double>() == 0.03125);
    CHECK(j.at("update_s").get<double>() == 0.015625);
  }
  const Json& p = lines[3];
  CHECK(p.at("step").get<int64_t>() == 4);
  CHECK(p.at("tokens_per_s").get<double>() == 42.0);
  CHECK_FALSE(p.contains("loss"));
  CHECK_FALSE(p.contains("forward_s"));
  // time defaults to now (Unix seconds): after 2023, before 2100.
  CHECK(p.at("time").get<double>() > 1.7e9);
  CHECK(p.at("time").get<double>() < 4.1e9);

  auto back = ReadRunLog(state + "/run.jsonl");
  REQUIRE(back.ok());
  REQUIRE(back->size() == 4);
  CHECK((*back)[2].backward_s == 0.5);
  CHECK_FALSE((*back)[3].loss.has_value());
}

TEST_CASE("RunLog appends across reopen and refuses steps going backwards", "[eps][run_log]") {
  testing::TempDir dir;
  {
    auto log = RunLog::Open(dir.path());
    REQUIRE(log.ok());
    REQUIRE((*log)->Append(Full(1)).ok());
    REQUIRE((*log)->Append(Full(2)).ok());
  }
  auto log = RunLog::Open(dir.path());
  REQUIRE(log.ok());
  const Status back = (*log)->Append(Full(1));
  CHECK(back.code() == StatusCode::kFailedPrecondition);
  CHECK(back.message().find("run.jsonl") != std::string::npos);
  REQUIRE((*log)->Append(Full(3)).ok());
  CHECK(ReadLines(dir.File("run.jsonl")).size() == 3);
}

TEST_CASE("RunLog cuts a torn last line and drops steps past the resumed checkpoint", "[eps][run_log]") {
  testing::TempDir dir;
  std::string text;
  for (int64_t s = 1; s <= 5; ++s) text += StepRecordToJson(Full(s)) + "\n";
  SECTION("torn line") {
    dir.Write("run.jsonl", text + R"({"step":6,"time":17162)");
    auto log = RunLog::Open(dir.path());
    REQUIRE(log.ok());
    CHECK(Slurp(dir.File("run.jsonl")) == text);
    REQUIRE((*log)->Append(Full(6)).ok());
    CHECK(ReadLines(dir.File("run.jsonl")).back().at("step") == 6);
  }
  SECTION("resume from step 3") {
    dir.Write("run.jsonl", text);
    auto log = RunLog::Open(dir.path(), /*resume_step=*/3);
    REQUIRE(log.ok());
    auto lines = ReadLines(dir.File("run.jsonl"));
    REQUIRE(lines.size() == 3);
    CHECK(lines.back().at("step") == 3);
    REQUIRE((*log)->Append(Full(4)).ok());  // redone step 4 appears once
    lines = ReadLines(dir.File("run.jsonl"));
    REQUIRE(lines.size() == 4);
    CHECK(lines.back().at("step") == 4);
  }
  SECTION("rewound to step 3 by a rollback while open") {
    dir.Write("run.jsonl", text);
    auto log = RunLog::Open(dir.path());
    REQUIRE(log.ok());
    CHECK((*log)->Append(Full(4)).code() == StatusCode::kFailedPrecondition);  // 5 is logged
    REQUIRE((*log)->Rewind(3).ok());
    auto lines = ReadLines(dir.File("run.jsonl"));
    REQUIRE(lines.size() == 3);
    CHECK(lines.back().at("step") == 3);
    REQUIRE((*log)->Append(Full(4)).ok());  // the redone step
    REQUIRE((*log)->Rewind(9).ok());        // ahead of the log: nothing goes
    lines = ReadLines(dir.File("run.jsonl"));
    REQUIRE(lines.size() == 4);
    CHECK(lines.back().at("step") == 4);
  }
  SECTION("a corrupt line in the middle is an error naming path:line") {
    dir.Write("run.jsonl", "{\"step\":1}\nnot json\n");
    auto log = RunLog::Open(dir.path());
    REQUIRE(!log.ok());
    CHECK(log.status().message().find("run.jsonl:2") != std::string::npos);
  }
}

TEST_CASE("RunLog reports an unwritable state directory with its path", "[eps][run_log]") {
  testing::TempDir dir;
  const std::string file = dir.Write("plain-file", "x");
  auto log = RunLog::Open(file + "/sub");
  REQUIRE(!log.ok());
  CHECK(log.status().message().find(file) != std::string::npos);
}

}  // namespace
}  // namespace l2l::eps

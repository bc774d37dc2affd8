// Tests for the job's `task` key (common/modes.h Task, common/config.h): parsing and
// round trip, the family defaults, and the clear errors of tasks a model cannot run.
#include <string>

#include <catch2/catch.hpp>

#include "common/config.h"
#include "common/modes.h"

namespace l2l {
namespace {

const char* kBert = R"(model:
  family: bert
  vocab_size: 1200
  seq_len: 32
  d_model: 16
  n_layer: 1
  n_head: 2
  d_ff: 32
)";

Result<JobConfig> Parse(const std::string& text) { return ParseJobConfig(text, "job.yaml"); }

void ExpectError(const Result<JobConfig>& r, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(r.ok());
  INFO("message: " << r.status().message());
  for (const std::string& n : needles) CHECK(r.status().message().find(n) != std::string::npos);
}

TEST_CASE("Task names round-trip through ToString and ParseTask", "[config][task]") {
  for (Task t : {Task::kLm, Task::kMlm, Task::kClassify}) {
    Result<Task> p = ParseTask(ToString(t));
    REQUIRE(p.ok());
    CHECK(*p == t);
  }
  Result<Task> bad = ParseTask("regression");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("lm, mlm, classify") != std::string::npos);
}

TEST_CASE("Without a task key a decoder is lm and bert follows its head", "[config][task]") {
  Result<JobConfig> gpt = Parse("model: {vocab_size: 64, seq_len: 16, d_model: 16, n_layer: 1, n_head: 2, d_ff: 32}\n");
  REQUIRE(gpt.ok());
  CHECK_FALSE(gpt->task.has_value());
  CHECK(gpt->effective_task() == Task::kLm);
  Result<JobConfig> mlm = Parse(kBert);
  REQUIRE(mlm.ok());
  CHECK(mlm->effective_task() == Task::kMlm);
  Result<JobConfig> cls = Parse(std::string(kBert) + "  num_labels: 3\n");
  REQUIRE(cls.ok());
  CHECK(cls->effective_task() == Task::kClassify);
}

TEST_CASE("task and mlm keys parse, validate and survive JobConfigToYaml", "[config][task]") {
  Result<JobConfig> c = Parse(std::string(kBert) + "  num_labels: 2\ntask: classify\n");
  REQUIRE(c.ok());
  REQUIRE(c->task.has_value());
  CHECK(*c->task == Task::kClassify);
  Result<JobConfig> back = Parse(JobConfigToYaml(*c));
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  REQUIRE(back->task.has_value());
  CHECK(*back->task == Task::kClassify);

  Result<JobConfig> m = Parse(std::string(kBert) + "task: mlm\nmlm: {mask_id: 4, first_word_id: 10, probability: 0.25}\n");
  REQUIRE(m.ok());
  CHECK(m->mlm.mask_id == 4);
  CHECK(m->mlm.first_word_id == 10);
  CHECK(m->mlm.probability == 0.25);
  Result<JobConfig> mback = Parse(JobConfigToYaml(*m));
  REQUIRE(mback.ok());
  CHECK(mback->mlm.mask_id == 4);
  CHECK(mback->mlm.first_word_id == 10);
  CHECK(mback->mlm.probability == 0.25);
  CHECK(*mback->task == Task::kMlm);
}

TEST_CASE("Tasks a model cannot run are refused with the reason", "[config][task][errors]") {
  const std::string gpt = "model: {vocab_size: 64, seq_len: 16, d_model: 16, n_layer: 1, n_head: 2, d_ff: 32}\n";
  ExpectError(Parse(gpt + "task: mlm\n"), {"task=mlm", "family bert", "gpt2"});
  ExpectError(Parse(gpt + "task: classify\n"), {"task=classify", "family bert"});
  ExpectError(Parse(std::string(kBert) + "task: classify\n"), {"task=classify", "num_labels > 0"});
  ExpectError(Parse(std::string(kBert) + "  num_labels: 2\ntask: mlm\n"), {"task=mlm", "num_labels 0"});
  ExpectError(Parse(std::string(kBert) + "task: lm\n"), {"task=lm", "mlm", "classify"});
  ExpectError(Parse(std::string(kBert) + "task: regression\n"), {"task", "regression", "lm, mlm, classify"});
  ExpectError(Parse(std::string(kBert) + "task: mlm\nmlm: {mask_id: 5000}\n"), {"mlm.mask_id=5000", "vocab_size=1200"});
  ExpectError(Parse(std::string(kBert) + "mlm: {probability: 0}\n"), {"probability"});
  ExpectError(Parse(std::string(kBert) + "mlm: {mask: 3}\n"), {"mask"});
}

}  // namespace
}  // namespace l2l

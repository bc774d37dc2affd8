// Tests for eps_server/export_choice.h: the Export rpc's format / dtype / merge choice
// against the job. A LoRA job exports peft, gguf-lora, or safetensors | hf | gguf with
// merge; refuses the whole-model formats without merge naming --merge and --format peft;
// a job without LoRA refuses peft, gguf-lora and merge; the dtypes each format takes.
#include <string>

#include <catch2/catch.hpp>

#include "eps_server/export_choice.h"

namespace l2l {
namespace {

Result<ExportChoice> Choose(const std::string& format, bool merge, bool lora, const std::string& dtype = "") {
  return ParseExportChoice({format, dtype, 0, merge}, lora);
}

void ExpectRefused(const Result<ExportChoice>& r, StatusCode code, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(r.ok());
  INFO("message: " << r.status().ToString());
  CHECK(r.status().code() == code);
  for (const std::string& n : needles) CHECK(r.status().message().find(n) != std::string::npos);
}

TEST_CASE("Export choice: a LoRA job exports its adapter, or the merged model with merge", "[eps][export][lora]") {
  for (const char* f : {"peft", "gguf-lora"}) {
    Result<ExportChoice> c = Choose(f, false, true);
    INFO(f << ": " << c.status().ToString());
    REQUIRE(c.ok());
    CHECK(std::string(ToString(c->format)) == f);
    CHECK_FALSE(c->merge);
  }
  for (const char* f : {"", "safetensors", "hf", "gguf"}) {
    Result<ExportChoice> c = Choose(f, true, true);
    INFO(f << ": " << c.status().ToString());
    REQUIRE(c.ok());
    CHECK(c->merge);
    ExpectRefused(Choose(f, false, true), StatusCode::kFailedPrecondition,
                  {"this is a LoRA job", "--merge", "--format peft", "--format gguf-lora"});
  }
  ExpectRefused(Choose("peft", true, true), StatusCode::kInvalidArgument,
                {"--merge applies to --format safetensors, hf or gguf", "--format peft writes the LoRA adapter alone"});
  ExpectRefused(Choose("gguf-lora", true, true), StatusCode::kInvalidArgument, {"--format gguf-lora"});
}

TEST_CASE("Export choice: a job without LoRA refuses peft, gguf-lora and merge", "[eps][export][lora]") {
  for (const char* f : {"", "safetensors", "hf", "gguf"}) {
    CHECK(Choose(f, false, false).ok());
    ExpectRefused(Choose(f, true, false), StatusCode::kFailedPrecondition,
                  {"--merge merges a LoRA job's adapters", "no lora: section", "without --merge"});
  }
  ExpectRefused(Choose("peft", false, false), StatusCode::kFailedPrecondition,
                {"--format peft writes a LoRA adapter", "no lora: section", "--format safetensors, hf or gguf"});
  ExpectRefused(Choose("gguf-lora", false, false), StatusCode::kFailedPrecondition, {"--format gguf-lora"});
  ExpectRefused(Choose("lora", false, false), StatusCode::kInvalidArgument,
                {"format 'lora' must be safetensors, hf, gguf, peft or gguf-lora"});
}

TEST_CASE("Export choice: dtypes per format, max_shard_bytes for hf only", "[eps][export][lora]") {
  CHECK(Choose("peft", false, true, "f32").ok());
  ExpectRefused(Choose("peft", false, true, "bf16"), StatusCode::kInvalidArgument, {"PEFT adapter is written in f32"});
  for (auto [d, t] : {std::pair<const char*, formats::GgmlType>{"f32", formats::GgmlType::kF32},
                      {"f16", formats::GgmlType::kF16},
                      {"bf16", formats::GgmlType::kBF16}}) {
    Result<ExportChoice> c = Choose("gguf-lora", false, true, d);
    REQUIRE(c.ok());
    CHECK(c->type == t);
  }
  ExpectRefused(Choose("gguf-lora", false, true, "q8_0"), StatusCode::kInvalidArgument, {"f32, f16 or bf16"});
  Result<ExportChoice> q = Choose("gguf", true, true, "q4_k_m");
  REQUIRE(q.ok());
  CHECK(q->q4_k_m);
  Result<ExportChoice> b = Choose("hf", true, true, "bf16");
  REQUIRE(b.ok());
  CHECK(b->dtype() == DType::kBF16);
  ExpectRefused(Choose("safetensors", false, false, "q8_0"), StatusCode::kInvalidArgument, {"must be f32 or bf16"});
  CHECK(ParseExportChoice({"hf", "", 1000, true}, true).ok());
  ExpectRefused(ParseExportChoice({"peft", "", 1000, false}, true), StatusCode::kInvalidArgument,
                {"applies to format hf only"});
}

}  // namespace
}  // namespace l2l

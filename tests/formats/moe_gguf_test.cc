// A llama-architecture GGUF file of a mixture-of-experts model (llama.cpp's Mixtral files:
// <arch>.expert_count > 0, 3-D ffn_*_exps tensors) is refused by name when it is opened,
// instead of being read as a dense model whose MLP tensors are then missing.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/formats/gguf.h"
#include "common/formats/gguf_writer.h"
#include "common/formats/model_reader.h"
#include "tests/testing/temp_dir.h"

namespace l2l::formats {
namespace {

TEST_CASE("A mixture-of-experts GGUF file is refused, naming expert_count", "[formats][gguf][moe]") {
  testing::TempDir dir;
  GgufWriter w;
  w.Set("general.architecture", GgufValue::String("llama"));
  w.Set("llama.block_count", GgufValue::U32(1));
  w.Set("llama.embedding_length", GgufValue::U32(8));
  w.Set("llama.expert_count", GgufValue::U32(8));
  w.Set("llama.expert_used_count", GgufValue::U32(2));
  std::vector<float> table(4 * 8, 0.5f);
  REQUIRE(w.AddTensor({"token_embd.weight", {4, 8}, GgmlType::kF32, table.data(), nullptr}).ok());
  const std::string path = dir.File("mixtral.gguf");
  REQUIRE(w.Write(path).ok());
  auto r = ModelReader::Open(path);
  REQUIRE_FALSE(r.ok());
  INFO(r.status().ToString());
  CHECK(r.status().code() == StatusCode::kUnimplemented);
  CHECK(r.status().ToString().find("llama.expert_count=8") != std::string::npos);
  CHECK(r.status().ToString().find(path) != std::string::npos);
}

}  // namespace
}  // namespace l2l::formats

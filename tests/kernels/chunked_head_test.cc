// The chunked LM head (kernels/layers/layers.h): the head's logits, softmax cross-entropy
// and backward computed ws.head_rows() rows at a time equal the head with all B*T rows in
// one chunk, for GPT-2 (tied), Llama (untied) and BERT's masked-LM head (logits bias), at
// chunk sizes that divide B*T and that do not (1, 4, 7, N-1), with loss-masked targets.
// The unchunked head is itself checked against a double-precision reference and finite
// differences in layers_test.cc; here the oracle is that head. Tolerances: the only
// difference is the order of the sums over rows in dW and the bias gradient (chunk by
// chunk instead of one GEMM), so fp32 rounding: rtol 1e-5, atol 1e-7 on gradients and
// probabilities, 1e-6 relative on the loss. Also: the workspace holds head_rows x V
// logits, and L2L_HEAD_CHUNK_MB sets the rows (CPU backend).
#include <catch2/catch.hpp>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "tests/testing/head_run.h"
#include "tests/testing/scoped_env.h"

namespace l2l::layers {
namespace {

using testing::ExpectSameHead;
using testing::HeadCases;
using testing::RunHead;

TEST_CASE("A chunked LM head equals the one-chunk head for every head kind", "[layers][head]") {
  auto be = kernels::CreateCpuBackend(2);
  const int64_t B = 2, T = 9, N = B * T;
  for (const testing::HeadCase& c : HeadCases()) {
    const testing::HeadResult whole = RunHead(*be, c, B, T, N, 5);
    for (int64_t rows : {int64_t{1}, int64_t{4}, int64_t{7}, N - 1}) {
      const testing::HeadResult chunked = RunHead(*be, c, B, T, rows, 5);
      ExpectSameHead(chunked, whole, 1e-6, 1e-7, 1e-5, c.name + ", " + std::to_string(rows) + " rows per chunk");
    }
  }
}

TEST_CASE("The head's workspace holds head_rows x V logits, set by L2L_HEAD_CHUNK_MB", "[layers][head]") {
  auto be = kernels::CreateCpuBackend(1);
  ModelSpec spec = HeadCases()[1].spec;  // llama, untied
  spec.vocab_size = 1000;
  const int64_t B = 2, T = 12, N = B * T;
  {
    auto ws = LayerWorkspace::Create(be.get(), spec, B, T, 5);
    REQUIRE(ws.ok());
    CHECK(ws->head_rows() == 5);
    CHECK(ws->logits.bytes() == 5 * 1000 * sizeof(float));
  }
  {
    testing::ScopedEnv env("L2L_HEAD_CHUNK_MB", "");  // default 256 MiB: all 24 rows fit
    auto rows = HeadChunkRows(spec, N);
    REQUIRE(rows.ok());
    CHECK(*rows == N);
  }
  {
    testing::ScopedEnv env("L2L_HEAD_CHUNK_MB", "1");
    // 1 MiB of fp32 rows of 1000: 262 rows; of Qwen2.5's 152,064: 1 row.
    CHECK(*HeadChunkRows(spec, 100000) == (1 << 20) / 4000);
    spec.vocab_size = 152064;
    CHECK(*HeadChunkRows(spec, 100000) == 1);
    auto ws = LayerWorkspace::Create(be.get(), spec, B, T);
    REQUIRE(ws.ok());
    CHECK(ws->head_rows() == 1);
    CHECK(ws->logits.bytes() == 152064 * sizeof(float));
  }
  {
    testing::ScopedEnv env("L2L_HEAD_CHUNK_MB", "0");
    auto rows = HeadChunkRows(spec, N);
    REQUIRE_FALSE(rows.ok());
    CHECK(rows.status().message().find("L2L_HEAD_CHUNK_MB") != std::string::npos);
    CHECK_FALSE(LayerWorkspace::Create(be.get(), spec, B, T).ok());
  }
}

}  // namespace
}  // namespace l2l::layers

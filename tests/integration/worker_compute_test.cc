// l2l-worker --compute (worker/worker_main.cc) through real processes: a CPU worker with
// --compute bf16 trains a job against l2l-eps with the bf16 GEMM backend where the CPU
// has AVX512_BF16, and a worker that cannot run bf16 (L2L_CPU_ISA=avx2 caps the ISA, as
// on a CPU without it) exits 1 with a message naming the missing ISA BEFORE it registers
// with the daemon (the daemon still sees no worker); a junk value is refused the same
// way. On a CPU without AVX512_BF16 the training half runs with L2L_CPU_BF16_FALLBACK=1
// (oneDNN's AVX-512 emulation of bf16), or is counted as skipped where oneDNN cannot
// (tests/testing/cpu_bf16_mode.h).
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/integration/harness.h"
#include "tests/testing/cpu_bf16_mode.h"
#include "tests/testing/scoped_env.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;

TEST_CASE("l2l-worker --compute bf16 trains on an AVX512_BF16 cpu and is refused before registering elsewhere",
          "[integration][worker][bf16]") {
  auto dir = TempDir::Create("worker-compute");
  REQUIRE(dir.ok());
  auto job = SmallOpsJob(**dir);
  REQUIRE(job.ok());
  auto eps = EpsDaemon::Start(*job, DaemonOptions{}, **dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());

  auto refused = [&](const std::string& tag, const std::vector<std::string>& extra) {
    auto w = StartWorker((*eps)->address(), "w-" + tag, (*dir)->File("worker-" + tag + ".log"), extra);
    REQUIRE(w.ok());
    auto code = (*w)->Wait(60s);
    REQUIRE(code.ok());
    const std::string log = (*w)->Log();
    INFO(log);
    CHECK(*code == 1);
    CHECK(log.find("registered as worker") == std::string::npos);
    return log;
  };
  {
    testing::ScopedEnv isa("L2L_CPU_ISA", "avx2");
    const std::string log = refused("isa", {"--compute", "bf16"});
    CHECK(log.find("AVX512_BF16") != std::string::npos);
  }
  CHECK(refused("junk", {"--compute", "fp16"}).find("--compute fp16") != std::string::npos);
  auto st = (*eps)->GetStatus();
  REQUIRE(st.ok());
  CHECK(st->workers.empty());  // neither refused worker registered

  if (!kernels::CpuHasBf16Gemm()) {
    // Refused without an L2L_CPU_ISA cap too (the worker's own CPU check).
    testing::ScopedEnv off("L2L_CPU_BF16_FALLBACK", "");
    const std::string log = refused("cpu", {"--compute", "bf16"});
    CHECK(log.find("AVX512_BF16") != std::string::npos);
  }
  // Native, or (no AVX512_BF16) the test fallback, set for the worker process too.
  const testing::CpuBf16Mode bf16_mode;
  if (!bf16_mode.runs()) return;
  auto w = StartWorker((*eps)->address(), "w-bf16", (*dir)->File("worker-bf16.log"), {"--compute", "bf16"});
  REQUIRE(w.ok());
  auto code = (*w)->Wait(300s);
  REQUIRE(code.ok());
  const std::string log = (*w)->Log();
  INFO(log);
  CHECK(*code == 0);
  CHECK(log.find("gemm bf16") != std::string::npos);
  const auto progress = ParseProgress(log);
  REQUIRE(progress.size() == static_cast<size_t>(job->train.steps));
  CHECK(progress.back().loss < progress.front().loss);
}

}  // namespace
}  // namespace l2l::itest

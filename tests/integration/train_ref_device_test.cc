// l2l-train-ref --device (worker/reference/train_ref_main.cc): `cpu` (the default) trains; `cuda`
// trains on a host with a GPU in a CUDA build, and otherwise fails at once with exit
// status 1 and a message saying which is missing (no CUDA in this build / no usable
// GPU); an unknown device is rejected. The binary runs as a child process, as an
// operator runs it.
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#ifdef L2L_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;

struct RunResult {
  int exit_code = -1;
  std::string log;
};

RunResult TrainRef(const TempDir& dir, const std::string& tokens, const std::string& device,
                   const std::string& tag) {
  std::vector<std::string> argv = {BinaryPath("l2l-train-ref"),
                                   "--config", std::string(L2L_SOURCE_DIR) + "/configs/test-tiny.yaml",
                                   "--set", "data.train_path=" + tokens,
                                   "--steps", "2", "--sample-tokens", "0", "--val-batches", "0",
                                   "--threads", "1", "--out", dir.File("out-" + tag)};
  if (!device.empty()) {
    argv.push_back("--device");
    argv.push_back(device);
  }
  auto proc = Process::Spawn(argv, dir.File("train-ref-" + tag + ".log"));
  REQUIRE(proc.ok());
  auto code = (*proc)->Wait(120s);
  INFO((*proc)->LogTail());
  REQUIRE(code.ok());
  return RunResult{*code, (*proc)->Log()};
}

TEST_CASE("l2l-train-ref --device: cpu trains and cuda trains or fails saying why and junk is rejected",
          "[integration][train_ref]") {
  auto dir = TempDir::Create("train-ref-device");
  REQUIRE(dir.ok());
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(4096);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
  const std::string path = (*dir)->File("train.bin");
  REQUIRE(WriteTokens(path, tokens).ok());

  RunResult def = TrainRef(**dir, path, "", "default");
  INFO(def.log);
  CHECK(def.exit_code == 0);
  CHECK(def.log.find("backend cpu") != std::string::npos);

  RunResult cpu = TrainRef(**dir, path, "cpu", "cpu");
  CHECK(cpu.exit_code == 0);
  CHECK(cpu.log.find("backend cpu") != std::string::npos);

  RunResult cuda = TrainRef(**dir, path, "cuda", "cuda");
  INFO(cuda.log);
#ifdef L2L_HAVE_CUDA
  if (kernels::CudaDeviceCount() > 0) {
    CHECK(cuda.exit_code == 0);
    CHECK(cuda.log.find("backend cuda:0") != std::string::npos);
  } else {
    CHECK(cuda.exit_code == 1);
    CHECK(cuda.log.find("--device cuda") != std::string::npos);
    CHECK(cuda.log.find("no usable CUDA driver or GPU") != std::string::npos);
  }
#else
  CHECK(cuda.exit_code == 1);
  CHECK(cuda.log.find("--device cuda") != std::string::npos);
  CHECK(cuda.log.find("no CUDA support") != std::string::npos);
#endif
  // Nothing was trained or written when the device is unusable.
  if (cuda.exit_code != 0) CHECK(cuda.log.find("step 1/") == std::string::npos);

  RunResult junk = TrainRef(**dir, path, "tpu:0", "junk");
  CHECK(junk.exit_code == 1);
  CHECK(junk.log.find("unknown device \"tpu:0\"") != std::string::npos);
}

}  // namespace
}  // namespace l2l::itest

// l2l-bench-bertmem: the L2L paper's memory experiment (BERT-large at 24, 48 and 96
// layers) on the CUDA backend: one relay step per depth, with a fresh backend each time,
// and the device bytes the backend itself accounted (peak of its Alloc()ations plus its
// internal buffers: GEMM workspace, op scratch), next to the host bytes the model and the
// stash need. Depth-flat device memory is the relay's point; the paper's Table 2 numbers
// are printed beside ours by scripts/bert_memory.sh.
//
//   l2l-bench-bertmem [--layers 24,48,96] [--micro-batch 4] [--micro-batches 1]
//                     [--seq-len 512] [--d-model 1024] [--heads 16] [--d-ff 4096]
//                     [--vocab 30522] [--labels 2] [--stash host|device|both]
//                     [--publish f32|bf16]
//
// The EPS here is a shape-only stand-in (ShapeEps below): every block is served from one
// host copy of an initialised block and gradients are dropped, so the host does not need
// the 18 bytes a parameter that a real EPS holds (reported as computed bytes instead).
// Nothing on the device side changes: the relay fetches, computes and stashes exactly as
// against a real EPS. On the CUDA emulator, run it with L2L_CUDA_EMU_SKIP_COMPUTE=1 (the
// script does) so kernels and GEMMs are queued but not executed: allocation is
// independent of the values, and the math of a BERT-large step does not finish on a CPU.
// A benchmark, not a test: it prints numbers and a "json: {...}" line per depth.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/dtype.h"
#include "common/modes.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "worker/eps_client.h"
#include "worker/relay.h"

namespace {

using l2l::Result;
using l2l::Status;
namespace w = l2l::worker;

struct Flags {
  std::string layers = "24,48,96";
  int64_t micro_batch = 4, micro_batches = 1, seq_len = 512, d_model = 1024, heads = 16, d_ff = 4096;
  int64_t vocab = 30522, labels = 2;
  std::string stash = "both";
  std::string publish = "f32";
};

// Serves layer `l` as an initialised buffer of its kind (all blocks share one: they have
// the same shape), always at the version asked for; drops gradients. Thread-safe: its
// buffers are read-only after construction.
class ShapeEps final : public w::EpsClient {
 public:
  explicit ShapeEps(const l2l::JobConfig& job) {
    reg_.worker_id = 0;
    reg_.job = job;
    const auto layouts = l2l::BuildLayout(job.model);
    for (size_t k = 0; k < 3; ++k) {
      const l2l::LayerLayout& layout = k == 0 ? layouts.front() : k == 1 ? layouts[1] : layouts.back();
      std::vector<float> f32(layout.numel);
      l2l::InitLayerParams(job.model, layout, job.train.seed, f32.data());
      if (job.publish_dtype == l2l::DType::kBF16) {
        std::vector<uint16_t> bf(layout.numel);
        for (size_t i = 0; i < bf.size(); ++i) bf[i] = l2l::FloatToBf16(f32[i]);
        bytes_[k].resize(bf.size() * 2);
        std::memcpy(bytes_[k].data(), bf.data(), bytes_[k].size());
      } else {
        bytes_[k].resize(f32.size() * 4);
        std::memcpy(bytes_[k].data(), f32.data(), bytes_[k].size());
      }
      numel_[k] = layout.numel;
    }
    last_ = static_cast<int64_t>(layouts.size()) - 1;
  }
  const w::WorkerRegistration& registration() const override { return reg_; }
  Result<w::LayerWeights> AcquireLayer(int64_t layer, int64_t min_version, std::chrono::milliseconds) override {
    const size_t k = layer == 0 ? 0 : layer == last_ ? 2 : 1;
    w::LayerWeights lw;
    lw.data = bytes_[k].data();
    lw.dtype = reg_.job.publish_dtype;
    lw.numel = numel_[k];
    lw.version = min_version;
    return lw;
  }
  void ReleaseLayer(int64_t) override {}
  Status PushGradient(int64_t, int64_t, int64_t, const float*, size_t) override { return Status::Ok(); }
  Status StepDone(const w::StepReport&) override { return Status::Ok(); }

 private:
  w::WorkerRegistration reg_;
  std::vector<uint8_t> bytes_[3];
  size_t numel_[3] = {};
  int64_t last_ = 0;
};

// Padded classification batches: sequence b keeps T - 16*b real tokens, label b % labels.
std::vector<w::MicroBatch> Batches(const l2l::JobConfig& job) {
  std::vector<w::MicroBatch> out;
  const int64_t B = job.train.micro_batch_size, T = job.seq_len(), NL = job.model.num_labels;
  for (int64_t m = 0; m < job.train.micro_batches; ++m) {
    w::MicroBatch mb;
    mb.B = B;
    mb.T = T;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t real = std::max<int64_t>(1, T - 16 * b);
      for (int64_t t = 0; t < T; ++t) {
        mb.inputs.push_back(static_cast<int32_t>((b * 131 + t * 7 + m) % job.model.vocab_size));
        mb.targets.push_back(NL > 0 ? (t == 0 ? static_cast<int32_t>(b % NL) : -1)
                                    : (t % 7 == 1 && t < real ? mb.inputs.back() : -1));
        mb.token_types.push_back(t >= real / 2 && t < real ? 1 : 0);
        mb.attention_mask.push_back(t < real ? 1 : 0);
      }
    }
    out.push_back(std::move(mb));
  }
  return out;
}

double GiB(double bytes) { return bytes / double(1ull << 30); }

Status RunDepth(const Flags& f, int64_t L, l2l::StashPlacement stash) {
  l2l::JobConfig job;
  job.model.family = l2l::ModelFamily::kBert;
  job.model.vocab_size = f.vocab;
  job.model.seq_len = f.seq_len;
  job.model.d_model = f.d_model;
  job.model.n_layer = L;
  job.model.n_head = f.heads;
  job.model.d_ff = f.d_ff;
  job.model.num_labels = f.labels;
  job.model.tied_embeddings = f.labels == 0;
  job.train.micro_batch_size = f.micro_batch;
  job.train.micro_batches = f.micro_batches;
  job.train.seq_len = f.seq_len;
  job.train.stash = stash;
  job.train.mode = l2l::TrainMode::kSync;
  L2L_ASSIGN_OR_RETURN(job.publish_dtype, l2l::ParseDType(f.publish));
  L2L_RETURN_IF_ERROR(job.Validate());

  L2L_ASSIGN_OR_RETURN(auto backend, l2l::kernels::CreateCudaBackend(0));
  ShapeEps eps(job);
  L2L_ASSIGN_OR_RETURN(w::RelayOptions opts, w::RelayOptions::FromJob(job));
  L2L_ASSIGN_OR_RETURN(auto relay, w::Relay::Create(&eps, backend.get(), job, opts));
  L2L_RETURN_IF_ERROR(relay->RunStep(0, Batches(job)).status());
  backend->Synchronize();
  L2L_ASSIGN_OR_RETURN(l2l::kernels::CudaMemoryStats mem, l2l::kernels::GetCudaMemoryStats(*backend));

  const double params = static_cast<double>(job.model.NumParams());
  // A real EPS: fp32 master + two AdamW moments + the published copy, per parameter.
  const double eps_bytes = params * (4 + 8 + (job.publish_dtype == l2l::DType::kBF16 ? 2 : 4));
  const double peak = static_cast<double>(mem.peak_allocated + mem.internal);
  const double stash_host = static_cast<double>(relay->stash_host_bytes());
  std::printf("layers %3lld  stash %-6s  params %7.1fM  peak device %7.3f GiB (allocations %.3f + internal %.3f)"
              "  relay device %.3f GiB  host stash %.3f GiB  EPS host (computed) %.2f GiB\n",
              (long long)L, l2l::ToString(stash), params / 1e6, GiB(peak), GiB(double(mem.peak_allocated)),
              GiB(double(mem.internal)), GiB(double(relay->device_bytes())), GiB(stash_host), GiB(eps_bytes));
  nlohmann::json j = {{"layers", L},
                      {"stash", l2l::ToString(stash)},
                      {"params", params},
                      {"micro_batch", f.micro_batch},
                      {"micro_batches", f.micro_batches},
                      {"seq_len", f.seq_len},
                      {"peak_device_bytes", peak},
                      {"peak_allocated_bytes", mem.peak_allocated},
                      {"internal_bytes", mem.internal},
                      {"relay_device_bytes", relay->device_bytes()},
                      {"host_stash_bytes", stash_host},
                      {"eps_host_bytes_computed", eps_bytes},
                      {"device", backend->name()}};
  std::printf("json: %s\n", j.dump().c_str());
  std::fflush(stdout);
  return Status::Ok();
}

Status Run(const Flags& f) {
  std::vector<int64_t> depths;
  std::stringstream ss(f.layers);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      depths.push_back(std::stoll(item));
    } catch (const std::exception&) {
      return l2l::InvalidArgument("--layers: '" + item + "' is not a number (expected e.g. 24,48,96)");
    }
  }
  std::vector<l2l::StashPlacement> stashes;
  if (f.stash == "both") {
    stashes = {l2l::StashPlacement::kHost, l2l::StashPlacement::kDevice};
  } else {
    Result<l2l::StashPlacement> s = l2l::ParseStashPlacement(f.stash);
    if (!s.ok()) return s.status().WithContext("--stash");
    stashes = {*s};
  }
  std::printf("BERT: V=%lld T=%lld C=%lld heads=%lld F=%lld labels=%lld; micro-batches %lld of %lld sequences\n",
              (long long)f.vocab, (long long)f.seq_len, (long long)f.d_model, (long long)f.heads, (long long)f.d_ff,
              (long long)f.labels, (long long)f.micro_batches, (long long)f.micro_batch);
  for (l2l::StashPlacement s : stashes) {
    for (int64_t L : depths) L2L_RETURN_IF_ERROR(RunDepth(f, L, s).WithContext("layers " + std::to_string(L)));
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"l2l-bench-bertmem: peak device bytes of a BERT relay step per depth"};
  app.add_option("--layers", f.layers, "comma-separated depths");
  app.add_option("--micro-batch", f.micro_batch, "sequences per micro-batch");
  app.add_option("--micro-batches", f.micro_batches, "micro-batches per step");
  app.add_option("--seq-len", f.seq_len);
  app.add_option("--d-model", f.d_model);
  app.add_option("--heads", f.heads);
  app.add_option("--d-ff", f.d_ff);
  app.add_option("--vocab", f.vocab);
  app.add_option("--labels", f.labels, "0: masked-LM head; > 0: classification");
  app.add_option("--stash", f.stash, "host | device | both");
  app.add_option("--publish", f.publish, "f32 | bf16: the dtype the EPS publishes");
  CLI11_PARSE(app, argc, argv);
  const Status st = Run(f);
  if (!st.ok()) {
    std::fprintf(stderr, "l2l-bench-bertmem: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

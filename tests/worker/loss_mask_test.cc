// Loss masks (supervised fine-tuning: only completion / assistant tokens are trained on):
// the data loader turns a mask file's 0 bytes into kernels::kIgnoreTarget, and the head
// gives those positions no loss and no gradient, averaging over the trained ones.
// Oracle for the gradient: linearity. The gradient of one micro-batch is the mean of its
// positions' gradients, so the sum of single-position gradients over the kept positions,
// divided by their count, must equal the masked gradient; over all positions it must
// equal the unmasked gradient (which ties the single-position runs to the plain path).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/formats/tokens_file.h"
#include "kernels/backend.h"
#include "tests/testing/jobs.h"
#include "worker/data_loader.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::worker {
namespace {

JobConfig MaskJob() {
  return testing::GptJob({64, 8, 16, 1, 2, 32}, {.micro_batch_size = 1, .micro_batches = 1, .seed = 11});
}

std::unique_ptr<ReferenceTrainer> Trainer(const JobConfig& c) {
  ReferenceTrainerOptions o;
  o.num_threads = 1;
  auto t = ReferenceTrainer::Create(c, o);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return std::move(t).value();
}

MicroBatch Batch(const std::vector<int32_t>& in, const std::vector<int32_t>& tgt) {
  MicroBatch mb;
  mb.B = 1;
  mb.T = static_cast<int64_t>(in.size());
  mb.inputs = in;
  mb.targets = tgt;
  return mb;
}

std::vector<std::vector<double>> Grads(ReferenceTrainer& t, const MicroBatch& mb, float* loss) {
  auto l = t.ComputeGradients({mb});
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  if (loss != nullptr) *loss = *l;
  std::vector<std::vector<double>> out;
  for (const auto& g : t.grads()) out.emplace_back(g.begin(), g.end());
  return out;
}

void AddScaled(std::vector<std::vector<double>>* acc, const std::vector<std::vector<double>>& g, double s) {
  if (acc->empty()) {
    for (const auto& layer : g) acc->emplace_back(layer.size(), 0.0);
  }
  for (size_t l = 0; l < g.size(); ++l)
    for (size_t i = 0; i < g[l].size(); ++i) (*acc)[l][i] += s * g[l][i];
}

void RequireClose(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t l = 0; l < a.size(); ++l) {
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < a[l].size(); ++i) {
      max_ref = std::max(max_ref, std::abs(b[l][i]));
      max_err = std::max(max_err, std::abs(a[l][i] - b[l][i]));
    }
    INFO("layer " << l << ": max |diff| " << max_err << " of max |ref| " << max_ref);
    REQUIRE(max_ref > 0);
    REQUIRE(max_err <= 1e-5 * max_ref + 1e-9);
  }
}

}  // namespace

TEST_CASE("a masked target adds no loss and no gradient - the mean is over trained targets", "[loss_mask]") {
  const JobConfig c = MaskJob();
  auto t = Trainer(c);
  const std::vector<int32_t> in = {3, 17, 42, 5, 9, 60, 1, 33};
  const std::vector<int32_t> tgt = {17, 42, 5, 9, 60, 1, 33, 20};
  const std::vector<bool> keep = {false, false, true, false, true, true, false, false};
  const int64_t T = static_cast<int64_t>(in.size());

  std::vector<int32_t> masked = tgt;
  for (int64_t i = 0; i < T; ++i)
    if (!keep[i]) masked[i] = kernels::kIgnoreTarget;
  float masked_loss = 0;
  const auto g_masked = Grads(*t, Batch(in, masked), &masked_loss);
  const auto g_all = Grads(*t, Batch(in, tgt), nullptr);

  // Per-position gradients: only position i trained.
  std::vector<std::vector<double>> sum_kept, sum_all;
  int kept = 0;
  for (int64_t i = 0; i < T; ++i) {
    std::vector<int32_t> one(static_cast<size_t>(T), kernels::kIgnoreTarget);
    one[i] = tgt[i];
    const auto gi = Grads(*t, Batch(in, one), nullptr);
    AddScaled(&sum_all, gi, 1.0 / T);
    if (keep[i]) {
      AddScaled(&sum_kept, gi, 1.0);
      ++kept;
    }
  }
  for (auto& layer : sum_kept)
    for (double& x : layer) x /= kept;
  SECTION("unmasked gradient = mean of the single-position gradients") { RequireClose(sum_all, g_all); }
  SECTION("masked gradient = mean over the kept positions only") { RequireClose(sum_kept, g_masked); }
  SECTION("masked loss = mean of -log p(target) over the kept positions") {
    std::vector<float> probs(static_cast<size_t>(T * c.model.vocab_size));
    REQUIRE(t->Probs(in.data(), 1, T, probs.data()).ok());
    double sum = 0;
    for (int64_t i = 0; i < T; ++i)
      if (keep[i]) sum -= std::log(static_cast<double>(probs[static_cast<size_t>(i * c.model.vocab_size + tgt[i])]));
    REQUIRE(masked_loss == Approx(sum / kept).epsilon(1e-5));
  }
  SECTION("a micro-batch with no trained target has loss 0 and zero gradient") {
    float loss = -1;
    const auto g0 = Grads(*t, Batch(in, std::vector<int32_t>(static_cast<size_t>(T), kernels::kIgnoreTarget)), &loss);
    REQUIRE(loss == 0.0f);
    for (const auto& layer : g0)
      for (double x : layer) REQUIRE(x == 0.0);
  }
}

TEST_CASE("DataLoader applies the mask file beside a tokens file to the targets", "[loss_mask][data_loader]") {
  const auto dir = std::filesystem::temp_directory_path() / ("l2l-mask-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "train.bin").string();
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
  for (uint32_t i = 0; i < 41; ++i) {
    tokens.push_back(70000 + i);  // above uint16: a version-2 file
    mask.push_back(static_cast<uint8_t>((i / 3) % 2));
  }
  REQUIRE(WriteTokensFileForVocab(path, tokens, 80000).ok());
  DataLoaderOptions o;
  o.B = 2;
  o.T = 4;
  o.shuffle = false;
  o.vocab_size = 80000;
  SECTION("without a mask file every target is the next token") {
    auto d = DataLoader::Open(path, o);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    REQUIRE_FALSE(d->has_loss_mask());
    const MicroBatch mb = d->Next();
    for (int64_t i = 0; i < 8; ++i) REQUIRE(mb.targets[i] == mb.inputs[i] + 1);
  }
  SECTION("with one, targets whose mask byte is 0 are ignored") {
    REQUIRE(WriteLossMaskFile(LossMaskPath(path), mask).ok());
    auto d = DataLoader::Open(path, o);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    REQUIRE(d->has_loss_mask());
    int ignored = 0;
    for (int k = 0; k < 3; ++k) {
      const MicroBatch mb = d->Next();
      for (int64_t i = 0; i < 8; ++i) {
        const int64_t target_index = mb.inputs[i] - 70000 + 1;  // position of the target token
        if (mask[target_index] == 0) {
          REQUIRE(mb.targets[i] == kernels::kIgnoreTarget);
          ++ignored;
        } else {
          REQUIRE(mb.targets[i] == mb.inputs[i] + 1);
        }
      }
    }
    REQUIRE(ignored > 0);
  }
  SECTION("a mask of the wrong length is an error naming it") {
    mask.pop_back();
    REQUIRE(WriteLossMaskFile(LossMaskPath(path), mask).ok());
    auto d = DataLoader::Open(path, o);
    REQUIRE_FALSE(d.ok());
    INFO(d.status().ToString());
    REQUIRE(d.status().ToString().find(".mask") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace l2l::worker

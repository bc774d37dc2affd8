// The bf16 GEMM mode's operand copies (kernels/cuda/bf16_operands.h): a GEMM reads the
// bf16 copy that a producer op wrote beside its fp32 output, or that the previous GEMM
// cast, instead of casting again, and never a copy whose source changed since.
// Label gpu (emu on the emulator): fails, never skips, without a device.
//
// Oracle: the same sequence of ops on a second bf16-mode backend with reuse off, which
// casts every operand from its fp32 values at the GEMM (that path is checked against
// host-rounded products in bf16_gemm_test.cc). Reuse must give the same bits, and the
// operand counts (Backend::bf16_operand_stats) say whether a copy was read or cast.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

// One backend and its buffers: the same host data on each of the two backends.
struct Side {
  std::unique_ptr<Backend> be;
  Dev x, w, y, out, mean, rstd, gate_up, dvec, lse;
  Backend::Bf16OperandStats Since(const Backend::Bf16OperandStats& before) const {
    const Backend::Bf16OperandStats now = be->bf16_operand_stats();
    return {now.cast_elements - before.cast_elements, now.reused_elements - before.reused_elements};
  }
};

constexpr int64_t kN = 24, kC = 40, kF = 48;  // rows, model width, hidden width
constexpr int64_t kHs = 64;                    // the attention producers' head size

Side MakeSide(bool reuse, uint32_t seed) {
  std::mt19937 rng(seed);
  Side s;
  s.be = CudaBf16Backend(reuse);
  Backend& be = *s.be;
  s.x = Dev::Of(be, RandomVec(rng, kN * kF));
  s.w = Dev::Of(be, RandomVec(rng, 4 * kF * kF));
  s.y = Dev::Of(be, std::vector<float>(kN * kF));
  s.out = Dev::Of(be, std::vector<float>(kN * 4 * kF));
  s.mean = Dev::Of(be, std::vector<float>(kN));
  s.rstd = Dev::Of(be, std::vector<float>(kN));
  s.gate_up = Dev::Of(be, RandomVec(rng, kN * 2 * kF));
  s.dvec = Dev::Of(be, std::vector<float>(2 * kF));
  s.lse = Dev::Of(be, std::vector<float>(2 * kN));  // the masked form stashes its key mask after it
  return s;
}

// A producer writing s.out (kN rows of `width`) from s.x / s.gate_up / s.w (the backward
// ones' parameter gradients into s.dvec).
struct Producer {
  const char* name;
  int64_t width;  // columns of out
  std::function<void(Side&)> run;
};

// Ordered so that no two in a row write near-identical outputs: a producer that noted a
// copy without writing it would leave the previous one's bits, and the product would differ.
std::vector<Producer> Producers() {
  return {
      {"LayerNormForward", kC,
       [](Side& s) {
         s.be->LayerNormForward(s.out.p(), s.mean.p(), s.rstd.p(), s.x.p(), s.w.p(), s.w.p() + kC, kN, kC);
       }},
      {"RMSNormForward", kC,
       [](Side& s) { s.be->RMSNormForward(s.out.p(), s.rstd.p(), s.x.p(), s.w.p(), kN, kC, 1e-6f); }},
      {"GeluForward", kF, [](Side& s) { s.be->GeluForward(s.out.p(), s.x.p(), kN * kF); }},
      {"LayerNormForwardEps", kC,
       [](Side& s) {
         s.be->LayerNormForwardEps(s.out.p(), s.mean.p(), s.rstd.p(), s.x.p(), s.w.p(), s.w.p() + kC, kN, kC,
                                   1e-12f);
       }},
      {"SwiGLUForward", kF, [](Side& s) { s.be->SwiGLUForward(s.out.p(), s.gate_up.p(), kN, kF); }},
      {"GegluForward", kF, [](Side& s) { s.be->GegluForward(s.out.p(), s.gate_up.p(), kN, kF); }},
      {"LinearForward with GELU", kF,
       [](Side& s) {
         s.be->LinearForward(s.y.p(), s.x.p(), s.w.p(), false, s.w.p() + 5, kN, kF, kF, s.out.p(), nullptr);
       }},
      // The backward ones: activation gradients that two GEMMs (dW, dx) read next.
      {"GeluBackwardBias", kF,
       [](Side& s) { s.be->GeluBackwardBias(s.out.p(), s.dvec.p(), s.x.p(), s.gate_up.p(), kN, kF); }},
      {"LayerNormBackwardResidual", kC,
       [](Side& s) {
         s.be->LayerNormBackwardResidual(s.out.p(), s.dvec.p(), s.dvec.p() + kC, s.gate_up.p(), s.x.p(),
                                         s.gate_up.p(), s.w.p(), s.mean.p(), s.rstd.p(), kN, kC);
       }},
      {"RMSNormBackwardResidual", kC,
       [](Side& s) {
         s.be->RMSNormBackwardResidual(s.out.p(), s.dvec.p(), s.gate_up.p(), s.x.p(), s.gate_up.p(), s.w.p(),
                                       s.rstd.p(), kN, kC);
       }},
      {"SwiGLUBackwardInto", 2 * kF,
       [](Side& s) { s.be->SwiGLUBackwardInto(s.out.p(), s.x.p(), s.gate_up.p(), kN, kF); }},
      // The Llama family's dqkv: RoPE's backward rotates q and k (4 heads of 16) of packed
      // rows of 6 heads in place and writes the whole row's bits, v as it is (cos and sin
      // tables from w); the qkv layer's two GEMMs read it next. Scaled first: v's values
      // are then new too (they would otherwise be the previous producer's output).
      {"RopeBackward", 96,
       [](Side& s) {
         s.be->Scale(s.out.p(), 1.5f, kN * 96);
         s.be->RopeBackward(s.out.p(), s.w.p(), s.w.p() + kN * 8, 1, kN, 96, 4, 16);
       }},
      // Flash attention (the default kind; head size kHs) over kN tokens, qkv from w: the
      // output the projection GEMM reads, and (no RoPE between: GPT-2, BERT) dqkv, which
      // the qkv layer's dW and dx GEMMs read. Each backward follows its forward (it reads
      // the forward's log-sum-exps in lse).
      {"AttentionForward flash", kHs,
       [](Side& s) { s.be->AttentionForward(s.out.p(), s.lse.p(), s.w.p(), 1, kN, kHs, 1); }},
      {"AttentionBackward flash", 3 * kHs,
       [](Side& s) {
         s.be->AttentionBackward(s.out.p(), s.rstd.p(), s.gate_up.p(), s.w.p(), s.lse.p(), 1, kN, kHs, 1);
       }},
      {"AttentionForwardGqa flash", 2 * kHs,
       [](Side& s) { s.be->AttentionForwardGqa(s.out.p(), s.lse.p(), s.w.p(), 1, kN, 2, 1, kHs); }},
      {"AttentionForwardMasked flash", kHs,
       [](Side& s) { s.be->AttentionForwardMasked(s.out.p(), s.lse.p(), s.w.p(), nullptr, 1, kN, kHs, 1); }},
      {"AttentionBackwardMasked flash", 3 * kHs,
       [](Side& s) {
         s.be->AttentionBackwardMasked(s.out.p(), s.rstd.p(), s.gate_up.p(), s.w.p(), s.lse.p(), 1, kN, kHs, 1);
       }},
  };
}

// y (kN, kC) = out (kN, width) @ w (width, kC).
void ProductOfOut(Side& s, int64_t width) {
  s.be->Gemm(false, false, kN, kC, width, 1.0f, s.out.p(), width, s.w.p(), kC, 0.0f, s.y.p(), kC);
}

// The same ops on a backend with reuse on and one with reuse off.
struct OnOff {
  Side on, off;
  void Both(const std::function<void(Side&)>& f) {
    f(on);
    f(off);
  }
  // ProductOfOut (kC columns) on both, equal bits; the elements reuse read from copies.
  int64_t ProductReuse(const char* what) {
    INFO(what);
    const auto b_on = on.be->bf16_operand_stats();
    Both([](Side& s) { ProductOfOut(s, kC); });
    CHECK(on.y.Host(*on.be) == off.y.Host(*off.be));
    return on.Since(b_on).reused_elements;
  }
};

// host's values into dst through a copy queue (as the prefetcher refills a slot), ordered
// after the compute stream's work so far by an event; the caller waits on the host only.
void CopyIn(Side& s, float* dst, const std::vector<float>& host) {
  auto q = s.be->CreateCopyQueue();
  REQUIRE(q.ok());
  auto before = s.be->CreateEvent(), copied = s.be->CreateEvent();
  REQUIRE(before.ok());
  REQUIRE(copied.ok());
  s.be->RecordEvent(before->get());
  (*q)->WaitFor(before->get());
  (*q)->CopyToDevice(dst, host.data(), sizeof(float) * host.size());
  (*q)->Record(copied->get());
  REQUIRE((*copied)->Wait().ok());
}

TEST_CASE("bf16 operand reuse: a GEMM reads the bf16 copy its producer wrote, with the bits a cast gives",
          "[gpu]") {
  Side on = MakeSide(true, 5), off = MakeSide(false, 5);
  for (const Producer& p : Producers()) {
    CAPTURE(p.name);
    const int64_t n = kN * p.width;
    p.run(on);
    p.run(off);
    const auto b_on = on.be->bf16_operand_stats(), b_off = off.be->bf16_operand_stats();
    ProductOfOut(on, p.width);
    ProductOfOut(off, p.width);
    const auto d_on = on.Since(b_on), d_off = off.Since(b_off);
    CHECK(on.y.Host(*on.be) == off.y.Host(*off.be));
    CHECK(on.out.Host(*on.be) == off.out.Host(*off.be));
    CHECK(on.dvec.Host(*on.be) == off.dvec.Host(*off.be));
    CHECK(d_on.reused_elements == n);         // out: the producer's copy
    CHECK(d_on.cast_elements == p.width * kC);  // w: cast
    CHECK(d_off.reused_elements == 0);
    CHECK(d_off.cast_elements == n + p.width * kC);
  }
}

TEST_CASE("bf16 operand reuse: back-to-back GEMMs read one cast of a shared operand", "[gpu]") {
  // A layer backward's pair: dW (F,F) += x^T @ dy, then dx = dy @ W^T; dy cast once.
  Side on = MakeSide(true, 9), off = MakeSide(false, 9);
  auto pair = [](Side& s) {
    const float* dy = s.gate_up.p();  // (kN, kF)
    s.be->Gemm(true, false, kF, kF, kN, 1.0f, s.x.p(), kF, dy, kF, 1.0f, s.w.p(), kF);
    s.be->Gemm(false, true, kN, kF, kF, 1.0f, dy, kF, s.w.p(), kF, 0.0f, s.out.p(), kF);
  };
  const auto b_on = on.be->bf16_operand_stats();
  pair(on);
  pair(off);
  const auto d_on = on.Since(b_on);
  CHECK(on.w.Host(*on.be) == off.w.Host(*off.be));
  CHECK(on.out.Host(*on.be) == off.out.Host(*off.be));
  // Cast: x, dy, then W (the first GEMM wrote it: its earlier copy, if any, is stale).
  CHECK(d_on.cast_elements == 2 * kN * kF + kF * kF);
  CHECK(d_on.reused_elements == kN * kF);
}

TEST_CASE("bf16 operand reuse: a copy whose source was written since is never read", "[gpu]") {
  OnOff t{MakeSide(true, 13), MakeSide(false, 13)};
  const Producer ln = Producers()[0];
  // 1. An op between the producer and the GEMM (in place on the producer's output).
  t.Both(ln.run);
  t.Both([](Side& s) { s.be->Scale(s.out.p(), 3.0f, kN * kC); });
  CHECK(t.ProductReuse("scaled in place after the norm") == 0);
  // 2. A GEMM writing over the source of the copy the previous GEMM cast.
  t.Both(ln.run);
  (void)t.ProductReuse("the norm's copy read");
  t.Both([](Side& s) {  // out (kN, kC) = x[:, :kF] @ w: over the norm's output
    s.be->Gemm(false, false, kN, kC, kF, 1.0f, s.x.p(), kF, s.w.p(), kC, 0.0f, s.out.p(), kC);
  });
  // out cast; w read from the copy the writing GEMM cast (its extent covers this one).
  CHECK(t.ProductReuse("a GEMM wrote over it") == kC * kC);
  // 3. The copy queue writing the source: after the norm (the queue waits for an event
  //    the compute stream recorded, which leaves the copy fresh).
  std::mt19937 rng(3);
  const std::vector<float> fresh = RandomVec(rng, kN * kC);
  //    A transfer elsewhere (the copy queue notes the range it writes) leaves it fresh.
  t.Both(ln.run);
  t.Both([&](Side& s) { CopyIn(s, s.gate_up.p(), fresh); });
  CHECK(t.ProductReuse("the copy queue wrote another buffer") == kN * kC);
  t.Both(ln.run);
  t.Both([&](Side& s) { CopyIn(s, s.out.p(), fresh); });
  CHECK(t.ProductReuse("the copy queue wrote it") == 0);
  const std::vector<float> now = t.on.out.Host(*t.on.be);
  CHECK(std::vector<float>(now.begin(), now.begin() + kN * kC) == fresh);
  // 4. Nothing in between: read (the case the others are measured against).
  t.Both(ln.run);
  CHECK(t.ProductReuse("nothing in between") == kN * kC);
}

TEST_CASE("bf16 operand reuse: a held copy outlives other ops until its source is written or it is released",
          "[gpu]") {
  // Backend::HoldBf16Copy: a block's activation that its backward's weight-gradient GEMMs
  // read after the rest of the backward ran. Its producer's copy stays fresh across other
  // ops and a Copy2D into it (which writes the bits too); a GEMM, a copy-queue transfer or
  // a producer writing over (part of) its source makes it stale, and a release ends it.
  OnOff t{MakeSide(true, 17), MakeSide(false, 17)};
  const Producer ln = Producers()[0];  // LayerNormForward: out (kN, kC)
  auto other_ops = [&] {  // ops that write elsewhere (each makes every unheld copy stale)
    t.Both([](Side& s) {
      s.be->Scale(s.gate_up.p(), 0.5f, kN * 2 * kF);
      s.be->GeluForward(s.y.p(), s.x.p(), kN * kC);  // a producer of another buffer
      s.be->Gemm(false, false, kN, kF, kF, 1.0f, s.x.p(), kF, s.w.p() + kF * kF, kF, 0.0f, s.gate_up.p(), kF);
    });
  };
  t.Both([](Side& s) { s.be->HoldBf16Copy(s.out.p(), kN * kC); });
  // 1. Produced, then other ops: read, and read again.
  t.Both(ln.run);
  other_ops();
  CHECK(t.ProductReuse("held, after other ops") == kN * kC);
  other_ops();
  CHECK(t.ProductReuse("held, read a second time") == kN * kC);
  // 1b. Part of it, at an offset of 128 elements (a cast copy's alignment: read) and of one
  //     row (40 elements: cast, as for a slot's copy).
  auto part_reuse = [&](int64_t offset) {
    const auto b_on = t.on.be->bf16_operand_stats();
    t.Both([offset](Side& s) {
      s.be->Gemm(false, false, 16, kC, kC, 1.0f, s.out.p() + offset, kC, s.w.p(), kC, 0.0f, s.y.p(), kC);
    });
    CHECK(t.on.y.Host(*t.on.be) == t.off.y.Host(*t.off.be));
    return t.on.Since(b_on).reused_elements;
  };
  CHECK(part_reuse(128) == 16 * kC);
  CHECK(part_reuse(kC) == 0);
  // 2. A GEMM writes over the source: cast, until its producer writes it again.
  t.Both([](Side& s) { s.be->Gemm(false, false, kN, kC, kF, 1.0f, s.x.p(), kF, s.w.p(), kC, 0.0f, s.out.p(), kC); });
  other_ops();
  CHECK(t.ProductReuse("a GEMM wrote over it") == 0);
  t.Both(ln.run);
  other_ops();
  CHECK(t.ProductReuse("produced again") == kN * kC);
  // 3. A producer writes part of it (another extent): stale.
  t.Both([](Side& s) { s.be->GeluForward(s.out.p(), s.x.p(), kN * kC / 2); });
  other_ops();
  CHECK(t.ProductReuse("a producer wrote half of it") == 0);
  // 3b. A Copy2D into it (as a q/k norm's gradient goes back into dqkv) writes the bits
  //     too: fresh, with the new values; one reaching past its extent makes it stale.
  t.Both(ln.run);
  t.Both([](Side& s) { s.be->Copy2D(s.out.p() + 8, kC, s.x.p(), kF, kN, 16); });
  other_ops();
  CHECK(t.ProductReuse("a Copy2D wrote into it") == kN * kC);
  t.Both([](Side& s) { s.be->Copy2D(s.out.p() + kC, kC, s.x.p(), kF, kN, 16); });  // one row past the end
  other_ops();
  CHECK(t.ProductReuse("a Copy2D wrote into it and past its end") == 0);
  //     A Copy2D into it while it is stale leaves it stale.
  t.Both([](Side& s) { s.be->Copy2D(s.out.p() + 8, kC, s.x.p(), kF, kN, 16); });
  other_ops();
  CHECK(t.ProductReuse("a Copy2D wrote into it while stale") == 0);
  //     Plain writes (Zero, Add, Scale, ...) break the caller's promise; they make it stale.
  t.Both(ln.run);
  t.Both([](Side& s) { s.be->Scale(s.out.p() + 5, 2.0f, 3); });
  other_ops();
  CHECK(t.ProductReuse("scaled in place") == 0);
  // 4. The copy queue writes it: stale.
  t.Both(ln.run);
  std::mt19937 rng(7);
  const std::vector<float> fresh = RandomVec(rng, kN * kC);
  t.Both([&](Side& s) { CopyIn(s, s.out.p(), fresh); });
  other_ops();
  CHECK(t.ProductReuse("the copy queue wrote it") == 0);
  // 5. A hold of another extent than its producer writes is never filled.
  t.Both([](Side& s) { s.be->HoldBf16Copy(s.out.p(), kN * kF); });
  t.Both(ln.run);
  other_ops();
  CHECK(t.ProductReuse("held at another extent") == 0);
  // 6. Released: its producer's copy is an ordinary one again (stale after other ops).
  t.Both([](Side& s) { s.be->HoldBf16Copy(s.out.p(), kN * kC); });
  t.Both(ln.run);
  t.Both([](Side& s) { s.be->ReleaseBf16Copy(s.out.p()); });
  other_ops();
  CHECK(t.ProductReuse("released") == 0);
  t.Both(ln.run);
  other_ops();
  CHECK(t.ProductReuse("produced after the release") == 0);
  CHECK(t.off.be->bf16_operand_stats().reused_elements == 0);
}

}  // namespace
}  // namespace l2l::gpu_test

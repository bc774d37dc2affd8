// LoRA adapters beside a block's linears. See kernels/layers/lora.h.
#include "kernels/layers/lora.h"

#include <algorithm>
#include <string>

#include "common/logging.h"
#include "common/lora.h"
#include "common/rng.h"
#include "kernels/layers/registry.h"

namespace l2l::layers {
namespace {

struct Adapter {
  const ParamInfo* a = nullptr;  // (r, in)
  const ParamInfo* b = nullptr;  // (out, r)
};

Adapter Find(const LayerLayout& layout, const char* weight) {
  Adapter ad;
  if (layout.lora_r <= 0) return ad;
  std::string module(weight);
  module.resize(module.size() - 7);  // drop ".weight"
  ad.a = layout.Find(module + ".lora_A.weight");
  if (ad.a != nullptr) ad.b = layout.Find(module + ".lora_B.weight");
  L2L_CHECK(ad.a == nullptr || ad.b != nullptr) << "layer " << layout.index << ": " << module
                                                 << " has lora_A but no lora_B";
  return ad;
}

void CheckScratch(const LayerWorkspace& ws, int64_t N, int64_t r, int64_t in) {
  const size_t need = static_cast<size_t>(N * r) * sizeof(float);
  L2L_CHECK(ws.lora_u.bytes() >= need && ws.lora_t.bytes() >= need)
      << "LoRA scratch holds " << ws.lora_u.bytes() << " bytes, needs " << need
      << " (call ReserveLoraScratch after creating the workspace)";
  if (ws.lora_dropout.p > 0) {
    const size_t x_need = static_cast<size_t>(N * in) * sizeof(float);
    L2L_CHECK(ws.lora_x.bytes() >= x_need)
        << "LoRA dropout scratch holds " << ws.lora_x.bytes() << " bytes, needs " << x_need
        << " (call ReserveLoraScratch with the job's lora.dropout)";
  }
}

// The dropout mask of this call (common/lora.h LoraDropoutStream): stream, threshold, scale.
struct Mask {
  uint64_t stream = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
};

Mask MaskOf(const LayerLayout& layout, const char* weight, const LoraDropout& d) {
  return {LoraDropoutStream(d.seed, d.step, layout.block, d.micro_batch, weight), DropoutThreshold(d.p),
          static_cast<float>(1.0 / (1.0 - d.p))};
}

}  // namespace

Status ReserveLoraScratch(kernels::Backend* backend, const std::vector<LayerLayout>& layouts, LayerWorkspace* ws,
                          double dropout) {
  int64_t r = 0, in = 0;
  for (const LayerLayout& l : layouts) {
    r = std::max(r, l.lora_r);
    for (const ParamInfo& p : l.params) {
      if (l.lora_r > 0 && p.name.ends_with(".lora_A.weight")) in = std::max(in, p.shape[1]);
    }
  }
  if (r == 0) return Status::Ok();
  const size_t N = static_cast<size_t>(ws->B() * ws->T());
  const size_t bytes = N * static_cast<size_t>(r) * sizeof(float);
  L2L_RETURN_IF_ERROR(AllocInto(backend, &ws->lora_u, bytes));
  L2L_RETURN_IF_ERROR(AllocInto(backend, &ws->lora_t, bytes));
  if (dropout > 0) L2L_RETURN_IF_ERROR(AllocInto(backend, &ws->lora_x, N * static_cast<size_t>(in) * sizeof(float)));
  return Status::Ok();
}

bool HasLora(const LayerLayout& layout, const char* weight) { return Find(layout, weight).a != nullptr; }

void LoraForward(kernels::Backend& be, const LayerLayout& layout, const float* params, const char* weight,
                 const float* x, int64_t ldx, int64_t N, float* y, int64_t ldy, int64_t col, LayerWorkspace& ws) {
  const Adapter ad = Find(layout, weight);
  if (ad.a == nullptr) return;
  const int64_t r = ad.a->shape[0], in = ad.a->shape[1], out = ad.b->shape[0];
  CheckScratch(ws, N, r, in);
  if (ws.lora_dropout.p > 0) {  // the adapter reads dropout(x) (N, in) from lora_x
    const Mask m = MaskOf(layout, weight, ws.lora_dropout);
    be.CounterDropout(ws.lora_x.f32(), in, x, ldx, N, in, m.stream, m.threshold, m.scale, /*accumulate=*/false);
    x = ws.lora_x.f32();
    ldx = in;
  }
  float* u = ws.lora_u.f32();
  be.Gemm(false, true, N, r, in, 1.0f, x, ldx, params + ad.a->offset, in, 0.0f, u, r);  // u (N,r) = x A^T
  be.Gemm(false, true, N, out, r, layout.lora_scale, u, r, params + ad.b->offset, r, 1.0f, y + col, ldy);
}

void LoraBackward(kernels::Backend& be, const LayerLayout& layout, const float* params, float* dparams,
                  const char* weight, const float* x, int64_t ldx, const float* dy, int64_t ldy, int64_t col,
                  float* dx, int64_t N, LayerWorkspace& ws) {
  const Adapter ad = Find(layout, weight);
  if (ad.a == nullptr) return;
  const int64_t r = ad.a->shape[0], in = ad.a->shape[1], out = ad.b->shape[0];
  const float s = layout.lora_scale;
  CheckScratch(ws, N, r, in);
  const bool dropped = ws.lora_dropout.p > 0;
  const Mask m = dropped ? MaskOf(layout, weight, ws.lora_dropout) : Mask{};
  const float* xa = x;  // the adapter's input: x, or dropout(x) regenerated from the forward's key
  int64_t lda = ldx;
  if (dropped) {
    be.CounterDropout(ws.lora_x.f32(), in, x, ldx, N, in, m.stream, m.threshold, m.scale, /*accumulate=*/false);
    xa = ws.lora_x.f32();
    lda = in;
  }
  float* u = ws.lora_u.f32();
  float* t = ws.lora_t.f32();
  const float* A = params + ad.a->offset;
  const float* B = params + ad.b->offset;
  be.Gemm(false, true, N, r, in, 1.0f, xa, lda, A, in, 0.0f, u, r);                 // u (N,r) = xa A^T
  be.Gemm(false, false, N, r, out, 1.0f, dy + col, ldy, B, r, 0.0f, t, r);          // t (N,r) = dy B
  be.Gemm(true, false, out, r, N, s, dy + col, ldy, u, r, 1.0f, dparams + ad.b->offset, r);  // dB (out,r) +=
  be.Gemm(true, false, r, in, N, s, t, r, xa, lda, 1.0f, dparams + ad.a->offset, in);        // dA (r,in) +=
  if (dx == nullptr) return;
  if (!dropped) {
    be.Gemm(false, false, N, in, r, s, t, r, A, in, 1.0f, dx, ldx);  // dx (N,in) += s t A
    return;
  }
  // dx += mask * scale * (s t A): the gradient through the dropout, the same mask.
  be.Gemm(false, false, N, in, r, s, t, r, A, in, 0.0f, ws.lora_x.f32(), in);
  be.CounterDropout(dx, ldx, ws.lora_x.f32(), in, N, in, m.stream, m.threshold, m.scale, /*accumulate=*/true);
}

}  // namespace l2l::layers

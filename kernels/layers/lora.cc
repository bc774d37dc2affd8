// LoRA adapters beside a block's linears. See kernels/layers/lora.h.
#include "kernels/layers/lora.h"

#include <algorithm>
#include <string>

#include "common/logging.h"
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

void CheckScratch(const LayerWorkspace& ws, int64_t N, int64_t r) {
  const size_t need = static_cast<size_t>(N * r) * sizeof(float);
  L2L_CHECK(ws.lora_u.bytes() >= need && ws.lora_t.bytes() >= need)
      << "LoRA scratch holds " << ws.lora_u.bytes() << " bytes, needs " << need
      << " (call ReserveLoraScratch after creating the workspace)";
}

}  // namespace

Status ReserveLoraScratch(kernels::Backend* backend, const std::vector<LayerLayout>& layouts, LayerWorkspace* ws) {
  int64_t r = 0;
  for (const LayerLayout& l : layouts) r = std::max(r, l.lora_r);
  if (r == 0) return Status::Ok();
  const size_t bytes = static_cast<size_t>(ws->B() * ws->T() * r) * sizeof(float);
  L2L_RETURN_IF_ERROR(AllocInto(backend, &ws->lora_u, bytes));
  return AllocInto(backend, &ws->lora_t, bytes);
}

bool HasLora(const LayerLayout& layout, const char* weight) { return Find(layout, weight).a != nullptr; }

void LoraForward(kernels::Backend& be, const LayerLayout& layout, const float* params, const char* weight,
                 const float* x, int64_t ldx, int64_t N, float* y, int64_t ldy, int64_t col, LayerWorkspace& ws) {
  const Adapter ad = Find(layout, weight);
  if (ad.a == nullptr) return;
  const int64_t r = ad.a->shape[0], in = ad.a->shape[1], out = ad.b->shape[0];
  CheckScratch(ws, N, r);
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
  CheckScratch(ws, N, r);
  float* u = ws.lora_u.f32();
  float* t = ws.lora_t.f32();
  const float* A = params + ad.a->offset;
  const float* B = params + ad.b->offset;
  be.Gemm(false, true, N, r, in, 1.0f, x, ldx, A, in, 0.0f, u, r);                  // u (N,r) = x A^T
  be.Gemm(false, false, N, r, out, 1.0f, dy + col, ldy, B, r, 0.0f, t, r);          // t (N,r) = dy B
  be.Gemm(true, false, out, r, N, s, dy + col, ldy, u, r, 1.0f, dparams + ad.b->offset, r);  // dB (out,r) +=
  be.Gemm(true, false, r, in, N, s, t, r, x, ldx, 1.0f, dparams + ad.a->offset, in);         // dA (r,in) +=
  if (dx != nullptr) be.Gemm(false, false, N, in, r, s, t, r, A, in, 1.0f, dx, ldx);         // dx (N,in) +=
}

}  // namespace l2l::layers

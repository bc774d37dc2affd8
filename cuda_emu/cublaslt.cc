// CPU emulation of the cuBLASLt subset declared in include/cublasLt.h (what is emulated,
// and how strictly, is described there): handles, descriptors, the heuristic and the
// validation and queueing of cublasLtMatmul; the arithmetic is in cublaslt_gemm.cc.
// Semantics from NVIDIA's cuBLASLt documentation (docs.nvidia.com/cuda/cublas, "Using
// the cuBLASLt API"): column-major operands described by their stored shape,
// D = epilogue(alpha * op(A) op(B) + beta * C + bias), C not read when beta == 0,
// in-place C == D with identical layouts, strided batches.
//
// Ownership: descriptors are heap objects owned by the caller (Create/Destroy); a
// process-wide registry of live objects lets every call reject a destroyed or foreign
// handle. Thread-safety: the registry is mutex-guarded; each object is used by one
// thread at a time, as with the real library; queued GEMMs capture everything by value.
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "l2l_cuda_emu.h"
#include "cuda_emu/cublaslt_gemm.h"

struct cublasLtContext {
  int unused = 0;
};

struct cublasLtMatmulDescOpaque_t {
  int32_t compute = CUBLAS_COMPUTE_32F;
  int32_t scale_type = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: the type of D
};

struct cublasLtMatrixLayoutOpaque_t {
  uint32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint32_t search_mode = 0;
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D; the documented default
  float max_waves = 0.0f;
  uint64_t impl_mask = ~uint64_t{0};
};

namespace {

using l2l_cuda_emu::lt::HasBias;
using l2l_cuda_emu::lt::HasGelu;
using l2l_cuda_emu::lt::HasRelu;
using l2l_cuda_emu::lt::MatmulWork;
using l2l_cuda_emu::lt::Problem;
using l2l_cuda_emu::lt::TypeBytes;

// ---- Live-object registry ------------------------------------------------------------

class Registry {
 public:
  void Add(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(p);
  }
  bool Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.erase(p) == 1;
  }
  bool Has(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(p) == 1;
  }

 private:
  std::mutex mu_;
  std::unordered_set<const void*> live_;  // GUARDED_BY(mu_)
};

Registry& Live() {
  static Registry* r = new Registry;  // never destroyed: usable during static teardown
  return *r;
}

cublasStatus_t Fail(cublasStatus_t st, const char* api, const std::string& what) {
  std::fprintf(stderr, "[cuda_emu] %s: %s (%s)\n", api, what.c_str(), cublasLtGetStatusName(st));
  return st;
}

template <typename T>
cublasStatus_t CreateObject(T** out, const char* api) {
  if (out == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "output pointer is null");
  T* p = new (std::nothrow) T();
  if (p == nullptr) return Fail(CUBLAS_STATUS_ALLOC_FAILED, api, "out of host memory");
  Live().Add(p);
  *out = p;
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T>
cublasStatus_t DestroyObject(T* p, const char* api) {
  if (p == nullptr) return CUBLAS_STATUS_SUCCESS;  // as the library: destroying null is a no-op
  if (!Live().Remove(p)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "object was already destroyed or never created");
  }
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

bool IsLive(const void* p) { return p != nullptr && Live().Has(p); }

// ---- Attributes ----------------------------------------------------------------------

// Where an attribute lives in its object and how many bytes it has; data == nullptr for
// an attribute this emulator does not model.
struct AttrSlot {
  void* data = nullptr;
  size_t size = 0;
  bool known = false;
};

template <typename T>
AttrSlot Slot(T& field) {
  return AttrSlot{&field, sizeof(T), true};
}

AttrSlot DescSlot(cublasLtMatmulDescOpaque_t* d, cublasLtMatmulDescAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return Slot(d->compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return Slot(d->scale_type);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return Slot(d->pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return Slot(d->transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return Slot(d->transb);
    case CUBLASLT_MATMUL_DESC_TRANSC:
      return Slot(d->transc);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return Slot(d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return Slot(d->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return Slot(d->bias_type);
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
    case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE:
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER:
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
      return AttrSlot{nullptr, 0, true};
  }
  return AttrSlot{};
}

AttrSlot LayoutSlot(cublasLtMatrixLayoutOpaque_t* l, cublasLtMatrixLayoutAttribute_t attr) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      return Slot(l->type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return Slot(l->order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return Slot(l->rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return Slot(l->cols);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return Slot(l->ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return Slot(l->batch);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return Slot(l->stride);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
      return AttrSlot{nullptr, 0, true};
  }
  return AttrSlot{};
}

AttrSlot PrefSlot(cublasLtMatmulPreferenceOpaque_t* p, cublasLtMatmulPreferenceAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      return Slot(p->search_mode);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return Slot(p->max_workspace);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return Slot(p->reduction_mask);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return Slot(p->align[0]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return Slot(p->align[1]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return Slot(p->align[2]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return Slot(p->align[3]);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
      return Slot(p->max_waves);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      return Slot(p->impl_mask);
  }
  return AttrSlot{};
}

cublasStatus_t SetAttr(const char* api, const void* obj, AttrSlot slot, int attr, const void* buf,
                       size_t size) {
  if (!IsLive(obj))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "descriptor is null or destroyed");
  if (!slot.known)
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "unknown attribute " + std::to_string(attr));
  if (slot.data == nullptr) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                "attribute " + std::to_string(attr) + " is not emulated (cuda_emu)");
  }
  if (buf == nullptr || size != slot.size) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                "attribute " + std::to_string(attr) + " takes " + std::to_string(slot.size) +
                    " bytes, got " + std::to_string(size) + (buf ? "" : " and a null buffer"));
  }
  std::memcpy(slot.data, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

// Documented contract: sizeInBytes == 0 with sizeWritten set asks for the size; otherwise
// the size must match and buf must be non-null.
cublasStatus_t GetAttr(const char* api, const void* obj, AttrSlot slot, int attr, void* buf,
                       size_t size, size_t* written) {
  if (!IsLive(obj))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "descriptor is null or destroyed");
  if (!slot.known)
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "unknown attribute " + std::to_string(attr));
  if (slot.data == nullptr) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                "attribute " + std::to_string(attr) + " is not emulated (cuda_emu)");
  }
  if (size == 0 && written != nullptr) {
    *written = slot.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != slot.size) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                "attribute " + std::to_string(attr) + " has " + std::to_string(slot.size) +
                    " bytes, buffer of " + std::to_string(size) + (buf ? "" : " is null"));
  }
  std::memcpy(buf, slot.data, size);
  if (written != nullptr) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- Problem validation (shared by the heuristic and matmul) -------------------------

constexpr uint64_t kAlgoMagic = 0x4c324c454d55414cull;  // "L2LEMUAL"

const char* TypeName(uint32_t t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    case CUDA_R_64F:
      return "CUDA_R_64F";
    case CUDA_R_8I:
      return "CUDA_R_8I";
    case CUDA_R_32I:
      return "CUDA_R_32I";
    default:
      return "unknown type";
  }
}

std::string Dims(const char* name, const cublasLtMatrixLayoutOpaque_t* l) {
  return std::string(name) + " " + std::to_string(l->rows) + "x" + std::to_string(l->cols) +
         " ld=" + std::to_string(l->ld) + " batch=" + std::to_string(l->batch) +
         " stride=" + std::to_string(l->stride);
}

cublasStatus_t ValidateProblem(const char* api, const cublasLtMatmulDescOpaque_t* desc,
                               const cublasLtMatrixLayoutOpaque_t* a,
                               const cublasLtMatrixLayoutOpaque_t* b,
                               const cublasLtMatrixLayoutOpaque_t* c,
                               const cublasLtMatrixLayoutOpaque_t* d, Problem* p) {
  if (!IsLive(desc))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "matmul descriptor is null or destroyed");
  const cublasLtMatrixLayoutOpaque_t* layouts[4] = {a, b, c, d};
  const char* names[4] = {"Adesc", "Bdesc", "Cdesc", "Ddesc"};
  for (int i = 0; i < 4; ++i) {
    if (!IsLive(layouts[i])) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  std::string(names[i]) + " is null or destroyed");
    }
    if (layouts[i]->order != CUBLASLT_ORDER_COL) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                  std::string(names[i]) + ": only CUBLASLT_ORDER_COL is emulated");
    }
  }
  // Supported configurations.
  if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api, "only CUBLASLT_POINTER_MODE_HOST is emulated");
  }
  if (desc->scale_type != CUDA_R_32F) {
    return Fail(
        CUBLAS_STATUS_NOT_SUPPORTED, api,
        std::string("scale type ") + TypeName(desc->scale_type) + " (only CUDA_R_32F is emulated)");
  }
  if (desc->transc != CUBLAS_OP_N) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api, "TRANSC must be CUBLAS_OP_N");
  }
  const std::string types = std::string("A ") + TypeName(a->type) + ", B " + TypeName(b->type) +
                            ", C " + TypeName(c->type) + ", D " + TypeName(d->type) + ", compute " +
                            std::to_string(desc->compute);
  const bool fp32 =
      a->type == CUDA_R_32F && b->type == CUDA_R_32F && c->type == CUDA_R_32F &&
      d->type == CUDA_R_32F &&
      (desc->compute == CUBLAS_COMPUTE_32F || desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32);
  const bool bf16 = a->type == CUDA_R_16BF && b->type == CUDA_R_16BF && c->type == d->type &&
                    (d->type == CUDA_R_16BF || d->type == CUDA_R_32F) &&
                    desc->compute == CUBLAS_COMPUTE_32F;
  if (!fp32 && !bf16) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                "unsupported type combination (" + types +
                    "); emulated: all CUDA_R_32F with COMPUTE_32F or 32F_FAST_TF32, or A/B "
                    "CUDA_R_16BF with C=D CUDA_R_16BF or CUDA_R_32F and COMPUTE_32F");
  }
  const uint32_t e = desc->epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && !HasBias(e) && !HasRelu(e) && !HasGelu(e)) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                "epilogue " + std::to_string(e) +
                    " (emulated: DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_BIAS)");
  }
  const uint32_t bias_type =
      desc->bias_type == -1 ? d->type : static_cast<uint32_t>(desc->bias_type);
  if (HasBias(e) && bias_type != d->type) {
    return Fail(
        CUBLAS_STATUS_NOT_SUPPORTED, api,
        std::string("bias type ") + TypeName(bias_type) + " differs from D's " + TypeName(d->type));
  }
  // Shapes.
  const bool ta = desc->transa != CUBLAS_OP_N, tb = desc->transb != CUBLAS_OP_N;
  const uint64_t m = d->rows, n = d->cols;
  const uint64_t k = ta ? a->rows : a->cols;
  const uint64_t a_m = ta ? a->cols : a->rows;
  const uint64_t b_k = tb ? b->cols : b->rows, b_n = tb ? b->rows : b->cols;
  const std::string shapes = std::string("transa=") + (ta ? "T" : "N") +
                             " transb=" + (tb ? "T" : "N") + "; " + Dims("A", a) + ", " +
                             Dims("B", b) + ", " + Dims("C", c) + ", " + Dims("D", d);
  if (c->rows != m || c->cols != n || a_m != m || b_k != k || b_n != n) {
    return Fail(
        CUBLAS_STATUS_INVALID_VALUE, api,
        "inconsistent dimensions: need op(A) m x k, op(B) k x n, C and D m x n (" + shapes + ")");
  }
  constexpr uint64_t kMaxDim = uint64_t{1} << 31;
  for (int i = 0; i < 4; ++i) {
    const auto* l = layouts[i];
    if (l->rows >= kMaxDim || l->cols >= kMaxDim) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                  std::string(names[i]) + " is too large (" + shapes + ")");
    }
    if (l->ld < std::max<int64_t>(1, static_cast<int64_t>(l->rows))) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  std::string(names[i]) + ": ld < rows (" + shapes + ")");
    }
    if (l->batch != d->batch || l->batch < 1) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  "batch counts must be equal and >= 1 (" + shapes + ")");
    }
    if (l->batch > 1 && l->stride < 0) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  std::string(names[i]) + ": negative batch stride (" + shapes + ")");
    }
  }
  if (d->batch > 1 && d->stride < static_cast<int64_t>(d->rows) && m > 0 && n > 0) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                "the batch's output matrices overlap (D stride < rows; " + shapes + ")");
  }
  if (c->type != d->type) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api, "C and D types differ (" + types + ")");
  }
  if (e != CUBLASLT_EPILOGUE_DEFAULT && d->batch > 1) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                "epilogues are emulated for unbatched problems only (" + shapes + ")");
  }
  p->trans_a = ta;
  p->trans_b = tb;
  p->m = static_cast<int64_t>(m);
  p->n = static_cast<int64_t>(n);
  p->k = static_cast<int64_t>(k);
  p->batch = d->batch;
  p->lda = a->ld;
  p->ldb = b->ld;
  p->ldc = c->ld;
  p->ldd = d->ld;
  p->stride_a = a->stride;
  p->stride_b = b->stride;
  p->stride_c = c->stride;
  p->stride_d = d->stride;
  p->ab_type = a->type;
  p->cd_type = d->type;
  p->tf32 = desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  p->epilogue = e;
  p->bias_type = bias_type;
  p->signature = (uint64_t{a->type} << 48) | (uint64_t{d->type} << 32) |
                 (static_cast<uint64_t>(static_cast<uint32_t>(desc->compute)) << 16) | e;
  return CUBLAS_STATUS_SUCCESS;
}

// Largest power of two <= v, capped at 256 (the largest alignment any algorithm needs).
uint64_t PowerOfTwoAtMost(uint64_t v) {
  uint64_t r = 1;
  while (r * 2 <= v && r < 256) r *= 2;
  return r;
}

// Elements spanned by one operand: the whole batch.
uint64_t ExtentElems(int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride) {
  if (rows == 0 || cols == 0) return 0;
  return static_cast<uint64_t>((cols - 1) * ld + rows) +
         static_cast<uint64_t>(batch - 1) * static_cast<uint64_t>(batch > 1 ? stride : 0);
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

}  // namespace

// ---- Public API ----------------------------------------------------------------------

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "there is an error with the license";
  }
  return "unknown error";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  return CreateObject(handle, "cublasLtCreate");
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr)
    return Fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "handle is null");
  return DestroyObject(handle, "cublasLtDestroy");
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  cublasStatus_t st = CreateObject(matmulDesc, "cublasLtMatmulDescCreate");
  if (st == CUBLAS_STATUS_SUCCESS) {
    (*matmulDesc)->compute = computeType;
    (*matmulDesc)->scale_type = scaleType;
  }
  return st;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return DestroyObject(matmulDesc, "cublasLtMatmulDescDestroy");
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes) {
  const char* api = "cublasLtMatmulDescSetAttribute";
  if (!IsLive(matmulDesc))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "descriptor is null or destroyed");
  if ((attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB ||
       attr == CUBLASLT_MATMUL_DESC_TRANSC) &&
      buf != nullptr && sizeInBytes == sizeof(int32_t)) {
    int32_t op;
    std::memcpy(&op, buf, sizeof(op));
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  "operation " + std::to_string(op) + " is not N, T or C");
    }
  }
  return SetAttr(api, matmulDesc, DescSlot(matmulDesc, attr), attr, buf, sizeInBytes);
}
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t sizeInBytes, size_t* sizeWritten) {
  const char* api = "cublasLtMatmulDescGetAttribute";
  if (!IsLive(matmulDesc))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "descriptor is null or destroyed");
  return GetAttr(api, matmulDesc, DescSlot(matmulDesc, attr), attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  cublasStatus_t st = CreateObject(matLayout, "cublasLtMatrixLayoutCreate");
  if (st == CUBLAS_STATUS_SUCCESS) {
    (*matLayout)->type = static_cast<uint32_t>(type);
    (*matLayout)->rows = rows;
    (*matLayout)->cols = cols;
    (*matLayout)->ld = ld;
  }
  return st;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return DestroyObject(matLayout, "cublasLtMatrixLayoutDestroy");
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  const char* api = "cublasLtMatrixLayoutSetAttribute";
  if (!IsLive(matLayout))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "layout is null or destroyed");
  return SetAttr(api, matLayout, LayoutSlot(matLayout, attr), attr, buf, sizeInBytes);
}
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                size_t sizeInBytes, size_t* sizeWritten) {
  const char* api = "cublasLtMatrixLayoutGetAttribute";
  if (!IsLive(matLayout))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "layout is null or destroyed");
  return GetAttr(api, matLayout, LayoutSlot(matLayout, attr), attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return CreateObject(pref, "cublasLtMatmulPreferenceCreate");
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return DestroyObject(pref, "cublasLtMatmulPreferenceDestroy");
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes) {
  const char* api = "cublasLtMatmulPreferenceSetAttribute";
  if (!IsLive(pref))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "preference is null or destroyed");
  return SetAttr(api, pref, PrefSlot(pref, attr), attr, buf, sizeInBytes);
}
cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void* buf, size_t sizeInBytes,
                                                    size_t* sizeWritten) {
  const char* api = "cublasLtMatmulPreferenceGetAttribute";
  if (!IsLive(pref))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "preference is null or destroyed");
  return GetAttr(api, pref, PrefSlot(pref, attr), attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  const char* api = "cublasLtMatmulAlgoGetHeuristic";
  if (returnAlgoCount != nullptr) *returnAlgoCount = 0;
  if (!IsLive(lightHandle))
    return Fail(CUBLAS_STATUS_NOT_INITIALIZED, api, "handle is null or destroyed");
  if (requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                "requestedAlgoCount must be > 0 with non-null result array and count");
  }
  if (!IsLive(preference))
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "preference is null or destroyed");
  Problem p;
  cublasStatus_t st = ValidateProblem(api, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // Real cuBLASLt may have no algorithm for a strided batch (an interleaved one, odd
  // alignments); $L2L_CUDA_EMU_LT_NO_BATCHED=1 answers so for every batch, so callers'
  // fallbacks (kernels/cuda/attention.cc's one GEMM per head) can be tested.
  if (p.batch > 1) {
    const char* no_batched = std::getenv("L2L_CUDA_EMU_LT_NO_BATCHED");
    if (no_batched != nullptr && std::strcmp(no_batched, "1") == 0) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                  "no algorithm for a batch of " + std::to_string(p.batch) +
                      " (L2L_CUDA_EMU_LT_NO_BATCHED=1)");
    }
  }
  const size_t elem[4] = {TypeBytes(p.ab_type), TypeBytes(p.ab_type), TypeBytes(p.cd_type),
                          TypeBytes(p.cd_type)};
  const char* names[4] = {"A", "B", "C", "D"};
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = kAlgoMagic;
  r.algo.data[1] = p.signature;
  for (int i = 0; i < 4; ++i) {
    if (preference->align[i] < elem[i]) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, api,
                  std::string("no algorithm for ") + names[i] + " aligned to only " +
                      std::to_string(preference->align[i]) + " bytes (elements are " +
                      std::to_string(elem[i]) + " bytes)");
    }
    r.algo.data[2 + i] = PowerOfTwoAtMost(preference->align[i]);
  }
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  heuristicResultsArray[0] = r;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  const char* api = "cublasLtMatmul";
  if (!IsLive(lightHandle))
    return Fail(CUBLAS_STATUS_NOT_INITIALIZED, api, "handle is null or destroyed");
  Problem p;
  cublasStatus_t st = ValidateProblem(api, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (alpha == nullptr || beta == nullptr)
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api, "alpha or beta is null");
  MatmulWork w;
  w.p = p;
  std::memcpy(&w.alpha, alpha, sizeof(float));  // host pointer mode: read now
  std::memcpy(&w.beta, beta, sizeof(float));
  w.a = A;
  w.b = B;
  w.c = w.beta != 0.0f ? C : nullptr;
  w.d = D;
  w.bias = HasBias(p.epilogue) ? computeDesc->bias : nullptr;

  // In place: the documented requirement is identical C and D layouts.
  if (C == D && (Cdesc->ld != Ddesc->ld || (p.batch > 1 && Cdesc->stride != Ddesc->stride))) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                "C == D (in place) needs identical C and D layouts");
  }
  uint64_t need_align[4] = {0, 0, 0, 0};  // A, B, C, D; 0: element size only
  if (algo != nullptr) {
    if (algo->data[0] != kAlgoMagic) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  "algo was not returned by cublasLtMatmulAlgoGetHeuristic");
    }
    if (algo->data[1] != p.signature) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  "algo was chosen for other types, compute type or epilogue than this problem");
    }
    for (int i = 0; i < 4; ++i) need_align[i] = algo->data[2 + i];
  }
  struct Operand {
    const char* name;
    const void* ptr;
    int64_t rows, cols, ld, stride;
    uint32_t type;
    bool used;
  };
  const Operand ops[4] = {
      {"A", A, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda, p.stride_a, p.ab_type, p.k > 0},
      {"B", B, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb, p.stride_b, p.ab_type, p.k > 0},
      {"C", C, p.m, p.n, p.ldc, p.stride_c, p.cd_type, w.beta != 0.0f},
      {"D", D, p.m, p.n, p.ldd, p.stride_d, p.cd_type, true}};
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to compute
  for (int i = 0; i < 4; ++i) {
    const Operand& o = ops[i];
    if (!o.used) continue;
    const uint64_t bytes = ExtentElems(o.rows, o.cols, o.ld, p.batch, o.stride) * TypeBytes(o.type);
    if (o.ptr == nullptr || !l2l_cuda_emu::IsDeviceRange(o.ptr, bytes)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  std::string(o.name) + " (" + Hex(o.ptr) + ", " + std::to_string(bytes) +
                      " bytes for " + std::to_string(o.rows) + "x" + std::to_string(o.cols) +
                      " ld=" + std::to_string(o.ld) + " batch=" + std::to_string(p.batch) +
                      " stride=" + std::to_string(o.stride) +
                      ") is not inside one cudaMalloc allocation");
    }
    // Every matrix of the batch must meet the alignment: address and stride in bytes.
    uint64_t addr = reinterpret_cast<uintptr_t>(o.ptr);
    if (p.batch > 1) addr |= static_cast<uint64_t>(o.stride) * TypeBytes(o.type);
    const uint64_t need = std::max<uint64_t>(need_align[i], TypeBytes(o.type));
    if (addr % need != 0) {
      return Fail(
          CUBLAS_STATUS_INVALID_VALUE, api,
          std::string(o.name) + " at " + Hex(o.ptr) +
              (p.batch > 1 ? " with batch stride " + std::to_string(o.stride) : std::string()) +
              " is not aligned to the " + std::to_string(need) +
              " bytes the algorithm was chosen for");
    }
  }
  if (HasBias(p.epilogue)) {
    const uint64_t bytes = static_cast<uint64_t>(p.m) * TypeBytes(p.bias_type);
    if (w.bias == nullptr || !l2l_cuda_emu::IsDeviceRange(w.bias, bytes) ||
        reinterpret_cast<uintptr_t>(w.bias) % TypeBytes(p.bias_type) != 0) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                  "bias epilogue needs BIAS_POINTER to " + std::to_string(p.m) +
                      " aligned elements in one cudaMalloc allocation (got " + Hex(w.bias) + ")");
    }
  }
  if (workspaceSizeInBytes > 0 && !l2l_cuda_emu::IsDeviceRange(workspace, workspaceSizeInBytes)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, api,
                "workspace (" + Hex(workspace) + ", " + std::to_string(workspaceSizeInBytes) +
                    " bytes) is not inside one cudaMalloc allocation");
  }
  const cudaError_t e = l2l_cuda_emu::SkipCompute() ? l2l_cuda_emu::Enqueue(stream, [] {})
                                                   : l2l_cuda_emu::Enqueue(stream, w);
  if (e != cudaSuccess) {
    return Fail(
        CUBLAS_STATUS_EXECUTION_FAILED, api,
        "could not queue on the stream (cudaError " + std::to_string(static_cast<int>(e)) + ")");
  }
  return CUBLAS_STATUS_SUCCESS;
}

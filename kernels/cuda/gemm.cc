// LtGemm: row-major GEMMs on cuBLASLt with cached plans. See gemm.h.
#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"

namespace l2l::kernels::cuda {

struct LtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt operand order
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (c) (void)cublasLtMatrixLayoutDestroy(c);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

size_t DtypeBytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

// Largest power of two (<= 256) dividing both the address and the batch stride in bytes:
// the alignment cuBLASLt may assume for every matrix of the batch.
uint32_t Alignment(const void* p, int64_t stride_elems, int batch, size_t elem_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) v |= static_cast<uint64_t>(stride_elems) * elem_bytes;
  return static_cast<uint32_t>(v & (~v + 1));
}

std::string Shape(const LtGemmArgs& a) {
  return "M=" + std::to_string(a.M) + " N=" + std::to_string(a.N) + " K=" + std::to_string(a.K) +
         " lda=" + std::to_string(a.lda) + " ldb=" + std::to_string(a.ldb) +
         " ldc=" + std::to_string(a.ldc) + " trans_a=" + std::to_string(a.trans_a) +
         " trans_b=" + std::to_string(a.trans_b) + " batch=" + std::to_string(a.batch);
}

Status Validate(const LtGemmArgs& a) {
  if (a.M < 0 || a.N < 0 || a.K <= 0 || a.batch < 1) {
    return InvalidArgument("gemm: negative size, K == 0 or batch < 1 (" + Shape(a) + ")");
  }
  const int64_t a_cols = a.trans_a ? a.M : a.K;  // stored row-major A: (M,K) or (K,M)
  const int64_t b_cols = a.trans_b ? a.K : a.N;  // stored row-major B: (K,N) or (N,K)
  if (a.lda < std::max<int64_t>(1, a_cols) || a.ldb < std::max<int64_t>(1, b_cols) ||
      a.ldc < std::max<int64_t>(1, a.N)) {
    return InvalidArgument("gemm: leading dimension smaller than the row length (need lda >= " +
                           std::to_string(a_cols) + ", ldb >= " + std::to_string(b_cols) +
                           ", ldc >= " + std::to_string(a.N) + "; got " + Shape(a) + ")");
  }
  const bool has_bias = a.epilogue == CUBLASLT_EPILOGUE_BIAS || a.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (has_bias && a.bias == nullptr) return InvalidArgument("gemm: bias epilogue without a bias");
  if (a.epilogue != CUBLASLT_EPILOGUE_DEFAULT && a.batch > 1) {
    return InvalidArgument("gemm: epilogues are for unbatched GEMMs (" + Shape(a) + ")");
  }
  return Status::Ok();
}

}  // namespace

Result<LtGemm> LtGemm::Create(size_t workspace_bytes) {
  LtGemm g;
  L2L_ASSIGN_OR_RETURN(g.handle_, CublasLtHandle::Create());
  L2L_ASSIGN_OR_RETURN(g.workspace_, CudaBuffer::Create(workspace_bytes));
  return g;
}

LtGemm::LtGemm() = default;
LtGemm::~LtGemm() = default;
LtGemm::LtGemm(LtGemm&&) noexcept = default;
LtGemm& LtGemm::operator=(LtGemm&&) noexcept = default;

Result<LtGemm::Plan*> LtGemm::GetPlan(const LtGemmArgs& a) {
  const size_t ab = DtypeBytes(a.ab_type), cb = DtypeBytes(a.c_type);
  // cuBLASLt operand order (column-major view): lt_A = row-major B, lt_B = row-major A.
  const uint32_t align_lt_a = Alignment(a.B, a.stride_b, a.batch, ab);
  const uint32_t align_lt_b = Alignment(a.A, a.stride_a, a.batch, ab);
  const uint32_t align_c = Alignment(a.C, a.stride_c, a.batch, cb);
  Key key{a.trans_a, a.trans_b, a.M, a.N, a.K, a.lda, a.ldb, a.ldc, a.ab_type, a.c_type,
          a.compute, a.epilogue, a.batch, a.stride_a, a.stride_b, a.stride_c,
          align_lt_a, align_lt_b, align_c};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();

  auto plan = std::make_unique<Plan>();
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, a.compute, CUDA_R_32F));
  cublasOperation_t op_lt_a = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_lt_b = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)));
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)));
  cublasLtEpilogue_t epi = a.epilogue;
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));

  // Stored column-major shapes: lt_A is row-major B seen column-major: (N,K) or (K,N);
  // lt_B is row-major A seen column-major: (K,M) or (M,K); C is (N,M).
  const uint64_t a_rows = a.trans_b ? a.K : a.N, a_cols = a.trans_b ? a.N : a.K;
  const uint64_t b_rows = a.trans_a ? a.M : a.K, b_cols = a.trans_a ? a.K : a.M;
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, a.ab_type, a_rows, a_cols, a.ldb));
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, a.ab_type, b_rows, b_cols, a.lda));
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, a.c_type, a.N, a.M, a.ldc));
  if (a.batch > 1) {
    const int32_t batch = a.batch;
    const int64_t strides[3] = {a.stride_b, a.stride_a, a.stride_c};
    cublasLtMatrixLayout_t layouts[3] = {plan->a, plan->b, plan->c};
    for (int i = 0; i < 3; ++i) {
      L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(strides[i])));
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)> pref_owner(
      pref, &cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = workspace_.bytes();
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_lt_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_lt_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
  for (const auto& [attr, value] : aligns) {
    L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_.get(), plan->desc, plan->a, plan->b,
                                                     plan->c, plan->c, pref, 1, &result, &returned);
  if (st != CUBLAS_STATUS_SUCCESS || returned == 0) {
    return NotFound("cuBLASLt has no algorithm for gemm " + Shape(a) +
                    " (heuristic: " + cublasLtGetStatusString(st) + ")");
  }
  plan->algo = result.algo;
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

Status LtGemm::Run(const LtGemmArgs& a, cudaStream_t stream) {
  L2L_RETURN_IF_ERROR(Validate(a));
  if (a.M == 0 || a.N == 0) return Status::Ok();
  L2L_ASSIGN_OR_RETURN(Plan * plan, GetPlan(a));
  if (a.bias != nullptr) {
    L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a.bias, sizeof(a.bias)));
  }
  // Operands swapped for the column-major view (see gemm.h). D aliases C (in place).
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_.get(), plan->desc, &a.alpha, a.B, plan->a, a.A,
                                            plan->b, &a.beta, a.C, plan->c, a.C, plan->c,
                                            &plan->algo, workspace_.data(), workspace_.bytes(),
                                            stream));
  return Status::Ok();
}

}  // namespace l2l::kernels::cuda

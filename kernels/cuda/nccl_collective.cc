// kernels::DeviceCollective over NCCL (kernels/backend.h): one communicator per CUDA
// backend of a device group, made by ncclCommInitAll, its collectives queued in place on
// a CudaCopyQueue's stream. Built with L2L_HAVE_NCCL (NCCL found beside the CUDA toolkit,
// or the emulator's NCCL in -DL2L_CUDA=EMU); without it CreateNcclCollectives says so.
// Ownership: each NcclCollective owns its communicator (destroyed with it).
// Thread-safety: one thread at a time per collective (an NCCL communicator's rule).
#include <atomic>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/copy_queue.h"
#include "kernels/cuda/cuda_backend.h"

#ifdef L2L_HAVE_NCCL
#include <nccl.h>
#endif

namespace l2l::kernels {

#ifdef L2L_HAVE_NCCL
namespace {

Status NcclError(ncclResult_t r, const std::string& what) {
  return Internal(what + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
}

class NcclCollective final : public DeviceCollective {
 public:
  NcclCollective(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclCollective() override {
    if (!aborted_.exchange(true)) (void)ncclCommDestroy(comm_);
  }
  void Abort() override {
    if (!aborted_.exchange(true)) (void)ncclCommAbort(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status AllGather(void* buf, size_t count, DType dtype, CopyQueue* queue) override {
    ncclDataType_t t;
    size_t es;
    switch (dtype) {
      case DType::kF32:
        t = ncclFloat32;
        es = 4;
        break;
      case DType::kBF16:
        t = ncclBfloat16;
        es = 2;
        break;
      default:
        return InvalidArgument(std::string("device all-gather: unsupported dtype ") + DTypeName(dtype));
    }
    L2L_ASSIGN_OR_RETURN(cudaStream_t s, StreamOf(queue));
    char* base = static_cast<char*>(buf);
    const ncclResult_t r = ncclAllGather(base + rank_ * count * es, base, count, t, comm_, s);
    if (r != ncclSuccess) return NcclError(r, "ncclAllGather on cuda:" + std::to_string(device_));
    return Status::Ok();
  }

  Status ReduceScatterSum(float* buf, size_t count, CopyQueue* queue) override {
    L2L_ASSIGN_OR_RETURN(cudaStream_t s, StreamOf(queue));
    const ncclResult_t r = ncclReduceScatter(buf, buf + rank_ * count, count, ncclFloat32, ncclSum, comm_, s);
    if (r != ncclSuccess) return NcclError(r, "ncclReduceScatter on cuda:" + std::to_string(device_));
    return Status::Ok();
  }

 private:
  Result<cudaStream_t> StreamOf(CopyQueue* queue) const {
    auto* q = dynamic_cast<cuda::CudaCopyQueue*>(queue);
    if (q == nullptr) return InvalidArgument("device collective: the queue is not a CUDA copy queue");
    return q->stream();
  }
  ncclComm_t comm_;
  const int rank_, size_, device_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

Result<std::vector<std::unique_ptr<DeviceCollective>>> CreateNcclCollectives(
    const std::vector<Backend*>& backends) {
  std::vector<int> devices;
  for (Backend* b : backends) {
    const int d = b == nullptr ? -1 : CudaBackendDevice(*b);
    if (d < 0) return InvalidArgument("device group: every device must be a CUDA backend");
    for (int e : devices)
      if (e == d) return InvalidArgument("device group: cuda:" + std::to_string(d) + " listed twice");
    devices.push_back(d);
  }
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(n);
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  if (r != ncclSuccess) return NcclError(r, "ncclCommInitAll over " + std::to_string(n) + " devices");
  std::vector<std::unique_ptr<DeviceCollective>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<NcclCollective>(comms[i], i, n, devices[i]));
  return out;
}

#else

Result<std::vector<std::unique_ptr<DeviceCollective>>> CreateNcclCollectives(
    const std::vector<Backend*>&) {
  return Unimplemented("device groups need NCCL, and this build found none (nccl.h / libnccl beside "
                       "the CUDA toolkit); run one worker per GPU instead");
}

#endif

}  // namespace l2l::kernels

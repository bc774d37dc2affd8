// Emulated nccl.h (cuda_emu): the subset of NCCL that kernels/cuda uses, on the CPU
// emulator's devices and streams (nccl.cc). Enum values and signatures are those of the
// real nccl.h (2.x). Semantics:
//  - communicators: ncclCommInitRank joins the clique named by a unique id and blocks
//    until all nranks ranks have joined (as NCCL does; $L2L_NCCL_EMU_TIMEOUT_S, default
//    300, then ncclSystemError); ncclCommInitAll makes one communicator per listed device
//    in one call. A communicator belongs to the device current at its creation.
//  - collectives (ncclAllGather, ncclReduceScatter, ncclAllReduce) are queued on the
//    given stream like a kernel: they start when the stream reaches them, wait there until
//    every rank's matching call (the k-th call on each rank's communicator) has started,
//    read every rank's send buffer, and complete once all ranks have read; so they order
//    against other streams with events exactly as a kernel does. In-place use (recv ==
//    send, or send == recv + rank * count for the gather/scatter) is supported.
//    Reductions add in rank order 0..n-1 in fp32 for bf16/f16 (rounding once at the end,
//    to nearest even), in the type itself otherwise: deterministic, but a different order
//    than NCCL's rings, so results match real NCCL only to a reduction-order tolerance.
//  - stricter than NCCL where NCCL would hang or corrupt silently: ranks whose matching
//    calls disagree (collective, count, type, op) fail with a sticky asynchronous error
//    on the stream (cudaErrorLaunchFailure) instead of hanging; so does a rank whose
//    peers never arrive within the timeout.
//  - errors returned as NCCL returns them: ncclInvalidArgument for null/unknown
//    communicators, null or non-device buffers (or a buffer on another device than the
//    communicator's), bad counts, types, ops, ranks; ncclInvalidUsage for a duplicate
//    device in ncclCommInitAll, a rank joined twice, disagreeing nranks, ncclGroupEnd
//    without ncclGroupStart; ncclUnhandledCudaError for a bad stream.
//  - ncclCommAbort (from any thread) aborts the whole clique: collectives still waiting
//    for a peer fail with a sticky asynchronous error instead of waiting on.
//  - groups (ncclGroupStart/End) nest; calls inside a group are queued at once (queueing
//    never blocks the host), so one thread may drive several ranks with or without them.
// Thread-safety: every function is thread-safe; one communicator is used by one thread
// at a time, as in NCCL.
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

typedef struct ncclComm* ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank);
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

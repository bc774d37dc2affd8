// The NCCL emulation of cuda_emu (include/nccl.h has the semantics): cliques of
// communicators, and collectives run as stream work that meets its peers at a rendezvous.
//
// A collective on rank r is the k-th call on r's communicator (k counted when it is
// queued, on the calling thread). When its stream reaches it, it posts its arguments in
// the clique's rendezvous k and waits until all n ranks have posted (phase 1); it checks
// that they agree, computes its own output into a private buffer from every rank's send
// buffer, and waits until all ranks have computed (phase 2): nobody reads a send buffer
// after that, so each rank then writes its output (in-place calls are safe) and its
// stream goes on. The last rank out removes the rendezvous.
//
// Ownership: a Clique is shared (shared_ptr) by its communicators and by queued work, so
// destroying a communicator with work in flight is safe; communicator objects are kept
// (never freed) so a stale handle is recognised instead of touching freed memory.
// Thread-safety: the registries are guarded by g_mu; each clique by its own mutex.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "nccl.h"

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::seconds Timeout() {
  const char* v = std::getenv("L2L_NCCL_EMU_TIMEOUT_S");
  long s = v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : 300;
  return std::chrono::seconds(s > 0 ? s : 300);
}

enum class Kind { kAllReduce, kReduceScatter, kAllGather };
const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "ncclAllReduce";
    case Kind::kReduceScatter:
      return "ncclReduceScatter";
    case Kind::kAllGather:
      return "ncclAllGather";
  }
  return "?";
}

// One rank's arguments of one collective.
struct Args {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // per the NCCL call: count / recvcount / sendcount
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
};

struct Rendezvous {
  std::vector<Args> args;
  std::vector<bool> posted;
  int n_posted = 0, n_computed = 0, n_left = 0;
  bool failed = false;
};

struct Clique {
  explicit Clique(int n) : nranks(n), members(n, nullptr) {}
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ncclComm*> members;  // GUARDED_BY(mu) joined so far
  int joined = 0;                  // GUARDED_BY(mu)
  std::map<uint64_t, Rendezvous> calls;  // GUARDED_BY(mu) by sequence number
  bool aborted = false;                  // GUARDED_BY(mu) ncclCommAbort on a member
};

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
  uint64_t next_seq = 0;  // collectives queued so far (the calling thread's)
  std::atomic<bool> async_failed{false};
  std::string last_error;
};

namespace {

// The registries are heap objects never destroyed: work queued on a stream may still
// use a communicator at exit, and a leak checker (which runs after static destructors)
// then still sees every communicator as reachable from here.
std::mutex g_mu;
std::set<ncclComm*>& g_live = *new std::set<ncclComm*>();         // GUARDED_BY(g_mu)
// Destroyed communicators, kept (never freed) so a stale handle is recognised.
std::vector<ncclComm*>& g_destroyed = *new std::vector<ncclComm*>();  // GUARDED_BY(g_mu)
std::map<std::string, std::shared_ptr<Clique>>& g_forming =
    *new std::map<std::string, std::shared_ptr<Clique>>();        // GUARDED_BY(g_mu) by id
thread_local int t_group_depth = 0;
thread_local std::string t_last_error;

ncclResult_t Fail(ncclResult_t r, const std::string& what) {
  t_last_error = what;
  std::fprintf(stderr, "l2l nccl emulator: %s (%s)\n", what.c_str(), ncclGetErrorString(r));
  return r;
}

bool Live(ncclComm* c) {
  std::lock_guard<std::mutex> lock(g_mu);
  return c != nullptr && g_live.count(c) != 0;
}

// ---- Reductions ----------------------------------------------------------------------------
template <class T>
T Combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg:
      return a + b;
    case ncclProd:
      return a * b;
    case ncclMax:
      return std::max(a, b);
    case ncclMin:
      return std::min(a, b);
    default:
      return a;
  }
}

// out[i] = op over ranks (in rank order) of srcs[r][i], for i in [0, n).
template <class T>
void ReduceTyped(const std::vector<const void*>& srcs, size_t n, ncclRedOp_t op, void* out) {
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) {
    T acc = static_cast<const T*>(srcs[0])[i];
    for (size_t r = 1; r < srcs.size(); ++r) acc = Combine(acc, static_cast<const T*>(srcs[r])[i], op);
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(srcs.size()));
    o[i] = acc;
  }
}
void ReduceBf16(const std::vector<const void*>& srcs, size_t n, ncclRedOp_t op, void* out) {
  __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out);
  for (size_t i = 0; i < n; ++i) {
    float acc = __bfloat162float(static_cast<const __nv_bfloat16*>(srcs[0])[i]);
    for (size_t r = 1; r < srcs.size(); ++r)
      acc = Combine(acc, __bfloat162float(static_cast<const __nv_bfloat16*>(srcs[r])[i]), op);
    if (op == ncclAvg) acc /= static_cast<float>(srcs.size());
    o[i] = __float2bfloat16_rn(acc);
  }
}
void Reduce(ncclDataType_t t, const std::vector<const void*>& srcs, size_t n, ncclRedOp_t op, void* out) {
  switch (t) {
    case ncclInt8:
      return ReduceTyped<int8_t>(srcs, n, op, out);
    case ncclUint8:
      return ReduceTyped<uint8_t>(srcs, n, op, out);
    case ncclInt32:
      return ReduceTyped<int32_t>(srcs, n, op, out);
    case ncclUint32:
      return ReduceTyped<uint32_t>(srcs, n, op, out);
    case ncclInt64:
      return ReduceTyped<int64_t>(srcs, n, op, out);
    case ncclUint64:
      return ReduceTyped<uint64_t>(srcs, n, op, out);
    case ncclFloat32:
      return ReduceTyped<float>(srcs, n, op, out);
    case ncclFloat64:
      return ReduceTyped<double>(srcs, n, op, out);
    case ncclBfloat16:
      return ReduceBf16(srcs, n, op, out);
    default:
      return;  // rejected when queued
  }
}

// Rank `rank`'s output of the rendezvous (all args agree), into `out`.
void Compute(const std::vector<Args>& all, int rank, std::vector<char>* out) {
  const Args& me = all[rank];
  const size_t es = TypeSize(me.type);
  const int n = static_cast<int>(all.size());
  switch (me.kind) {
    case Kind::kAllGather: {
      out->resize(me.count * es * n);
      for (int r = 0; r < n; ++r)
        if (me.count > 0) std::memcpy(out->data() + r * me.count * es, all[r].send, me.count * es);
      return;
    }
    case Kind::kAllReduce: {
      out->resize(me.count * es);
      std::vector<const void*> srcs;
      for (const Args& a : all) srcs.push_back(a.send);
      Reduce(me.type, srcs, me.count, me.op, out->data());
      return;
    }
    case Kind::kReduceScatter: {
      out->resize(me.count * es);
      std::vector<const void*> srcs;
      for (const Args& a : all) srcs.push_back(static_cast<const char*>(a.send) + rank * me.count * es);
      Reduce(me.type, srcs, me.count, me.op, out->data());
      return;
    }
  }
}

std::string Describe(const Args& a) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s(count %zu, type %d, op %d)", KindName(a.kind), a.count,
                static_cast<int>(a.type), static_cast<int>(a.op));
  return buf;
}

// The stream work of one rank's call `seq` (see the header comment).
void RunCollective(const std::shared_ptr<Clique>& cl, ncclComm* comm, int rank, uint64_t seq, Args args) {
  const int n = cl->nranks;
  std::vector<char> out;
  std::string error;
  {
    std::unique_lock<std::mutex> lock(cl->mu);
    Rendezvous& rv = cl->calls[seq];
    if (rv.args.empty()) {
      rv.args.resize(n);
      rv.posted.assign(n, false);
    }
    rv.args[rank] = args;
    rv.posted[rank] = true;
    ++rv.n_posted;
    cl->cv.notify_all();
    const auto deadline = Clock::now() + Timeout();
    if (!cl->cv.wait_until(lock, deadline, [&] { return rv.n_posted == n || rv.failed || cl->aborted; })) {
      rv.failed = true;
      cl->cv.notify_all();
      error = "collective #" + std::to_string(seq) + " " + Describe(args) + " on rank " +
              std::to_string(rank) + ": not every rank arrived within L2L_NCCL_EMU_TIMEOUT_S";
    }
    if (error.empty() && cl->aborted && rv.n_posted < n) {
      rv.failed = true;
      error = "collective #" + std::to_string(seq) + " " + Describe(args) + " on rank " + std::to_string(rank) +
              ": the communicator was aborted (ncclCommAbort)";
    } else if (error.empty() && !rv.failed) {
      for (int r = 0; r < n; ++r) {
        const Args& o = rv.args[r];
        if (o.kind != args.kind || o.count != args.count || o.type != args.type ||
            (args.kind != Kind::kAllGather && o.op != args.op)) {
          error = "collective #" + std::to_string(seq) + ": rank " + std::to_string(rank) +
                  " called " + Describe(args) + " but rank " + std::to_string(r) + " called " +
                  Describe(o);
          break;
        }
      }
    } else if (error.empty()) {
      error = "collective #" + std::to_string(seq) + " " + Describe(args) + " on rank " +
              std::to_string(rank) + ": a peer failed";
    }
    if (error.empty()) {
      std::vector<Args> all = rv.args;
      lock.unlock();
      Compute(all, rank, &out);
      lock.lock();
    }
    ++rv.n_computed;
    cl->cv.notify_all();
    cl->cv.wait_until(lock, deadline, [&] { return rv.n_computed == rv.n_posted || cl->aborted; });
    if (++rv.n_left == rv.n_posted && (rv.n_posted == n || rv.failed)) cl->calls.erase(seq);
  }
  if (!error.empty()) {
    comm->async_failed = true;
    l2l_cuda_emu::ReportAsyncError(cudaErrorLaunchFailure, "nccl emulator: " + error);
    return;
  }
  if (!out.empty()) std::memcpy(args.recv, out.data(), out.size());
}

// Checks that [p, +bytes) is device memory of `device`; else the reason.
bool CheckBuffer(const void* p, size_t bytes, int device, const char* what, std::string* why) {
  if (bytes == 0) return true;
  if (p == nullptr || !l2l_cuda_emu::IsDeviceRange(p, bytes)) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s %p (+%zu bytes) is not device memory", what, p, bytes);
    *why = buf;
    return false;
  }
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.device != device) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s %p is memory of cuda:%d, the communicator's device is cuda:%d",
                  what, p, attr.device, device);
    *why = buf;
    return false;
  }
  return true;
}

ncclResult_t Queue(const char* api, Args a, ncclComm_t comm, cudaStream_t stream) {
  if (!Live(comm)) return Fail(ncclInvalidArgument, std::string(api) + ": invalid communicator");
  const size_t es = TypeSize(a.type);
  if (es == 0 || a.type < 0 || a.type >= ncclNumTypes)
    return Fail(ncclInvalidArgument, std::string(api) + ": invalid data type " + std::to_string(a.type));
  if (a.kind != Kind::kAllGather) {
    if (a.op < 0 || a.op >= ncclNumOps)
      return Fail(ncclInvalidArgument, std::string(api) + ": invalid reduction op " + std::to_string(a.op));
    if (a.type == ncclFloat16)
      return Fail(ncclInvalidArgument, std::string(api) + ": fp16 reductions are not emulated");
  }
  const int n = comm->clique->nranks;
  const size_t send_bytes = a.count * es * (a.kind == Kind::kReduceScatter ? n : 1);
  const size_t recv_bytes = a.count * es * (a.kind == Kind::kAllGather ? n : 1);
  std::string why;
  if (!CheckBuffer(a.send, send_bytes, comm->device, "sendbuff", &why) ||
      !CheckBuffer(a.recv, recv_bytes, comm->device, "recvbuff", &why))
    return Fail(ncclInvalidArgument, std::string(api) + ": " + why);
  std::shared_ptr<Clique> cl = comm->clique;
  const int rank = comm->rank;
  const uint64_t seq = comm->next_seq++;
  int saved = 0;
  (void)cudaGetDevice(&saved);
  (void)cudaSetDevice(comm->device);
  const cudaError_t e = l2l_cuda_emu::Enqueue(
      stream, [cl, comm, rank, seq, a] { RunCollective(cl, comm, rank, seq, a); });
  (void)cudaSetDevice(saved);
  if (e != cudaSuccess) {
    --comm->next_seq;
    return Fail(ncclUnhandledCudaError, std::string(api) + ": cannot queue on stream: " + cudaGetErrorString(e));
  }
  return ncclSuccess;
}

std::string IdKey(const ncclUniqueId& id) { return std::string(id.internal, sizeof id.internal); }

// Adds `comm` as rank `rank` of the clique `key`; blocks until it is complete.
ncclResult_t Join(const std::string& key, int nranks, int rank, ncclComm* comm) {
  std::shared_ptr<Clique> cl;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_forming.find(key);
    if (it == g_forming.end()) it = g_forming.emplace(key, std::make_shared<Clique>(nranks)).first;
    cl = it->second;
    if (cl->nranks != nranks)
      return Fail(ncclInvalidUsage, "ncclCommInitRank: nranks " + std::to_string(nranks) +
                                        " but the clique of this id has " + std::to_string(cl->nranks));
    std::lock_guard<std::mutex> cl_lock(cl->mu);
    if (cl->members[rank] != nullptr)
      return Fail(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) + " joined twice");
    cl->members[rank] = comm;
    if (++cl->joined == nranks) g_forming.erase(key);
    cl->cv.notify_all();
  }
  comm->clique = cl;
  comm->rank = rank;
  std::unique_lock<std::mutex> lock(cl->mu);
  if (!cl->cv.wait_for(lock, Timeout(), [&] { return cl->joined == nranks; })) {
    lock.unlock();
    std::lock_guard<std::mutex> g(g_mu);
    g_forming.erase(key);
    return Fail(ncclSystemError, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                     std::to_string(nranks) + ": the other ranks never joined");
  }
  return ncclSuccess;
}

}  // namespace

// ---- API ------------------------------------------------------------------------------------
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Fail(ncclInvalidArgument, "ncclGetVersion: null version");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  std::memset(id->internal, 0, sizeof id->internal);
  const uint64_t v[2] = {salt, ++counter};
  std::memcpy(id->internal, v, sizeof v);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "ncclCommInitRank: null comm");
  if (nranks < 1) return Fail(ncclInvalidArgument, "ncclCommInitRank: nranks " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    return Fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks));
  auto* c = new ncclComm;
  if (cudaGetDevice(&c->device) != cudaSuccess) {
    delete c;
    return Fail(ncclUnhandledCudaError, "ncclCommInitRank: no current device");
  }
  const ncclResult_t r = Join(IdKey(comm_id), nranks, rank, c);
  if (r != ncclSuccess) {
    delete c;  // never published
    return r;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live.insert(c);
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return Fail(ncclInvalidArgument, "ncclCommInitAll: null comms");
  if (ndev < 1) return Fail(ncclInvalidArgument, "ncclCommInitAll: ndev " + std::to_string(ndev));
  int count = 0;
  (void)cudaGetDeviceCount(&count);
  std::vector<int> devs(ndev);
  for (int i = 0; i < ndev; ++i) devs[i] = devlist != nullptr ? devlist[i] : i;
  for (int i = 0; i < ndev; ++i) {
    if (devs[i] < 0 || devs[i] >= count)
      return Fail(ncclInvalidArgument, "ncclCommInitAll: device " + std::to_string(devs[i]) +
                                           " of " + std::to_string(count));
    for (int j = 0; j < i; ++j)
      if (devs[j] == devs[i])
        return Fail(ncclInvalidUsage, "ncclCommInitAll: duplicate GPU cuda:" + std::to_string(devs[i]));
  }
  auto cl = std::make_shared<Clique>(ndev);
  cl->joined = ndev;
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < ndev; ++i) {
    auto* c = new ncclComm;
    c->clique = cl;
    c->rank = i;
    c->device = devs[i];
    cl->members[i] = c;
    g_live.insert(c);
    comms[i] = c;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_live.erase(comm) == 0) return Fail(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
  // Kept, not freed (queued work may still name it; see the header comment).
  g_destroyed.push_back(comm);
  return ncclSuccess;
}

// As NCCL: usable from another thread while the communicator's collectives are in flight;
// those still waiting for a peer fail (a sticky error on their stream), as do the other
// members' (the whole clique is aborted).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<Clique> cl;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_live.count(comm) == 0) return Fail(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
    cl = comm->clique;
  }
  {
    std::lock_guard<std::mutex> lock(cl->mu);
    cl->aborted = true;
    cl->cv.notify_all();
  }
  return ncclCommDestroy(comm);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!Live(comm) || count == nullptr) return Fail(ncclInvalidArgument, "ncclCommCount: invalid argument");
  *count = comm->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!Live(comm) || device == nullptr)
    return Fail(ncclInvalidArgument, "ncclCommCuDevice: invalid argument");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!Live(comm) || rank == nullptr) return Fail(ncclInvalidArgument, "ncclCommUserRank: invalid argument");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!Live(comm) || async_error == nullptr)
    return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: invalid argument");
  *async_error = comm->async_failed ? ncclInvalidUsage : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Queue("ncclAllReduce", Args{Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op}, comm,
               stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return Queue("ncclReduceScatter",
               Args{Kind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op}, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Queue("ncclAllGather", Args{Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum},
               comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return Fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  --t_group_depth;
  return ncclSuccess;
}

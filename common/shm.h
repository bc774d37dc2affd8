// POSIX shared-memory segments (RAII), futex wait/wake on words inside them, and the
// binary layout of the two kinds of segment the EPS shares with same-host workers.
//
// Segments: ShmSegment::Create (the EPS: O_CREAT|O_EXCL, mode 0600, unlinked again by
// the owner's destructor) and ShmSegment::Open (a worker: maps an existing segment,
// read-only or read-write, never unlinks). Names look like "/l2l-<job_id>-w" (weights)
// and "/l2l-<job_id>-g<worker>" (gradients); RemoveJobSegments cleans up what a
// crashed run of the same job left in /dev/shm.
//
// Weight segment ("/l2l-<job>-w"), written by the EPS only, mapped read-only by workers:
//   [WeightSegmentHeader][WeightLayerEntry x num_layers]  (padded to 4096)
//   per layer: slot 0, slot 1, each slot_bytes (a multiple of 4096, so a CUDA worker
//   can cudaHostRegister the segment and copy any slot with full PCIe speed); a LoRA
//   job's layers also have a frozen record (their base), before the slots. The slots
//   of such a layer hold only its trainable span.
// A slot is written only while its seq is odd and no reader pins it; readers pin the
// (layer, slot) in their own gradient segment (WorkerPins) before using it, then
// re-check seq. See eps_server/param_store.h for the protocol.
//
// Gradient segment ("/l2l-<job>-g<id>"), one per worker, read-write for both sides:
//   [GradSegmentHeader][int64 pins x num_layers] (padded to 4096)
//   num_slots gradient slots of slot_bytes each (fp32, the largest layer, page aligned).
// Slot states: kFree -> (worker fills) kFilling -> kReady -> (EPS) kHeld -> kFree.
// The worker bumps ready_seq and futex-wakes the EPS after a slot becomes kReady; the
// EPS bumps free_seq and wakes the worker after it frees a slot; neither side spins.
//
// Thread-safety: ShmSegment is move-only and not synchronised; the layout's std::atomic
// fields are the synchronisation between processes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace l2l {

class ShmSegment {
 public:
  // Creates a new segment of `bytes` (zero-filled), mode 0600. ALREADY_EXISTS when the
  // name is taken.
  static Result<ShmSegment> Create(const std::string& name, size_t bytes);
  // Maps an existing segment (its whole size).
  static Result<ShmSegment> Open(const std::string& name, bool writable);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();  // unmaps; shm_unlink()s when this object created the segment
  // Removes the name now (the mapping stays valid until destruction). Owner only.
  Status Unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool owner() const { return owner_; }

 private:
  void Reset();
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
};

// Removes the /dev/shm segments a run of job `job_id` makes: "l2l-<job_id>-" followed by
// exactly "w", "g<n>[r<n>]" or "u<n>[r<n>]" (weights, a worker's gradients, its update
// exchange), and nothing else: another job whose id merely starts with this one's
// ("job" and "job-s1", or "l2l" and "l2l-run7") keeps its segments. Returns how many.
Result<int> RemoveJobSegments(const std::string& job_id);

// Blocks while *word == expected, up to `timeout` (negative: forever). Works on
// process-shared mappings (no FUTEX_PRIVATE_FLAG), also read-only ones. Returns true if
// woken or the value differed, false on timeout. Spurious returns are possible.
bool FutexWait(const std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::nanoseconds timeout);
// Wakes up to `count` waiters on word (INT32_MAX: all).
void FutexWake(const std::atomic<uint32_t>* word, int count = 0x7fffffff);

// Host identity used to decide "same host": contents of /proc/sys/kernel/random/boot_id
// (empty when unreadable) and gethostname().
// True when no process `pid` exists (kill(pid, 0) fails with ESRCH). pid <= 0: false.
bool ProcessGone(int32_t pid);
std::string BootId();
std::string HostName();

inline constexpr size_t kShmAlign = 4096;
inline size_t RoundUpTo(size_t n, size_t a) { return (n + a - 1) / a * a; }

// ---- Weight segment layout ---------------------------------------------------------
inline constexpr uint64_t kWeightMagic = 0x31305447574c324cull;  // "L2LWGT01"
inline constexpr uint32_t kShmLayoutVersion = 2;  // 2: frozen records (LoRA)
// WeightSegmentHeader::stopped when the job failed (not an operator's stop).
inline constexpr uint32_t kStoppedFailed = 2;
// What a reader gets once `stopped` is set: ABORTED for a stop (the worker ends cleanly),
// FAILED_PRECONDITION for a failed job (the worker exits non-zero).
inline Status StoppedStatus(uint32_t stopped) {
  return stopped == kStoppedFailed
             ? FailedPrecondition("the EPS's job failed and stopped (its log says why); restart from the last "
                                  "checkpoint")
             : Aborted("the EPS stopped the job");
}

struct WeightSegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t num_layers;
  uint32_t dtype;                  // l2l::DType value of the published copies
  // Bumped when the EPS rolls the state back (a step abandoned after a worker loss):
  // a reader that registered under another epoch must re-register before it reads on.
  std::atomic<uint32_t> epoch;
  uint64_t total_bytes;
  std::atomic<uint32_t> stopped;   // 1: the job stopped; readers give up (ABORTED);
                                   // kStoppedFailed: the job failed (FAILED_PRECONDITION)
  std::atomic<uint32_t> wake_seq;  // futex word: bumped on every publish and on stop
  // The EPS process that owns the segment (0 = unknown). A same-host reader that waits
  // on a futex of this segment checks it is still alive (ProcessGone), so a daemon that
  // was killed (no chance to set `stopped`) is noticed within one wait period.
  int32_t owner_pid;
  uint32_t reserved1;
};

struct alignas(64) WeightLayerEntry {
  uint64_t numel;                  // elements in the layer (dtype-sized)
  uint64_t slot_bytes;             // bytes per slot, a multiple of 4096
  uint64_t slot_offset[2];         // from the segment start, multiples of 4096
  std::atomic<uint32_t> seq[2];    // seqlock per slot: odd while the EPS writes it
  std::atomic<uint32_t> current;   // slot holding the newest version
  uint32_t reserved0;
  std::atomic<int64_t> version[2]; // version the slot holds; -1 = empty
  // A LoRA job's frozen base of the layer (common/lora_frozen.h): one record, written
  // before the layer's first publish and never again (readers need no pin for it);
  // frozen_bytes 0: none (the slots hold the whole layer). A multiple of 4096 apart from
  // the slots.
  uint64_t frozen_offset;
  uint64_t frozen_bytes;
};

inline WeightLayerEntry* WeightLayers(void* base) {
  return reinterpret_cast<WeightLayerEntry*>(static_cast<char*>(base) +
                                             RoundUpTo(sizeof(WeightSegmentHeader), 64));
}
inline size_t WeightHeaderBytes(size_t num_layers) {
  return RoundUpTo(RoundUpTo(sizeof(WeightSegmentHeader), 64) + num_layers * sizeof(WeightLayerEntry),
                   kShmAlign);
}

// ---- Gradient segment layout -------------------------------------------------------
inline constexpr uint64_t kGradMagic = 0x31304452474c324cull;  // "L2LGRD01"
inline constexpr int kMaxGradSlots = 8;

enum GradSlotState : uint32_t { kSlotFree = 0, kSlotFilling = 1, kSlotReady = 2, kSlotHeld = 3 };

struct alignas(64) GradSlotHeader {
  std::atomic<uint32_t> state;     // GradSlotState
  uint32_t reserved0;
  int64_t layer;                   // set by the worker before kReady
  int64_t step;
  int64_t micro_batches;
  int64_t numel;                   // fp32 elements in the slot
  uint64_t push_seq;               // the worker's push counter (arrival order)
  uint64_t data_offset;            // from the segment start
};

struct GradSegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t num_slots;              // <= kMaxGradSlots
  uint64_t slot_bytes;             // capacity of one slot, a multiple of 4096
  uint32_t num_layers;             // entries in the pins array
  int32_t worker_id;
  std::atomic<uint32_t> ready_seq; // futex word: worker bumps after a slot became kReady
  std::atomic<uint32_t> free_seq;  // futex word: EPS bumps after freeing a slot
  std::atomic<uint32_t> pin_seq;   // futex word: worker bumps after unpinning a layer
  std::atomic<uint32_t> closed;    // 1: the EPS stopped serving this segment
  // First error the EPS found in a pushed slot (0 = none); the message and the rejoin
  // reason are written before error_code is stored (release).
  std::atomic<uint32_t> error_code;  // l2l::StatusCode
  uint32_t error_rejoin;             // l2l::RejoinReason of that error (0 = none): the
                                     // worker re-registers instead of failing
  char error_message[256];
  GradSlotHeader slots[kMaxGradSlots];
};

// pins[layer]: the (version << 1 | slot) the worker holds of that layer, -1 = none.
inline std::atomic<int64_t>* GradPins(void* base) {
  return reinterpret_cast<std::atomic<int64_t>*>(static_cast<char*>(base) +
                                                 RoundUpTo(sizeof(GradSegmentHeader), 64));
}
inline size_t GradHeaderBytes(size_t num_layers) {
  return RoundUpTo(RoundUpTo(sizeof(GradSegmentHeader), 64) + num_layers * sizeof(int64_t),
                   kShmAlign);
}

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<int64_t>) == sizeof(int64_t));

}  // namespace l2l

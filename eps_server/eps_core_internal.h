// Private parts of EpsCore shared by eps_core.cc and eps_core_recovery.cc: the worker
// table entry and the shm worker. Not for other includes.
//
// Thread-safety: fields are guarded by EpsCore::mu_ unless noted.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/shm.h"
#include "eps_server/eps_core.h"

namespace l2l::eps {

// Appended to the messages of errors that ask a worker to re-register, for the person
// reading the log. Clients decide on the Status's RejoinReason, never on this text.
inline constexpr char kRejoinHint[] = "re-register to rejoin";

struct EpsCore::Worker {
  WorkerInfo info;
  int64_t next_step = 0;                    // first step it has not finished (StepDone)
  std::map<int64_t, std::string> position;  // step -> data position at the start of it
  int64_t epoch = 0;                        // store epoch at (re)registration
  std::string rejoin_message;               // why state is kRejoin, for the error message
  int64_t member_first = 0;                 // steps it contributes to (mirrors the
  int64_t member_last = INT64_MAX;          // pipeline's membership)
  int32_t local_pid = 0;                    // its process, when on this host (else 0)
  uint64_t registration = 0;                // this registration's nonce (Deregister names it)
};

struct EpsCore::ShmWorker {
  int32_t id = -1;
  ShmSegment seg;
  std::vector<uint64_t> slot_offset;
  std::thread consumer;
  std::atomic<bool> stop{false};  // ends ConsumeLoop (lost worker)

  // Marks the gradient segment closed, wakes both sides' futexes (the consumer and a
  // worker blocked on a free slot) and joins the consumer thread.
  void CloseAndJoin() {
    auto* h = static_cast<GradSegmentHeader*>(seg.data());
    stop = true;
    h->closed.store(1);
    h->ready_seq.fetch_add(1);
    FutexWake(&h->ready_seq);
    h->free_seq.fetch_add(1);
    FutexWake(&h->free_seq);
    if (consumer.joinable()) consumer.join();
  }
};

}  // namespace l2l::eps

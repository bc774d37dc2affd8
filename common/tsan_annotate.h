// Happens-before annotations for ThreadSanitizer, for hand-offs it cannot see: work that
// one thread gives another through Debian's oneTBB (spawn, steal, join, flow-graph
// messages) is ordered inside libtbb, which is not instrumented, so TSan reports the
// receiver's reads of what the sender wrote as races. TsanHappensBefore(addr) on the
// sender, before the hand-off, and TsanHappensAfter(addr) on the receiver, before its
// first read, make that ordering visible. Outside TSan builds both compile to nothing.
// They only add the ordering the library already gives; never use them to quiet a race.
// Thread-safety: callable from any thread.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define L2L_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define L2L_TSAN_BUILD 1
#endif
#endif

#if defined(L2L_TSAN_BUILD)
#include <sanitizer/tsan_interface.h>
#endif

namespace l2l {

inline void TsanHappensBefore(const void* addr) {
#if defined(L2L_TSAN_BUILD)
  __tsan_release(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

inline void TsanHappensAfter(const void* addr) {
#if defined(L2L_TSAN_BUILD)
  __tsan_acquire(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

}  // namespace l2l

// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html)
// as macros: GUARDED_BY(mu) on a member says which mutex protects it, REQUIRES(mu) on a
// function says its caller holds it, and so on. clang with -Wthread-safety checks them at
// compile time (scripts/tsa.sh builds the EPS that way, against libc++, whose std::mutex
// and std::lock_guard carry the capability annotations); other compilers see nothing.
//
// Thread-safety: compile-time only.
#pragma once

#if defined(__clang__)
#define L2L_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define L2L_THREAD_ANNOTATION(x)
#endif

// The member is read and written only with `mu` held.
#define GUARDED_BY(mu) L2L_THREAD_ANNOTATION(guarded_by(mu))
// The pointee (not the pointer) is guarded by `mu`.
#define PT_GUARDED_BY(mu) L2L_THREAD_ANNOTATION(pt_guarded_by(mu))
// The caller must hold the mutexes.
#define REQUIRES(...) L2L_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller must not hold the mutexes (the function takes them).
#define EXCLUDES(...) L2L_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// Lock ordering: this mutex is taken after / before the others.
#define ACQUIRED_AFTER(...) L2L_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) L2L_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
// Tells the analysis that `mu` is held at this point: after a std::unique_lock took it
// (libc++ does not annotate unique_lock) and inside condition-variable predicates, which
// run with the lock held.
#define ASSERT_HELD(mu) ::l2l::internal::AssertHeld(mu)

// For code the analysis cannot follow (a lock taken through std::unique_lock, a value read
// under a lock held by the caller's caller): say why beside each use.
#define NO_THREAD_SAFETY_ANALYSIS L2L_THREAD_ANNOTATION(no_thread_safety_analysis)

#include <mutex>

namespace l2l::internal {
inline void AssertHeld(const std::mutex& mu) L2L_THREAD_ANNOTATION(assert_capability(mu)) {}
}  // namespace l2l::internal

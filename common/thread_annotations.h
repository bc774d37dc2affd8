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

// Abseil (included by gRPC's headers) defines GUARDED_BY, PT_GUARDED_BY, ACQUIRED_AFTER,
// ACQUIRED_BEFORE and NO_THREAD_SAFETY_ANALYSIS with the same meaning. Where it is
// installed, its definitions are taken (its header first, so either include order works
// without a macro redefinition); the macros it lacks are defined below.
#if __has_include(<absl/base/internal/thread_annotations.h>)
#include <absl/base/internal/thread_annotations.h>
#endif

// The member is read and written only with `mu` held.
#ifndef GUARDED_BY
#define GUARDED_BY(mu) L2L_THREAD_ANNOTATION(guarded_by(mu))
#endif
// The pointee (not the pointer) is guarded by `mu`.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(mu) L2L_THREAD_ANNOTATION(pt_guarded_by(mu))
#endif
// The caller must hold the mutexes.
#define REQUIRES(...) L2L_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller must not hold the mutexes (the function takes them).
#define EXCLUDES(...) L2L_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// Lock ordering: this mutex is taken after / before the others.
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) L2L_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#endif
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) L2L_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#endif
// The function takes / gives back the mutexes (no argument: the scoped object's own).
#define ACQUIRE(...) L2L_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) L2L_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// A class whose objects hold a capability from construction to destruction.
#define SCOPED_CAPABILITY L2L_THREAD_ANNOTATION(scoped_lockable)
// Tells the analysis that `mu` is held at this point: after a std::unique_lock took it
// (libc++ does not annotate unique_lock; prefer l2l::UniqueLock below) and inside
// condition-variable predicates, which run with the lock held (prefer a predicate lambda
// marked REQUIRES(mu): `cv.wait(lock.native(), [&]() REQUIRES(mu_) { return done_; })`).
#define ASSERT_HELD(mu) ::l2l::internal::AssertHeld(mu)

// For code the analysis cannot follow (a value read under a lock held by the caller's
// caller, a lock handed between functions): say why beside each use.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS L2L_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif

#include <mutex>

namespace l2l::internal {
inline void AssertHeld(const std::mutex& mu) L2L_THREAD_ANNOTATION(assert_capability(mu)) {}
}  // namespace l2l::internal

namespace l2l {

// std::unique_lock<std::mutex> as the analysis sees it: holds `mu` from construction to
// destruction, except between unlock() and lock(). native() is the std::unique_lock for
// std::condition_variable's wait calls (which give the mutex back and retake it before
// returning, so the analysis' view stays right). Not movable: one scope owns it.
class SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(std::mutex& mu) ACQUIRE(mu) : lock_(mu) {}
  ~UniqueLock() RELEASE() {}
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() ACQUIRE() { lock_.lock(); }
  void unlock() RELEASE() { lock_.unlock(); }
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace l2l

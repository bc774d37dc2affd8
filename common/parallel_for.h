// ParallelForIndex: tbb::parallel_for over the indices [begin, end), f(i) once per index,
// with its hand-offs visible to ThreadSanitizer.
//
// A chunk of a tbb::parallel_for may run on another thread that stole it (a TBB worker,
// or a thread blocked in graph.wait_for_all() or in its own parallel_for), reading the
// caller's stack (where a [&] lambda and its captures live). The spawn, the steal and the
// join are inside libtbb (see common/tsan_annotate.h), so TSan reported those reads as
// races (CI, 2026-11-28: ~UpdatePipeline's wait_for_all stole a RunUpdate chunk). Here
// the caller's writes happen before every chunk, and every chunk's before the return,
// as TBB orders them. Races between chunks inside f are still reported.
// Thread-safety: as tbb::parallel_for; f must be safe to call concurrently.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <type_traits>

#include "common/tsan_annotate.h"

namespace l2l {

template <typename Index, typename F>
void ParallelForIndex(Index begin, Index end, const F& f) {
  static_assert(std::is_integral_v<Index>, "ParallelForIndex takes integer indices");
  if (begin >= end) return;
  struct Chunk {  // copied into TBB's task by value: no read of the caller's stack
    const F* f;
    void operator()(const tbb::blocked_range<Index>& r) const {
      TsanHappensAfter(f);
      for (Index i = r.begin(); i != r.end(); ++i) (*f)(i);
      TsanHappensBefore(f);
    }
  };
  TsanHappensBefore(&f);
  tbb::parallel_for(tbb::blocked_range<Index>(begin, end), Chunk{&f});
  TsanHappensAfter(&f);  // the join: every chunk's writes
}

}  // namespace l2l

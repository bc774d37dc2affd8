// StateSpan: one page-sized piece of a layer's fp32 state in the ParamStore (master
// weights and AdamW moments m and v of elements [begin, begin+n) of the layer). A span
// from ParamStore::spans() has null arrays where that page lives on SSD; a span from a
// ParamStore::StateLease always has all three arrays valid while the lease is held.
#pragma once

#include <cstddef>

namespace l2l::eps {

struct StateSpan {
  float* master;  // (n)
  float* m;       // (n)
  float* v;       // (n)
  size_t begin;
  size_t n;
};

}  // namespace l2l::eps

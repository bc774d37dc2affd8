// Reading a ParamStore's whole state (masters, m, v and one published version) and
// checking two such states bit for bit: the offloaded-update tests compare a run
// through an updater with a daemon-only run. Thread-safety: test-thread only.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "eps_server/param_store.h"

namespace l2l::eps {

struct State {
  std::vector<std::vector<float>> p, m, v;
  std::vector<std::vector<uint16_t>> published;
};

inline State Read(ParamStore& ps, int64_t version) {
  State s;
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    const size_t n = ps.layout(l).numel;
    s.p.emplace_back(n);
    s.m.emplace_back(n);
    s.v.emplace_back(n);
    REQUIRE(ps.ReadState(l, 0, s.p.back().data()).ok());
    REQUIRE(ps.ReadState(l, 1, s.m.back().data()).ok());
    REQUIRE(ps.ReadState(l, 2, s.v.back().data()).ok());
    auto pin = ps.Acquire(l, version, std::chrono::milliseconds(100));
    REQUIRE(pin.ok());
    s.published.emplace_back(n);
    std::memcpy(s.published.back().data(), pin->data(), n * sizeof(uint16_t));
  }
  return s;
}

inline void CheckSame(const State& a, const State& b) {
  REQUIRE(a.p.size() == b.p.size());
  for (size_t l = 0; l < a.p.size(); ++l) {
    CAPTURE(l);
    CHECK(std::memcmp(a.p[l].data(), b.p[l].data(), a.p[l].size() * 4) == 0);
    CHECK(std::memcmp(a.m[l].data(), b.m[l].data(), a.m[l].size() * 4) == 0);
    CHECK(std::memcmp(a.v[l].data(), b.v[l].data(), a.v[l].size() * 4) == 0);
    CHECK(a.published[l] == b.published[l]);
  }
}

}  // namespace l2l::eps

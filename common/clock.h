// Wall-clock intervals for timings and logs: the steady clock, and seconds since a point
// on it as a double. Thread-safety: pure functions.
#pragma once

#include <chrono>

namespace l2l {

using SteadyClock = std::chrono::steady_clock;

// Seconds from `t0` to `t1` (negative when t1 is earlier).
inline double Seconds(SteadyClock::time_point t0, SteadyClock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}
// Seconds from `t0` to now.
inline double SecondsSince(SteadyClock::time_point t0) { return Seconds(t0, SteadyClock::now()); }

}  // namespace l2l

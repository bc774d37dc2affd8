// Helpers shared by the kernels tests: random inputs, moving vectors through a Backend's
// memory, comparing fp32 results against double-precision references, and central finite
// differences of a double-precision scalar function.
// Thread-safety: test-only, single-threaded.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace l2l::kernels::testing {

inline std::vector<float> RandomVec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> RandomTokens(std::mt19937& rng, size_t n, int32_t V) {
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

template <typename T>
DeviceBuffer Upload(Backend& be, const std::vector<T>& host) {
  auto buf = DeviceBuffer::Create(&be, host.size() * sizeof(T));
  REQUIRE(buf.ok());
  be.CopyToDevice(buf->data(), host.data(), host.size() * sizeof(T));
  return std::move(buf).value();
}

template <typename T = float>
std::vector<T> Download(Backend& be, const DeviceBuffer& buf, size_t n) {
  std::vector<T> host(n);
  be.CopyToHost(host.data(), buf.data(), n * sizeof(T));
  return host;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Every element must satisfy |got - ref| <= atol + rtol * |ref|; reports the count and
// the worst element in one assertion (so a bad op does not print thousands of lines).
template <typename G, typename R>
void ExpectClose(const std::vector<G>& got, const std::vector<R>& ref, double atol, double rtol,
                 const std::string& what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), r = double(ref[i]);
    const double excess = std::abs(g - r) - (atol + rtol * std::abs(r));
    if (!(excess <= 0.0)) ++bad;  // NaN counts as bad
    if (!(excess <= worst_excess)) {
      worst_excess = excess;
      worst = i;
    }
  }
  std::ostringstream os;
  if (!got.empty()) {
    os << what << ": " << bad << " of " << got.size() << " elements off; worst [" << worst
       << "] got " << double(got[worst]) << " want " << double(ref[worst]) << " (atol " << atol
       << ", rtol " << rtol << ")";
  }
  INFO(os.str());
  CHECK(bad == 0);
}

// Central finite difference of f at x[i], in double.
inline double FiniteDiff(const std::function<double(const std::vector<double>&)>& f,
                         std::vector<double> x, size_t i, double h = 1e-6) {
  const double x0 = x[i];
  x[i] = x0 + h;
  const double fp = f(x);
  x[i] = x0 - h;
  const double fm = f(x);
  return (fp - fm) / (2.0 * h);
}

// Indices 0..n-1 when n <= max_count, else a deterministic spread of max_count of them.
inline std::vector<size_t> SampleIndices(size_t n, size_t max_count, uint32_t seed = 7) {
  std::vector<size_t> idx;
  if (n <= max_count) {
    for (size_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> d(0, n - 1);
  for (size_t k = 0; k < max_count; ++k) idx.push_back(d(rng));
  return idx;
}

// sum(out * R) in double.
inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace l2l::kernels::testing

// Tests of the emulated cub::DeviceRadixSort (include/cub/device/device_radix_sort.cuh)
// and of the bf16 conversions (include/cuda_bf16.h). Oracles are written here: the sort
// against std::stable_sort on keys ordered by an independent key map, the conversions
// against explicit bit patterns and an frexp/nearbyint rounding of the significand.
// Thread-safety: each test owns its buffers and stream.
#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "tests/cuda_emu/emu_test_util.h"

namespace {

using emu_test::DevMem;
using emu_test::Get;
using emu_test::Put;
using emu_test::Stream;

// Sorts (keys, values) on the device with SortPairs over bits [begin, end) and returns
// the sorted pairs.
template <class K, class V>
std::pair<std::vector<K>, std::vector<V>> DeviceSortPairs(const std::vector<K>& keys,
                                                          const std::vector<V>& values, int begin,
                                                          int end) {
  const int n = static_cast<int>(keys.size());
  size_t temp_bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const K*>(nullptr),
                                          static_cast<K*>(nullptr), static_cast<const V*>(nullptr),
                                          static_cast<V*>(nullptr), n) == cudaSuccess);
  DevMem kin(keys.size() * sizeof(K)), kout(keys.size() * sizeof(K)),
      vin(values.size() * sizeof(V)), vout(values.size() * sizeof(V)), temp(temp_bytes);
  Put(kin.p, keys);
  Put(vin.p, values);
  Stream st;
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, kin.as<const K>(), kout.as<K>(),
                                          vin.as<const V>(), vout.as<V>(), n, begin, end,
                                          st.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(st.s) == cudaSuccess);
  return {Get<K>(kout.p, keys.size()), Get<V>(vout.p, values.size())};
}

// The oracle: indices 0..n-1 stably sorted by `rank(key)`.
template <class K, class Rank>
std::vector<int32_t> StableOrder(const std::vector<K>& keys, Rank rank) {
  std::vector<int32_t> idx(keys.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return rank(keys[a]) < rank(keys[b]); });
  return idx;
}

uint16_t Bits(__nv_bfloat16 h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST_CASE("cub: SortPairs is stable for equal keys", "[cuda_emu][cub]") {
  std::mt19937 rng(3);
  std::vector<int32_t> keys(5000), values(5000);
  for (auto& k : keys) k = static_cast<int32_t>(rng() % 17);  // many repeats
  std::iota(values.begin(), values.end(), 0);
  auto [sk, sv] = DeviceSortPairs(keys, values, 0, 32);
  const std::vector<int32_t> order = StableOrder(keys, [](int32_t k) { return k; });
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(sv[i] == order[i]);
    REQUIRE(sk[i] == keys[order[i]]);
  }
}

TEST_CASE("cub: negative integer keys sort numerically", "[cuda_emu][cub]") {
  const std::vector<int32_t> keys = {
      5,  -1, std::numeric_limits<int32_t>::min(), 0, std::numeric_limits<int32_t>::max(), -7, 3,
      -1, 0};
  std::vector<uint16_t> values(keys.size());
  std::iota(values.begin(), values.end(), uint16_t{0});
  auto [sk, sv] = DeviceSortPairs(keys, values, 0, 32);
  const std::vector<int32_t> want_keys = {
      std::numeric_limits<int32_t>::min(), -7, -1, -1, 0, 0, 3, 5,
      std::numeric_limits<int32_t>::max()};
  CHECK(sk == want_keys);
  CHECK(sv == std::vector<uint16_t>{2, 5, 1, 7, 3, 8, 6, 0, 4});

  std::vector<int64_t> k64 = {-3, 4, std::numeric_limits<int64_t>::min(), -4000000000LL, 2};
  auto [s64, v64] = DeviceSortPairs(k64, std::vector<int8_t>{0, 1, 2, 3, 4}, 0, 64);
  CHECK(s64 == std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -4000000000LL, -3, 2, 4});
  CHECK(v64 == std::vector<int8_t>{2, 3, 0, 4, 1});
}

TEST_CASE("cub: float keys in CUB's order", "[cuda_emu][cub]") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> keys = {1.5f, -0.0f,  -inf,    0.0f, -2.25f,
                                   inf,  1e-30f, -1e-30f, 0.0f, -0.0f};
  std::vector<int32_t> values(keys.size());
  std::iota(values.begin(), values.end(), 0);
  auto [sk, sv] = DeviceSortPairs(keys, values, 0, 32);
  // -0.0 sorts before +0.0 (the radix form separates them); ties stay in input order.
  CHECK(sv == std::vector<int32_t>{2, 4, 7, 1, 9, 3, 8, 6, 0, 5});
  for (size_t i = 0; i < keys.size(); ++i) CHECK(FloatBits(sk[i]) == FloatBits(keys[sv[i]]));
}

TEST_CASE("cub: begin_bit and end_bit select the key bits", "[cuda_emu][cub]") {
  std::mt19937 rng(9);
  std::vector<uint32_t> keys(3000);
  for (auto& k : keys) k = rng();
  std::vector<int32_t> values(keys.size());
  std::iota(values.begin(), values.end(), 0);
  SECTION("bits [4, 12) of unsigned keys") {
    auto [sk, sv] = DeviceSortPairs(keys, values, 4, 12);
    CHECK(sv == StableOrder(keys, [](uint32_t k) { return (k >> 4) & 0xffu; }));
  }
  SECTION("top 4 bits of signed keys include the flipped sign bit") {
    std::vector<int32_t> sk(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) sk[i] = static_cast<int32_t>(keys[i]);
    auto [k, sv] = DeviceSortPairs(sk, values, 28, 32);
    // Numeric order of the top 4 bits: an arithmetic shift gives -8..7.
    CHECK(sv == StableOrder(sk, [](int32_t x) { return x >> 28; }));
  }
  SECTION("an empty bit range keeps the input order") {
    auto [sk, sv] = DeviceSortPairs(keys, values, 7, 7);
    CHECK(sv == values);
  }
}

TEST_CASE("cub: SortKeys", "[cuda_emu][cub]") {
  std::vector<int16_t> keys = {300, -5, 0, -32768, 77, -5};
  size_t temp_bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, static_cast<const int16_t*>(nullptr),
                                         static_cast<int16_t*>(nullptr), 6) == cudaSuccess);
  DevMem in(12), out(12), temp(temp_bytes);
  Put(in.p, keys);
  REQUIRE(cub::DeviceRadixSort::SortKeys(temp.p, temp_bytes, in.as<const int16_t>(),
                                         out.as<int16_t>(), 6) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(Get<int16_t>(out.p, 6) == std::vector<int16_t>{-32768, -5, -5, 0, 77, 300});
}

TEST_CASE("cub: size query, too-small temp storage and host pointers", "[cuda_emu][cub]") {
  const int n = 100;
  size_t temp_bytes = 0;
  // A size query needs no memory at all.
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr),
                                          static_cast<const int32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr), n) == cudaSuccess);
  REQUIRE(temp_bytes > 0);
  DevMem kin(n * 4), kout(n * 4), vin(n * 4), vout(n * 4), temp(temp_bytes);
  std::vector<int32_t> keys(n), vals(n);
  for (int i = 0; i < n; ++i) keys[i] = n - i;
  std::iota(vals.begin(), vals.end(), 0);
  Put(kin.p, keys);
  Put(vin.p, vals);
  Put(kout.p, std::vector<int32_t>(n, -1));
  Stream st;
  size_t small = temp_bytes - 1;
  CHECK(cub::DeviceRadixSort::SortPairs(temp.p, small, kin.as<const int32_t>(), kout.as<int32_t>(),
                                        vin.as<const int32_t>(), vout.as<int32_t>(), n, 0, 32,
                                        st.s) == cudaErrorInvalidValue);
  std::vector<int32_t> host(n);
  CHECK(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, host.data(), kout.as<int32_t>(),
                                        vin.as<const int32_t>(), vout.as<int32_t>(), n, 0, 32,
                                        st.s) == cudaErrorInvalidValue);
  CHECK(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, kin.as<const int32_t>(),
                                        kout.as<int32_t>(), vin.as<const int32_t>(), host.data(), n,
                                        0, 32, st.s) == cudaErrorInvalidValue);
  CHECK(cub::DeviceRadixSort::SortPairs(
            temp.p, temp_bytes, kin.as<const int32_t>(), kout.as<int32_t>(),
            vin.as<const int32_t>(), vout.as<int32_t>(), n, 0, 33, st.s) == cudaErrorInvalidValue);
  REQUIRE(cudaStreamSynchronize(st.s) == cudaSuccess);
  CHECK(Get<int32_t>(kout.p, n) == std::vector<int32_t>(n, -1));  // nothing ran
  // The full size works, and the temporary storage is used (overwritten).
  Put(temp.p, std::vector<uint8_t>(temp_bytes, 0));
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, kin.as<const int32_t>(),
                                          kout.as<int32_t>(), vin.as<const int32_t>(),
                                          vout.as<int32_t>(), n, 0, 32, st.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(st.s) == cudaSuccess);
  std::vector<int32_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  CHECK(Get<int32_t>(kout.p, n) == sorted);
  const std::vector<uint8_t> t = Get<uint8_t>(temp.p, temp_bytes);
  CHECK(std::count(t.begin(), t.end(), uint8_t{0}) == 0);
}

// ---- bf16 ------------------------------------------------------------------------------

namespace {

// Independent round-to-nearest-even to bf16 for finite values in the normal range:
// 8 significant bits via frexp and nearbyint.
float ReferenceBf16(float x) {
  if (x == 0.0f) return x;
  int e;
  const double m = std::frexp(static_cast<double>(x), &e);
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
}

}  // namespace

TEST_CASE("bf16: storage type", "[cuda_emu][cub]") {
  STATIC_REQUIRE(sizeof(__nv_bfloat16) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<__nv_bfloat16>);
  __nv_bfloat16_raw raw{0x3f80};
  __nv_bfloat16 h = raw;
  CHECK(__bfloat162float(h) == 1.0f);
  CHECK(static_cast<__nv_bfloat16_raw>(h).x == 0x3f80);
}

TEST_CASE("bf16: round to nearest even, ties both ways", "[cuda_emu][cub]") {
  // Between 1.0 (0x3f80, even) and 1 + 2^-7 (0x3f81, odd): the tie 1 + 2^-8 goes down.
  CHECK(Bits(__float2bfloat16_rn(1.0f + 0x1p-8f)) == 0x3f80);
  // Between 0x3f81 (odd) and 0x3f82 (even): the tie 1 + 3 * 2^-8 goes up.
  CHECK(Bits(__float2bfloat16_rn(1.0f + 0x3p-8f)) == 0x3f82);
  // Just off the tie either way.
  CHECK(Bits(__float2bfloat16_rn(FromBits(0x3f808001u))) == 0x3f81);
  CHECK(Bits(__float2bfloat16_rn(FromBits(0x3f807fffu))) == 0x3f80);
  // Negative values round by magnitude.
  CHECK(Bits(__float2bfloat16_rn(-(1.0f + 0x1p-8f))) == 0xbf80);
  CHECK(Bits(__float2bfloat16_rn(-(1.0f + 0x3p-8f))) == 0xbf82);
  // A tie that carries into the exponent: 2 - 2^-8 lies between 0x3fff and 2.0 (0x4000).
  CHECK(Bits(__float2bfloat16_rn(2.0f - 0x1p-8f)) == 0x4000);
  // Subnormals round the same way: 0x00008000 is a tie to 0, 0x00018000 a tie to 2.
  CHECK(Bits(__float2bfloat16_rn(FromBits(0x00008000u))) == 0x0000);
  CHECK(Bits(__float2bfloat16_rn(FromBits(0x00018000u))) == 0x0002);
  CHECK(Bits(__float2bfloat16(1.0f + 0x3p-8f)) == 0x3f82);  // same rounding
}

TEST_CASE("bf16: NaN, infinities and overflow", "[cuda_emu][cub]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(Bits(__float2bfloat16_rn(inf)) == 0x7f80);
  CHECK(Bits(__float2bfloat16_rn(-inf)) == 0xff80);
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu}) {
    const uint16_t b = Bits(__float2bfloat16_rn(FromBits(nan)));
    INFO("float bits " << std::hex << nan << " -> " << b);
    CHECK((b & 0x7f80) == 0x7f80);
    CHECK((b & 0x0040) != 0);                       // quiet
    CHECK((b & 0x8000) == ((nan >> 16) & 0x8000));  // sign kept
    CHECK(std::isnan(__bfloat162float(__float2bfloat16_rn(FromBits(nan)))));
  }
  // Largest finite bf16 is 0x7f7f = (2 - 2^-7) * 2^127.
  CHECK(Bits(__float2bfloat16_rn(FromBits(0x7f7f7fffu))) == 0x7f7f);  // below the tie
  CHECK(Bits(__float2bfloat16_rn(FromBits(0x7f7f8000u))) == 0x7f80);  // tie, odd: up to inf
  CHECK(Bits(__float2bfloat16_rn(std::numeric_limits<float>::max())) == 0x7f80);
  CHECK(Bits(__float2bfloat16_rn(-std::numeric_limits<float>::max())) == 0xff80);
}

TEST_CASE("bf16: every bf16 value round-trips exactly", "[cuda_emu][cub]") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    __nv_bfloat16_raw raw{static_cast<unsigned short>(b)};
    const float f = __bfloat162float(__nv_bfloat16(raw));
    REQUIRE(FloatBits(f) == b << 16);  // widening is exact
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    if (nan) {
      REQUIRE(std::isnan(__bfloat162float(__float2bfloat16_rn(f))));
    } else {
      REQUIRE(Bits(__float2bfloat16_rn(f)) == b);
    }
  }
}

TEST_CASE("bf16: random normal values match an independent rounding", "[cuda_emu][cub]") {
  std::mt19937 rng(17);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const float f = FromBits(rng());
    if (!std::isnormal(f) || std::fabs(f) >= 0x1.fep127f) continue;  // no overflow here
    const float want = ReferenceBf16(f);
    const float got = __bfloat162float(__float2bfloat16_rn(f));
    if (FloatBits(got) != FloatBits(want)) {
      FAIL("float bits " << std::hex << FloatBits(f) << ": got " << FloatBits(got) << ", want "
                         << FloatBits(want));
    }
    ++checked;
  }
  CHECK(checked > 150000);
}

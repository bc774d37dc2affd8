// Tests for common/dtype.h: exhaustive round trips over every bf16 and fp16 bit pattern,
// and fp32 -> bf16/fp16 rounding checked against an independent reference that picks the
// nearest representable value by searching the sorted table of all finite values in
// double arithmetic (ties to the even bit pattern, overflow to Inf as IEEE 754 does).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "common/dtype.h"

namespace l2l {
namespace {

bool IsNanBits16(uint16_t h, bool bf16) {
  return bf16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0) : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
}

// Decodes a 16-bit pattern with plain double arithmetic (no bit tricks shared with the
// code under test): sign * 2^(e - bias) * (1 + m / 2^mbits), subnormals with e = 1 - bias.
double Decode16(uint16_t h, bool bf16) {
  const int mbits = bf16 ? 7 : 10, ebits = bf16 ? 8 : 5, bias = bf16 ? 127 : 15;
  const int sign = (h >> 15) & 1;
  const int e = (h >> mbits) & ((1 << ebits) - 1);
  const int m = h & ((1 << mbits) - 1);
  double v;
  if (e == (1 << ebits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(m) / (1 << mbits), e - bias);
  }
  return sign ? -v : v;
}

// Sorted non-negative finite values and their patterns, plus the first value past the
// largest finite one (2^16 for fp16, 2^128 for bf16) standing for +Inf, whose pattern
// has an even mantissa, so that IEEE overflow rounding falls out of the same search.
struct Table {
  std::vector<double> value;
  std::vector<uint16_t> bits;
};

Table BuildTable(bool bf16) {
  Table t;
  const uint16_t inf = bf16 ? 0x7f80 : 0x7c00;
  for (uint32_t h = 0; h < inf; ++h) {
    t.value.push_back(Decode16(static_cast<uint16_t>(h), bf16));
    t.bits.push_back(static_cast<uint16_t>(h));
  }
  t.value.push_back(bf16 ? std::ldexp(1.0, 128) : 65536.0);
  t.bits.push_back(inf);
  return t;
}

uint16_t ReferenceRound(const Table& t, float f, bool bf16) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a) || a >= t.value.back()) return sign | t.bits.back();
  const auto it = std::upper_bound(t.value.begin(), t.value.end(), a);
  const size_t hi = static_cast<size_t>(it - t.value.begin());  // value[hi] > a >= value[hi-1]
  const size_t lo = hi - 1;
  const double dlo = a - t.value[lo], dhi = t.value[hi] - a;
  size_t pick;
  if (dlo < dhi) {
    pick = lo;
  } else if (dhi < dlo) {
    pick = hi;
  } else {
    pick = (t.bits[lo] & 1u) == 0 ? lo : hi;
  }
  return sign | t.bits[pick];
}

// Interesting fp32 inputs: every exact midpoint between neighbours, one fp32 ulp on
// either side of it, both neighbours themselves, around the overflow threshold, plus
// random bit patterns.
std::vector<float> Probes(const Table& t) {
  std::vector<float> out;
  for (size_t i = 0; i + 1 < t.value.size(); ++i) {
    const float lo = static_cast<float>(t.value[i]);
    const float hi = static_cast<float>(t.value[i + 1]);
    const float mid = static_cast<float>((t.value[i] + t.value[i + 1]) / 2);
    REQUIRE(static_cast<double>(mid) == (t.value[i] + t.value[i + 1]) / 2);  // exact in fp32
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, hi)}) {
      out.push_back(v);
      out.push_back(-v);
    }
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) out.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  out.push_back(std::numeric_limits<float>::max());
  out.push_back(std::numeric_limits<float>::denorm_min());
  out.push_back(std::numeric_limits<float>::infinity());
  out.push_back(-std::numeric_limits<float>::infinity());
  return out;
}

// Every 16-bit pattern of bf16 (bf16 true) or fp16 through fp32 and back: a number decodes
// to Decode16's value (sign included) and comes back unchanged; a NaN stays a NaN of the
// same sign whose only possible change is its quiet bit, now set.
void CheckEveryPatternRoundTrips(bool bf16) {
  const uint16_t quiet = bf16 ? 0x40u : 0x200u;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = bf16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
    const double ref = Decode16(h, bf16);
    const uint16_t back = bf16 ? FloatToBf16(f) : FloatToFp16(f);
    if (IsNanBits16(h, bf16)) {
      REQUIRE(std::isnan(f));
      REQUIRE(IsNanBits16(back, bf16));
      REQUIRE((back & 0x8000u) == (h & 0x8000u));
      REQUIRE((back & quiet) != 0);
      REQUIRE((back | quiet) == (h | quiet));
    } else {
      INFO("pattern 0x" << std::hex << i);
      REQUIRE(static_cast<double>(f) == ref);
      REQUIRE(std::signbit(f) == ((h & 0x8000u) != 0));
      REQUIRE(back == h);
    }
  }
}

}  // namespace

TEST_CASE("Every bf16 pattern survives bf16 -> fp32 -> bf16 (NaNs stay NaN, quieted)", "[dtype]") {
  CheckEveryPatternRoundTrips(true);
}

TEST_CASE("Every fp16 pattern survives fp16 -> fp32 -> fp16 (NaNs stay NaN, quieted)", "[dtype]") {
  CheckEveryPatternRoundTrips(false);
}

TEST_CASE("fp32 -> bf16 rounds to nearest even like a table search in double", "[dtype]") {
  const Table t = BuildTable(true);
  for (float f : Probes(t)) {
    if (std::isnan(f)) continue;
    INFO("f=" << f << " bits=0x" << std::hex << std::bit_cast<uint32_t>(f));
    REQUIRE(FloatToBf16(f) == ReferenceRound(t, f, true));
  }
}

TEST_CASE("fp32 -> fp16 rounds to nearest even, with subnormals and overflow, like a table search", "[dtype]") {
  const Table t = BuildTable(false);
  for (float f : Probes(t)) {
    if (std::isnan(f)) continue;
    INFO("f=" << f << " bits=0x" << std::hex << std::bit_cast<uint32_t>(f));
    REQUIRE(FloatToFp16(f) == ReferenceRound(t, f, false));
  }
}

TEST_CASE("Known values: ties, overflow, underflow, NaN and Inf", "[dtype]") {
  // fp16: 65504 is the largest finite; 65519.99 rounds down; 65520 (the tie) goes to Inf.
  CHECK(FloatToFp16(65504.0f) == 0x7bff);
  CHECK(FloatToFp16(65519.996f) == 0x7bff);
  CHECK(FloatToFp16(65520.0f) == 0x7c00);
  CHECK(FloatToFp16(-1e10f) == 0xfc00);
  CHECK(FloatToFp16(1.0f + 0x1.0p-11f) == 0x3c00);   // tie between 1 and 1+2^-10 -> even (1)
  CHECK(FloatToFp16(1.0f + 3 * 0x1.0p-11f) == 0x3c02);  // tie -> even (1+2^-9)
  CHECK(FloatToFp16(0x1.0p-24f) == 0x0001);          // smallest subnormal
  CHECK(FloatToFp16(0x1.0p-25f) == 0x0000);          // tie with zero -> zero
  CHECK(FloatToFp16(0x1.8p-25f) == 0x0001);
  CHECK(FloatToFp16(-0.0f) == 0x8000);
  CHECK(Fp16ToFloat(0x0001) == 0x1.0p-24f);
  CHECK(Fp16ToFloat(0x3555) == 0x1.554p-2f);
  // bf16
  CHECK(FloatToBf16(1.0f) == 0x3f80);
  CHECK(FloatToBf16(1.0f + 0x1.0p-8f) == 0x3f80);        // tie -> even
  CHECK(FloatToBf16(1.0f + 3 * 0x1.0p-8f) == 0x3f82);    // tie -> even (up)
  CHECK(FloatToBf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the top
  CHECK(FloatToBf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(FloatToBf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  // NaN: stays NaN, keeps sign, is quiet. A signalling NaN whose payload lives only in
  // the low 16 bits must not turn into Inf.
  const float snan = std::bit_cast<float>(0x7f800001u);
  CHECK(IsNanBits16(FloatToBf16(snan), true));
  CHECK(IsNanBits16(FloatToFp16(snan), false));
  CHECK(FloatToBf16(-std::numeric_limits<float>::quiet_NaN()) & 0x8000);
  CHECK(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(Fp16ToFloat(0x7c01)));
  CHECK(std::isinf(Fp16ToFloat(0x7c00)));
}

TEST_CASE("Bulk converters agree with the scalar ones for every dtype", "[dtype]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> src(1001);
  for (float& x : src) x = nd(rng);
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<unsigned char> bytes(src.size() * DTypeSize(d) + 1);
    ConvertFromFloat(src.data(), d, bytes.data() + 1, src.size());  // deliberately unaligned
    std::vector<float> back(src.size());
    ConvertToFloat(bytes.data() + 1, d, back.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const float expect = d == DType::kF32   ? src[i]
                           : d == DType::kBF16 ? Bf16ToFloat(FloatToBf16(src[i]))
                                               : Fp16ToFloat(FloatToFp16(src[i]));
      REQUIRE(back[i] == expect);
    }
  }
  REQUIRE(ParseDType("bf16").value() == DType::kBF16);
  REQUIRE(std::string(DTypeName(DType::kF16)) == "f16");
  REQUIRE_FALSE(ParseDType("int8").ok());
  REQUIRE(ParseDType("int8").status().message().find("int8") != std::string::npos);
}

}  // namespace l2l

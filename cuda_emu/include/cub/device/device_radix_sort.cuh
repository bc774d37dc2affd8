// Emulated cub/device/device_radix_sort.cuh (cuda_emu): cub::DeviceRadixSort
// SortPairs / SortKeys on the CPU, with CUB's calling convention and ordering.
//
// Contract (as CUB's): a call with d_temp_storage == nullptr only sets
// temp_storage_bytes and returns cudaSuccess, touching neither memory nor the stream.
// Otherwise the sort is queued on `stream`: keys are ordered by bits [begin_bit,
// end_bit) of their radix form — unsigned integers as they are, signed integers with the
// sign bit flipped (numeric order), floating point with CUB's twiddle (negative values
// have every bit flipped, others the sign bit: -inf < ... < -0.0 < +0.0 < ... < +inf) —
// and the sort is stable, as CUB's LSD radix sort is. The temporary storage is
// overwritten with 0xFF (CUB uses it as scratch).
// Stricter than CUB: a temp_storage_bytes below the queried size, a bit range outside
// the key, a negative num_items, or any buffer not inside one cudaMalloc allocation
// returns cudaErrorInvalidValue with a line on stderr. Input and output may alias.
//
// Ownership: none; the caller owns every buffer. Thread-safety: stateless; the queued
// work reads the inputs when it runs on the stream, as a kernel would.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "l2l_cuda_emu.h"

namespace cub {
namespace emu_detail {

template <size_t kBytes>
struct UnsignedOfSize;
template <>
struct UnsignedOfSize<1> {
  using type = uint8_t;
};
template <>
struct UnsignedOfSize<2> {
  using type = uint16_t;
};
template <>
struct UnsignedOfSize<4> {
  using type = uint32_t;
};
template <>
struct UnsignedOfSize<8> {
  using type = uint64_t;
};

// The key's radix form: an unsigned integer whose unsigned order is CUB's key order.
template <typename K>
uint64_t RadixForm(const K& key) {
  static_assert(std::is_arithmetic_v<K> && !std::is_same_v<K, bool>,
                "emulated cub::DeviceRadixSort supports integer and floating-point keys");
  using U = typename UnsignedOfSize<sizeof(K)>::type;
  constexpr U kHigh = static_cast<U>(U{1} << (sizeof(K) * 8 - 1));
  U bits;
  std::memcpy(&bits, &key, sizeof(K));
  if constexpr (std::is_floating_point_v<K>) {
    bits = static_cast<U>(bits ^ ((bits & kHigh) ? static_cast<U>(~U{0}) : kHigh));
  } else if constexpr (std::is_signed_v<K>) {
    bits = static_cast<U>(bits ^ kHigh);
  }
  return bits;
}

inline bool CheckDevice(const void* p, size_t bytes, const char* api, const char* what) {
  if (bytes == 0 || l2l_cuda_emu::IsDeviceRange(p, bytes)) return true;
  std::fprintf(stderr,
               "[cuda_emu] %s: %s (%p, %zu bytes) is not inside one cudaMalloc allocation\n", api,
               what, p, bytes);
  return false;
}

// Shared body of SortPairs (kPairs) and SortKeys.
template <bool kPairs, typename K, typename V>
cudaError_t RadixSort(const char* api, void* d_temp_storage, size_t& temp_storage_bytes,
                      const K* d_keys_in, K* d_keys_out, const V* d_values_in, V* d_values_out,
                      int num_items, int begin_bit, int end_bit, cudaStream_t stream) {
  if (num_items < 0) {
    std::fprintf(stderr, "[cuda_emu] %s: num_items=%d is negative\n", api, num_items);
    return cudaErrorInvalidValue;
  }
  const size_t n = static_cast<size_t>(num_items);
  const size_t item_bytes = sizeof(K) + (kPairs ? sizeof(V) : 0);
  const size_t required = 2 * n * item_bytes + 1024;
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = required;
    return cudaSuccess;
  }
  constexpr int kKeyBits = static_cast<int>(sizeof(K) * 8);
  if (begin_bit < 0 || end_bit > kKeyBits || begin_bit > end_bit) {
    std::fprintf(stderr, "[cuda_emu] %s: bit range [%d, %d) is not within the %d-bit key\n", api,
                 begin_bit, end_bit, kKeyBits);
    return cudaErrorInvalidValue;
  }
  if (temp_storage_bytes < required) {
    std::fprintf(stderr,
                 "[cuda_emu] %s: temp_storage_bytes=%zu is below the %zu bytes the size query "
                 "returns for num_items=%d\n",
                 api, temp_storage_bytes, required, num_items);
    return cudaErrorInvalidValue;
  }
  if (!CheckDevice(d_temp_storage, temp_storage_bytes, api, "d_temp_storage") ||
      !CheckDevice(d_keys_in, n * sizeof(K), api, "d_keys_in") ||
      !CheckDevice(d_keys_out, n * sizeof(K), api, "d_keys_out")) {
    return cudaErrorInvalidValue;
  }
  if constexpr (kPairs) {
    if (!CheckDevice(d_values_in, n * sizeof(V), api, "d_values_in") ||
        !CheckDevice(d_values_out, n * sizeof(V), api, "d_values_out")) {
      return cudaErrorInvalidValue;
    }
  }
  if (n == 0) return cudaSuccess;
  return l2l_cuda_emu::Enqueue(stream, [=] {
    const int width = end_bit - begin_bit;
    const uint64_t mask = width >= 64 ? ~uint64_t{0} : ((uint64_t{1} << width) - 1);
    std::vector<std::pair<uint64_t, uint32_t>> order(n);  // (radix digit bits, input index)
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = RadixForm(d_keys_in[i]);
      order[i] = {width == 0 ? 0 : (r >> begin_bit) & mask, static_cast<uint32_t>(i)};
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    const std::vector<K> keys(d_keys_in, d_keys_in + n);  // copies: outputs may alias inputs
    for (size_t i = 0; i < n; ++i) d_keys_out[i] = keys[order[i].second];
    if constexpr (kPairs) {
      const std::vector<V> values(d_values_in, d_values_in + n);
      for (size_t i = 0; i < n; ++i) d_values_out[i] = values[order[i].second];
    }
    std::memset(d_temp_storage, 0xFF, required);
  });
}

}  // namespace emu_detail

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                               const KeyT* d_keys_in, KeyT* d_keys_out, const ValueT* d_values_in,
                               ValueT* d_values_out, int num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    return emu_detail::RadixSort<true>("cub::DeviceRadixSort::SortPairs", d_temp_storage,
                                       temp_storage_bytes, d_keys_in, d_keys_out, d_values_in,
                                       d_values_out, num_items, begin_bit, end_bit, stream);
  }

  template <typename KeyT>
  static cudaError_t SortKeys(void* d_temp_storage, size_t& temp_storage_bytes,
                              const KeyT* d_keys_in, KeyT* d_keys_out, int num_items,
                              int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                              cudaStream_t stream = 0) {
    return emu_detail::RadixSort<false>(
        "cub::DeviceRadixSort::SortKeys", d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out,
        static_cast<const char*>(nullptr), static_cast<char*>(nullptr), num_items, begin_bit,
        end_bit, stream);
  }
};

}  // namespace cub

// Checked JSON-number-to-integer conversion: the one way a number from a JSON file or
// message we did not write (tokenizer.json, config.json, safetensors headers, checkpoint
// manifests, model spec JSON, run logs) becomes a C++ integer.
//
// nlohmann's get<int64_t>() / get<int32_t>() convert whatever the value holds: a float
// (5.5e108) is cast, undefined when out of range; an unsigned above INT64_MAX wraps to a
// negative; a large int64 is truncated to int32. JsonToInt accepts a JSON integer only
// (signed or unsigned; not 5.0, 1e3, "5", true or null) and only inside [min, max]; every
// other value is INVALID_ARGUMENT naming `where` (the file and the key path) and showing
// the value (shortened):
//   "tokenizer.json: model.vocab[\"a\"] = 5.5 is not an integer"
//   "tokenizer.json: model.vocab[\"a\"] = 2147483646 is out of range [0, 35]"
//
// Thread-safety: free functions over their arguments.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace l2l {

// `v` as an integer in [min, max] (REQUIRES: min <= max).
Result<int64_t> JsonToInt(const nlohmann::json& v, int64_t min, int64_t max, const std::string& where);
// `v` as an unsigned integer in [0, max]; for values above INT64_MAX (uint64 fields).
Result<uint64_t> JsonToUint(const nlohmann::json& v, uint64_t max, const std::string& where);

// `v` in the whole range of T (an integral type other than bool).
template <typename T>
Result<T> JsonInt(const nlohmann::json& v, const std::string& where) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "JsonInt<T>: T must be an integer type");
  if constexpr (std::is_unsigned_v<T>) {
    L2L_ASSIGN_OR_RETURN(uint64_t u, JsonToUint(v, std::numeric_limits<T>::max(), where));
    return static_cast<T>(u);
  } else {
    L2L_ASSIGN_OR_RETURN(int64_t x, JsonToInt(v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), where));
    return static_cast<T>(x);
  }
}

// At most ~60 characters of v.dump(), for error messages (a value may be a huge string or
// object).
std::string JsonSnippet(const nlohmann::json& v);

}  // namespace l2l

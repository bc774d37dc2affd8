// Checked JSON-number-to-integer conversion. See common/json_util.h.
#include "common/json_util.h"

namespace l2l {
namespace {

Status NotAnInteger(const nlohmann::json& v, const std::string& where) {
  return InvalidArgument(where + " = " + JsonSnippet(v) + " is not an integer");
}

template <typename T>
Status OutOfRange(const nlohmann::json& v, T min, T max, const std::string& where) {
  return InvalidArgument(where + " = " + JsonSnippet(v) + " is out of range [" + std::to_string(min) + ", " +
                         std::to_string(max) + "]");
}

}  // namespace

std::string JsonSnippet(const nlohmann::json& v) {
  constexpr size_t kMax = 60;
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

Result<int64_t> JsonToInt(const nlohmann::json& v, int64_t min, int64_t max, const std::string& where) {
  // is_number_unsigned() holds for non-negative integers, is_number_integer() for both
  // kinds; floats, strings, booleans and null are neither.
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (max >= 0 && u <= static_cast<uint64_t>(max) && static_cast<int64_t>(u) >= min) return static_cast<int64_t>(u);
    return OutOfRange(v, min, max, where);
  }
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x >= min && x <= max) return x;
    return OutOfRange(v, min, max, where);
  }
  return NotAnInteger(v, where);
}

Result<uint64_t> JsonToUint(const nlohmann::json& v, uint64_t max, const std::string& where) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= max) return u;
    return OutOfRange<uint64_t>(v, 0, max, where);
  }
  if (v.is_number_integer()) return OutOfRange<uint64_t>(v, 0, max, where);  // negative
  return NotAnInteger(v, where);
}

}  // namespace l2l

// Name tables of enums: one constexpr table {value, name} per enum, read by both its
// ToString (NameOf) and its Parse (ParseName), so the two cannot disagree and a bad name
// gets the same message everywhere: "'x' is not one of: a, b, c". Used by the mode enums
// (common/modes.cc) and the backends' precision / ISA enums.
//
//   constexpr std::pair<Mode, const char*> kModes[] = {{Mode::kA, "a"}, {Mode::kB, "b"}};
//   const char* ToString(Mode m) { return NameOf(kModes, m); }
//   Result<Mode> ParseMode(std::string_view s) { return ParseName(kModes, s); }
//
// Thread-safety: pure functions over constant tables.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace l2l {

template <typename E, size_t N>
const char* NameOf(const std::pair<E, const char*> (&table)[N], E value) {
  for (const auto& [e, name] : table) {
    if (e == value) return name;
  }
  return "?";
}

template <typename E, size_t N>
Result<E> ParseName(const std::pair<E, const char*> (&table)[N], std::string_view s) {
  std::string names;
  for (const auto& [e, name] : table) {
    if (s == name) return e;
    names += names.empty() ? name : std::string(", ") + name;
  }
  return InvalidArgument("'" + std::string(s) + "' is not one of: " + names);
}

}  // namespace l2l

// Strict typed YAML field reading. See common/yaml_util.h.
//
// yaml-cpp throws (ParserException, InvalidNode, BadConversion, ...); every call into it
// here sits inside a try block or only touches nodes known to be valid, so no exception
// leaves this file.
//
// Thread-safety: see the header.
#include "common/yaml_util.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <sstream>

#include "common/file_util.h"

namespace l2l {
namespace {

std::string KindName(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "an undefined node";
  }
}

std::string StripPlus(const std::string& s) { return !s.empty() && s[0] == '+' ? s.substr(1) : s; }

template <typename T>
bool ParseNumber(const std::string& text, T* out) {
  const std::string s = StripPlus(text);
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

std::string FormatDouble(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string DescribeIntRange(const IntRange& r) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  if (r.min == kMin && r.max == kMax) return "an integer";
  if (r.max == kMax) return "an integer >= " + std::to_string(r.min);
  if (r.min == kMin) return "an integer <= " + std::to_string(r.max);
  return "an integer in [" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
}

std::string DescribeFloatRange(const FloatRange& r) {
  const bool has_min = std::isfinite(r.min), has_max = std::isfinite(r.max);
  if (!has_min && !has_max) return "a finite number";
  if (!has_max) return std::string("a number ") + (r.min_exclusive ? "> " : ">= ") + FormatDouble(r.min);
  if (!has_min) return std::string("a number ") + (r.max_exclusive ? "< " : "<= ") + FormatDouble(r.max);
  return std::string("a number in ") + (r.min_exclusive ? "(" : "[") + FormatDouble(r.min) + ", " +
         FormatDouble(r.max) + (r.max_exclusive ? ")" : "]");
}

bool InFloatRange(double v, const FloatRange& r) {
  if (!std::isfinite(v)) return false;
  if (r.min_exclusive ? !(v > r.min) : !(v >= r.min)) return false;
  if (r.max_exclusive ? !(v < r.max) : !(v <= r.max)) return false;
  return true;
}

// Finds `key` in a map node: the (key, value) nodes of its first occurrence.
bool FindEntry(const YAML::Node& map, const std::string& key, YAML::Node* k, YAML::Node* v) {
  if (!map.IsMap()) return false;
  for (const auto& kv : map) {  // kv is a pair of node handles, held by value
    if (kv.first.IsScalar() && kv.first.Scalar() == key) {
      *k = kv.first;
      *v = kv.second;
      return true;
    }
  }
  return false;
}

}  // namespace

Result<YamlDoc> ParseYaml(const std::string& text, const std::string& origin) {
  try {
    YamlDoc doc;
    doc.root = YAML::Load(text);
    doc.origin = origin;
    return doc;
  } catch (const YAML::Exception& e) {
    std::string where = origin;
    if (!e.mark.is_null()) where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    return InvalidArgument(where + ": malformed YAML: " + e.msg);
  } catch (const std::exception& e) {
    return InvalidArgument(origin + ": cannot parse YAML: " + e.what());
  }
}

Result<YamlDoc> LoadYamlFile(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseYaml(text, path);
}

std::string YamlWhere(const YAML::Node& node, const std::string& origin) {
  try {
    const YAML::Mark m = node.Mark();
    if (m.is_null()) return origin;
    return origin + ":" + std::to_string(m.line + 1);
  } catch (const std::exception&) {
    return origin;
  }
}

Result<YamlMap> YamlMap::Wrap(const YAML::Node& node, std::string origin, std::string path) {
  if (!node.IsDefined() || node.IsNull() || node.IsMap()) {
    return YamlMap(node.IsDefined() ? node : YAML::Node(), std::move(origin), std::move(path));
  }
  const std::string what = path.empty() ? std::string("the document") : path;
  return InvalidArgument(YamlWhere(node, origin) + ": " + what + ": expected a map of key: value, found " +
                         KindName(node));
}

bool YamlMap::Has(const std::string& key) const {
  YAML::Node k, v;
  return FindEntry(node_, key, &k, &v);
}

std::string YamlMap::KeyPath(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

std::string YamlMap::Where() const { return YamlWhere(node_, origin_); }

std::string YamlMap::Where(const std::string& key) const {
  YAML::Node k, v;
  if (FindEntry(node_, key, &k, &v)) return YamlWhere(k, origin_);
  return Where();
}

Status YamlMap::Error(const std::string& key, const std::string& msg) const {
  return InvalidArgument(Where(key) + ": " + KeyPath(key) + ": " + msg);
}

Status YamlMap::Locate(const Status& st) {
  if (st.ok()) return st;
  const std::string key = st.message().substr(0, st.message().find('='));
  std::string where = origin_;
  if (!key.empty() && key.find(' ') == std::string::npos) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos) {
      if (Has(key)) where = Where(key);
    } else if (Has(key.substr(0, dot))) {
      Result<YamlMap> section = Map(key.substr(0, dot));
      if (section.ok() && section->Has(key.substr(dot + 1))) where = section->Where(key.substr(dot + 1));
    }
  }
  return InvalidArgument(where + ": " + st.message());
}

Result<YamlMap> YamlMap::Map(const std::string& key) {
  known_.insert(key);
  YAML::Node k, v;
  if (!FindEntry(node_, key, &k, &v)) return YamlMap(YAML::Node(), origin_, KeyPath(key));
  if (v.IsNull() || v.IsMap()) return YamlMap(v, origin_, KeyPath(key));
  return Error(key, "expected a map of key: value, found " + KindName(v));
}

Status YamlMap::Scalar(const std::string& key, const char* expected, std::string* text, bool* present) {
  known_.insert(key);
  YAML::Node k, v;
  *present = FindEntry(node_, key, &k, &v);
  if (!*present) return Status::Ok();
  if (!v.IsScalar()) return Error(key, std::string("expected ") + expected + ", found " + KindName(v));
  *text = v.Scalar();
  return Status::Ok();
}

Status YamlMap::Get(const std::string& key, int64_t* out, IntRange range) {
  const std::string expected = DescribeIntRange(range);
  std::string text;
  bool present;
  L2L_RETURN_IF_ERROR(Scalar(key, expected.c_str(), &text, &present));
  if (!present) return Status::Ok();
  int64_t v;
  if (!ParseNumber(text, &v) || v < range.min || v > range.max) {
    return Error(key, "expected " + expected + ", found '" + text + "'");
  }
  *out = v;
  return Status::Ok();
}

Status YamlMap::Get(const std::string& key, uint64_t* out) {
  std::string text;
  bool present;
  L2L_RETURN_IF_ERROR(Scalar(key, "a non-negative integer", &text, &present));
  if (!present) return Status::Ok();
  uint64_t v;
  if (!ParseNumber(text, &v)) return Error(key, "expected a non-negative integer, found '" + text + "'");
  *out = v;
  return Status::Ok();
}

Status YamlMap::Get(const std::string& key, double* out, FloatRange range) {
  const std::string expected = DescribeFloatRange(range);
  std::string text;
  bool present;
  L2L_RETURN_IF_ERROR(Scalar(key, expected.c_str(), &text, &present));
  if (!present) return Status::Ok();
  double v;
  if (!ParseNumber(text, &v) || !InFloatRange(v, range)) {
    return Error(key, "expected " + expected + ", found '" + text + "'");
  }
  *out = v;
  return Status::Ok();
}

Status YamlMap::Get(const std::string& key, float* out, FloatRange range) {
  const std::string expected = DescribeFloatRange(range);
  std::string text;
  bool present;
  L2L_RETURN_IF_ERROR(Scalar(key, expected.c_str(), &text, &present));
  if (!present) return Status::Ok();
  // Parsed straight to float (not via double) so the shortest text of a float reads back
  // to the same float.
  float v;
  if (!ParseNumber(text, &v) || !InFloatRange(static_cast<double>(v), range)) {
    return Error(key, "expected " + expected + ", found '" + text + "'");
  }
  *out = v;
  return Status::Ok();
}

Status YamlMap::Get(const std::string& key, bool* out) {
  std::string text;
  bool present;
  L2L_RETURN_IF_ERROR(Scalar(key, "true or false", &text, &present));
  if (!present) return Status::Ok();
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "true" || lower == "yes" || lower == "on") {
    *out = true;
  } else if (lower == "false" || lower == "no" || lower == "off") {
    *out = false;
  } else {
    return Error(key, "expected true or false, found '" + text + "'");
  }
  return Status::Ok();
}

Status YamlMap::Get(const std::string& key, std::string* out) {
  std::string text;
  bool present;
  L2L_RETURN_IF_ERROR(Scalar(key, "a string", &text, &present));
  if (present) *out = text;
  return Status::Ok();
}

Status YamlMap::GetChoice(const std::string& key, std::string* out, std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
  const std::string expected = "one of " + list;
  std::string text;
  bool present;
  L2L_RETURN_IF_ERROR(Scalar(key, expected.c_str(), &text, &present));
  if (!present) return Status::Ok();
  for (const char* c : choices) {
    if (text == c) {
      *out = text;
      return Status::Ok();
    }
  }
  return Error(key, "expected " + expected + ", found '" + text + "'");
}

Status YamlMap::Finish() const {
  if (!node_.IsMap()) return Status::Ok();
  std::map<std::string, int> seen;
  for (const auto& kv : node_) {
    const YAML::Node k = kv.first;
    if (!k.IsScalar()) {
      return InvalidArgument(YamlWhere(k, origin_) + ": " + (path_.empty() ? "document" : path_) +
                             ": keys must be plain names, found " + KindName(k));
    }
    const std::string& key = k.Scalar();
    if (++seen[key] > 1) {
      return InvalidArgument(YamlWhere(k, origin_) + ": duplicate key " + KeyPath(key));
    }
    if (known_.count(key) == 0) {
      std::string list;
      for (const std::string& kn : known_) list += (list.empty() ? "" : ", ") + kn;
      return InvalidArgument(YamlWhere(k, origin_) + ": unknown key " + KeyPath(key) + " (expected one of: " + list +
                             ")");
    }
  }
  return Status::Ok();
}

std::string YamlQuote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace l2l

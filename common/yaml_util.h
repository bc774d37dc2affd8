// Typed, strict reading of YAML maps into our options structs, with errors that name the
// file, line, key path, the value found and what was expected:
//   "configs/x.yaml:7: train.steps: expected an integer >= 1, found '-3'".
// Used by the job config (common/config.cc) and the daemon's own config.
//
// Usage (a missing key keeps the field's current value, i.e. its default):
//   L2L_ASSIGN_OR_RETURN(YamlDoc doc, ParseYaml(text, "configs/x.yaml"));
//   L2L_ASSIGN_OR_RETURN(YamlMap root, YamlMap::Wrap(doc.root, doc.origin, ""));
//   L2L_ASSIGN_OR_RETURN(YamlMap train, root.Map("train"));
//   L2L_RETURN_IF_ERROR(train.Get("steps", &cfg.steps, IntRange{.min = 1}));
//   L2L_RETURN_IF_ERROR(train.GetEnum("mode", &cfg.mode, ParseTrainMode));
//   L2L_RETURN_IF_ERROR(train.Finish());   // unknown keys are errors
//   L2L_RETURN_IF_ERROR(root.Finish());
//
// Scalars are parsed by us, not by yaml-cpp's stream conversions: integers must be whole
// decimal numbers that fit (no "1.5", "1e3" or overflow), floats must be finite, booleans
// are true/false/yes/no/on/off. Line numbers are 1-based.
//
// Thread-safety: values; a YamlMap records which keys were read, so use one per thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "common/status.h"

namespace l2l {

struct YamlDoc {
  YAML::Node root;
  std::string origin;  // file path or a description ("--set train.steps=5")
};

// Parses YAML text; malformed input -> "<origin>:<line>:<col>: malformed YAML: <reason>".
Result<YamlDoc> ParseYaml(const std::string& text, const std::string& origin);
// Reads and parses a file (origin = path).
Result<YamlDoc> LoadYamlFile(const std::string& path);

// "<origin>:<line>" of a node ("<origin>" alone when the node has no position).
std::string YamlWhere(const YAML::Node& node, const std::string& origin);

struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
};
struct FloatRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;  // value must be > min
  bool max_exclusive = false;  // value must be < max
};

class YamlMap {
 public:
  // `node` must be a map or null/absent (an empty map). `path` is the key path of this
  // map ("" for the document root, "model" for a section), used in messages.
  static Result<YamlMap> Wrap(const YAML::Node& node, std::string origin, std::string path);

  bool Has(const std::string& key) const;
  // A nested map (null or absent -> empty). Marks the key as known.
  Result<YamlMap> Map(const std::string& key);

  Status Get(const std::string& key, int64_t* out, IntRange range = {});
  Status Get(const std::string& key, uint64_t* out);
  Status Get(const std::string& key, double* out, FloatRange range = {});
  Status Get(const std::string& key, float* out, FloatRange range = {});
  Status Get(const std::string& key, bool* out);
  Status Get(const std::string& key, std::string* out);
  // A string that must be one of `choices`.
  Status GetChoice(const std::string& key, std::string* out, std::initializer_list<const char*> choices);
  // An enum, read through its Parse function (common/modes.h): a bad name is an error
  // naming the file, line, key and the accepted names. Absent: *out is unchanged.
  template <typename E>
  Status GetEnum(const std::string& key, E* out, Result<E> (*parse)(std::string_view)) {
    std::string text;
    if (Status st = Get(key, &text); !st.ok() || !Has(key)) return st;
    Result<E> e = parse(text);
    if (!e.ok()) return Error(key, e.status().message());
    *out = *e;
    return Status::Ok();
  }
  // Marks a key as known without reading it (handled elsewhere).
  void Accept(const std::string& key) { known_.insert(key); }

  // Errors on keys no Get/Map/Accept asked for, and on duplicate keys.
  Status Finish() const;

  // "<origin>:<line>" of this map, or of `key`'s value when present.
  std::string Where() const;
  std::string Where(const std::string& key) const;
  // "model.n_head" for key "n_head" in map "model".
  std::string KeyPath(const std::string& key) const;
  // An InvalidArgument "<where key>: <key path>: <msg>" (for cross-field checks).
  Status Error(const std::string& key, const std::string& msg) const;
  // A Validate() failure whose message starts "<key>=<value>" or "<section>.<key>=<value>"
  // (the options structs' convention), as InvalidArgument "<origin>:<line of that key>:
  // <message>" ("<origin>: <message>" when the key is not in this map's document).
  Status Locate(const Status& st);
  const std::string& origin() const { return origin_; }
  const YAML::Node& node() const { return node_; }

 private:
  YamlMap(YAML::Node node, std::string origin, std::string path)
      : node_(std::move(node)), origin_(std::move(origin)), path_(std::move(path)) {}
  // The scalar text of `key`; NotFound-free: returns false in *present when absent.
  Status Scalar(const std::string& key, const char* expected, std::string* text, bool* present);

  YAML::Node node_;
  std::string origin_;
  std::string path_;
  std::set<std::string> known_;
};

// Quotes a scalar for emitting YAML by hand (used by the config writers).
std::string YamlQuote(const std::string& s);

}  // namespace l2l

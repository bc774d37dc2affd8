// The ModelSpec field table: every field of common/model_spec.h ModelSpec described once
// (its key, member, type, the families that use it, how it maps to Hugging Face's
// config.json and to GGUF metadata). Everything that lists, reads, writes or compares a
// spec's fields walks this table instead of naming them:
//   - the job/preset YAML `model:` section (common/config.cc: ReadSpecFields, WriteSpecYaml),
//   - the JSON form in checkpoints and model files (common/model_io.cc),
//   - the keys a job may set beside `model.from` and their comparison with the file
//     (common/pretrained/pretrained.cc: SpecFieldText, SameSpecKey),
//   - the wire: RegisterReply carries the job as YAML (proto/data.proto), so the proto has
//     no second copy of the fields.
// Adding a field to one family: a ModelSpec member, one row in kSpecFields
// (model_spec_table.cc), and the family's own files (common/models/<family>.cc for
// validation, layout and config.json, kernels/layers/<family>.cc for compute).
//
// Keys: a top-level field's key is its YAML/JSON key ("rms_norm_eps"); a field of a
// nested group is "group.key" ("rope_scaling.factor"), written as a nested map/object.
// Defaults are ModelSpec{}'s member initialisers (one place), not a column.
//
// Thread-safety: the table is an immutable static; the functions are pure.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model_spec.h"
#include "common/status.h"
#include "common/yaml_util.h"

namespace l2l {

enum class SpecType {
  kInt,       // int64_t
  kFloat,     // double
  kBool,      // bool
  kFamily,    // ModelFamily, as ToString / ParseModelFamily
  kRopeType,  // RopeScalingType, as ToString / ParseRopeScalingType
};

// Bit set of families: bit (1 << int(family)).
constexpr uint32_t FamilyBit(ModelFamily f) { return 1u << static_cast<unsigned>(f); }
constexpr uint32_t kEveryFamily = ~0u;

struct SpecField {
  const char* key;    // "vocab_size", "rope_scaling.factor"
  SpecType type;
  uint32_t families;  // the families that read it; the others require its default
  // The member, as a pointer into a spec (cast to the type above).
  void* (*member)(ModelSpec* spec);
  IntRange int_range;      // YAML bounds for kInt
  FloatRange float_range;  // YAML bounds for kFloat
  // JSON model specs must state it (files written before families existed have exactly
  // these); the others default when absent.
  bool json_required;
  // Omitted from JSON when it holds its default (the family key of GPT-2 specs, so GPT-2
  // files keep the form they had before families existed).
  bool json_omit_default;
  // When this field holds its default in both specs, the rest of its group is ignored in
  // comparisons (rope_scaling.type = none: the factors mean nothing).
  bool group_selector;
  // The value comparisons and messages use, when it differs from the stored one
  // (n_kv_heads: 0 means n_head); nullptr: the stored value.
  int64_t (*effective)(const ModelSpec& spec);
  const char* hf_key;    // transformers' PretrainedConfig attribute ("" = none)
  const char* gguf_key;  // GGUF metadata "<arch>." + this ("" = none)
  const char* doc;       // one line
  // Written (YAML and JSON) only when it differs from the default: fields added after
  // specs were first written (head_size, sliding_window, ...), so the files and the wire
  // YAML of every spec that leaves them at their defaults stay what they were.
  bool omit_default = false;
};

// Every field, in the order YAML and JSON are written.
const std::vector<SpecField>& SpecFields();
// The field of `key` ("rope_scaling.factor"); nullptr if none.
const SpecField* FindSpecField(std::string_view key);
// The group of a field ("rope_scaling" for "rope_scaling.factor"; "" for a top-level one)
// and its key inside the group ("factor").
std::string_view SpecGroup(const SpecField& f);
std::string_view SpecLeaf(const SpecField& f);
// The top-level keys a `model:` section may hold (fields and groups), in table order.
const std::vector<std::string>& SpecTopLevelKeys();
// Whether `spec`'s family reads the field.
bool FamilyUses(const ModelSpec& spec, const SpecField& f);

// The value as text: integers in decimal, floats in %.17g, bools true/false, enums by
// name. `top_key` may name a field or a group ("rope_scaling": "{type: ..., factor: ...}").
std::string SpecFieldText(const ModelSpec& spec, const SpecField& f);
std::string SpecKeyText(const ModelSpec& spec, std::string_view top_key);
// Whether a and b agree on the field or group `top_key` (effective values, group
// selectors honoured).
bool SameSpecKey(const ModelSpec& a, const ModelSpec& b, std::string_view top_key);

// Reads every field present in `model` (a YAML `model:` map) into *spec, with bounds and
// enum names checked; errors name file:line and key. Leaves the map's other keys alone.
Status ReadSpecFields(YamlMap* model, ModelSpec* spec);
// Writes the fields `spec`'s family uses as YAML lines under `indent` spaces.
void WriteSpecYaml(const ModelSpec& spec, int indent, std::ostream& os);
// The JSON object of the fields `spec`'s family uses.
nlohmann::json SpecToJson(const ModelSpec& spec);
// Reads a JSON object written by SpecToJson (or by any earlier version: absent optional
// fields default); unknown keys and wrong types are errors naming the key. Does not
// validate the spec.
Result<ModelSpec> SpecFromJson(const nlohmann::json& j);

}  // namespace l2l

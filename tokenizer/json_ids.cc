// Token ids read from a tokenizer.json. See tokenizer/json_ids.h.
#include "tokenizer/json_ids.h"

#include <algorithm>

#include "common/json_util.h"

namespace l2l::tok {

int64_t TokenizerJsonIdCount(const nlohmann::json& root) {
  auto count = [](const nlohmann::json& obj, const char* key) -> int64_t {
    if (!obj.is_object()) return 0;
    auto it = obj.find(key);
    return it != obj.end() && (it->is_object() || it->is_array()) ? static_cast<int64_t>(it->size()) : 0;
  };
  auto model = root.is_object() ? root.find("model") : root.end();
  const int64_t vocab = model != root.end() ? count(*model, "vocab") : 0;
  return vocab + count(root, "added_tokens");
}

Result<int32_t> JsonTokenId(const nlohmann::json& j, int64_t n_ids, const std::string& where) {
  // Ids are int32 everywhere (tokens files hold uint32 below 2^31 - 1).
  const int64_t max = std::min<int64_t>(n_ids, (int64_t{1} << 31) - 1) - 1;
  Result<int64_t> id = JsonToInt(j, 0, max, where);
  if (!id.ok()) {
    if (!j.is_number_unsigned()) return id.status();  // not an integer, or negative
    return InvalidArgument(where + " = " + JsonSnippet(j) + " is out of range: ids run from 0 to " +
                           std::to_string(max) + " (the file has " + std::to_string(n_ids) +
                           " model.vocab and added_tokens entries)");
  }
  return static_cast<int32_t>(*id);
}

}  // namespace l2l::tok

// Sequence-classification rows and their files. See tokenizer/classify.h.
#include "tokenizer/classify.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/json_util.h"
#include "common/formats/tokens_file.h"

namespace l2l::tok {
namespace {

using json = nlohmann::json;

Result<std::string> TextField(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return InvalidArgument(where + ": no \"" + key + "\"");
  if (!it->is_string()) return InvalidArgument(where + ": \"" + key + "\" is not a string");
  return it->get<std::string>();
}

// HF's LongestFirst truncation of a pair to `budget` tokens (special tokens excluded).
void TruncatePair(std::vector<int32_t>* a, std::vector<int32_t>* b, size_t budget) {
  if (a->size() + b->size() <= budget) return;
  size_t n1 = a->size(), n2 = b->size();
  const bool swap = n1 > n2;
  if (swap) std::swap(n1, n2);  // n1: the shorter
  if (n1 > budget) {
    n2 = n1;
  } else {
    n2 = std::max(n1, budget - n1);
  }
  if (n1 + n2 > budget) {
    n1 = budget / 2;
    n2 = n1 + budget % 2;
  }
  if (swap) std::swap(n1, n2);
  a->resize(std::min(a->size(), n1));
  b->resize(std::min(b->size(), n2));
}

}  // namespace

Status AppendClassifyLine(const WordPieceTokenizer& tok, std::string_view line, const std::string& where,
                          ClassifyRows* rows) {
  const json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(where + ": not a JSON object");
  auto lit = j.find("label");
  if (lit == j.end()) return InvalidArgument(where + ": no \"label\"");
  Result<int64_t> lab = JsonToInt(*lit, 0, int64_t{1} << 30, where + ": \"label\"");
  if (!lab.ok()) return InvalidArgument(lab.status().message() + " (a label is a non-negative integer class index)");
  const int32_t label = static_cast<int32_t>(*lab);
  const bool pair = j.contains("text_a") || j.contains("text_b");
  if (pair && j.contains("text")) return InvalidArgument(where + ": both \"text\" and \"text_a\"/\"text_b\"");
  const size_t L = static_cast<size_t>(rows->max_len);
  const size_t n_special = static_cast<size_t>(tok.num_special_tokens(pair));
  if (L < n_special + 1) {
    return InvalidArgument(where + ": --max-len " + std::to_string(L) + " leaves no room for text after " +
                           std::to_string(n_special) + " special tokens");
  }
  const int32_t pad = tok.pad_id();
  if (pad < 0) return InvalidArgument(where + ": the tokenizer has no [PAD] token");
  WordPieceEncoding e;
  if (pair) {
    L2L_ASSIGN_OR_RETURN(std::string a, TextField(j, "text_a", where));
    L2L_ASSIGN_OR_RETURN(std::string b, TextField(j, "text_b", where));
    // Encode each side without specials, truncate, then let the template add them (ids of
    // the parts do not depend on each other).
    L2L_ASSIGN_OR_RETURN(WordPieceEncoding ea, tok.Encode(a, /*add_special=*/false));
    L2L_ASSIGN_OR_RETURN(WordPieceEncoding eb, tok.Encode(b, /*add_special=*/false));
    TruncatePair(&ea.ids, &eb.ids, L - n_special);
    e = tok.PostProcess(ea.ids, &eb.ids);
  } else {
    L2L_ASSIGN_OR_RETURN(std::string a, TextField(j, "text", where));
    L2L_ASSIGN_OR_RETURN(WordPieceEncoding ea, tok.Encode(a, /*add_special=*/false));
    if (ea.ids.size() > L - n_special) ea.ids.resize(L - n_special);
    e = tok.PostProcess(ea.ids, nullptr);
  }
  for (size_t i = 0; i < L; ++i) {
    const bool real = i < e.ids.size();
    if (real && (e.type_ids[i] < 0 || e.type_ids[i] > 1)) {
      return InvalidArgument(where + ": token type id " + std::to_string(e.type_ids[i]) + " is not 0 or 1");
    }
    rows->ids.push_back(static_cast<uint32_t>(real ? e.ids[i] : pad));
    rows->type_ids.push_back(static_cast<uint8_t>(real ? e.type_ids[i] : 0));
    rows->attention.push_back(real ? 1 : 0);
  }
  rows->labels.push_back(label);
  rows->num_classes = std::max<int64_t>(rows->num_classes, int64_t{label} + 1);
  return Status::Ok();
}

}  // namespace l2l::tok

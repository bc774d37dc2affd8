// Sequence-classification data for encoder (BERT) tasks: JSONL lines {"text","label"} or
// {"text_a","text_b","label"} -> fixed-length rows of token ids, token type ids, attention
// mask and one integer label per row, and the files that hold them (docs/formats.md,
// "Classification rows"):
//   PATH         tokens file (common/tokens_file.h), N*L ids row-major, [PAD] after the text
//   PATH.types   loss-mask layout (magic 20240522), N*L bytes: token type id (0 = A, 1 = B)
//   PATH.attn    loss-mask layout, N*L bytes: 1 = a real token ([CLS]/[SEP] included), 0 = pad
//   PATH.labels  1024-byte header of 256 int32 ([0] magic 20240525, [1] version 1,
//                [2] rows N, [3] row length L, [4] classes K) then N int32 labels in [0, K)
// A row is [CLS] A [SEP] (single) or [CLS] A [SEP] B [SEP] (pair) as the tokenizer's
// post-processor builds it. Text that does not fit in L is truncated before the special
// tokens are added, as HF's `truncation=True` (LongestFirst) does: a single text keeps its
// first L-2 tokens; a pair keeps both parts whole when they fit, else cuts only the longer
// one when that suffices, else gives each part half of the room (the longer part, or B on
// a tie, gets the odd token). Rows equal HF's tokenizer(a, b, truncation=True,
// max_length=L, padding="max_length") ids / token_type_ids / attention_mask.
//
// Thread-safety: free functions; the tokenizer is used through const methods.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/wordpiece.h"

namespace l2l::tok {

inline constexpr int32_t kLabelsMagic = 20240525;
inline constexpr int32_t kLabelsVersion = 1;

// N rows of length max_len, row-major.
struct ClassifyRows {
  int64_t max_len = 0;
  int64_t num_classes = 0;       // K: 1 + the largest label (at least what the rows hold)
  std::vector<uint32_t> ids;     // N * max_len
  std::vector<uint8_t> type_ids; // N * max_len
  std::vector<uint8_t> attention;// N * max_len
  std::vector<int32_t> labels;   // N

  int64_t rows() const { return static_cast<int64_t>(labels.size()); }
};

// Encodes one JSONL line and appends its row to `rows` (rows->max_len must be set, >= 3 for
// a pair and >= 2 for a single text). The label must be a non-negative integer. `where`
// ("data.jsonl:12") prefixes every error. Blank lines are the caller's to skip.
Status AppendClassifyLine(const WordPieceTokenizer& tok, std::string_view line, const std::string& where,
                          ClassifyRows* rows);

// Writes rows [first, first + n) of `rows` to PATH, PATH.types, PATH.attn, PATH.labels
// (each atomically). vocab_size picks the tokens file version.
Status WriteClassifyFiles(const std::string& path, const ClassifyRows& rows, int64_t first, int64_t n,
                          int64_t vocab_size);

// Reads the four files back and checks that they agree (counts N*L, header fields, type ids
// and mask bytes 0/1, labels in [0, K), every id below vocab_size when > 0). Errors name the file.
Result<ClassifyRows> ReadClassifyFiles(const std::string& path, int64_t vocab_size = 0);

}  // namespace l2l::tok

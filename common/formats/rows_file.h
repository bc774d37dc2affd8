// Classification rows: N fixed-length rows of token ids, token type ids and attention
// mask, with one integer label per row, and the four files that hold them
// (docs/formats.md, "Classification rows"):
//   PATH         tokens file (common/formats/tokens_file.h), N*L ids row-major, [PAD] after the text
//   PATH.types   loss-mask layout (magic 20240522), N*L bytes: token type id (0 = A, 1 = B)
//   PATH.attn    loss-mask layout, N*L bytes: 1 = a real token ([CLS]/[SEP] included), 0 = pad
//   PATH.labels  1024-byte header of 256 int32 ([0] magic 20240525, [1] version 1,
//                [2] rows N, [3] row length L, [4] classes K) then N int32 labels in [0, K)
// tokenizer/classify.h builds them from JSONL (l2l-tokenize --task classify | mlm); the data
// loader (task: classify | mlm) and l2l-eval read them. The reader checks every count
// against the others before trusting it.
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace l2l {

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

// Writes rows [first, first + n) of `rows` to PATH, PATH.types, PATH.attn, PATH.labels
// (each atomically). vocab_size picks the tokens file version.
Status WriteClassifyFiles(const std::string& path, const ClassifyRows& rows, int64_t first, int64_t n,
                          int64_t vocab_size);

// Reads the four files back and checks that they agree (counts N*L, header fields, type ids
// and mask bytes 0/1, labels in [0, K), every id below vocab_size when > 0). Errors name the file.
Result<ClassifyRows> ReadClassifyFiles(const std::string& path, int64_t vocab_size = 0);

}  // namespace l2l

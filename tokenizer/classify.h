// Sequence-classification data for encoder (BERT) tasks: JSONL lines {"text","label"} or
// {"text_a","text_b","label"} -> fixed-length rows of token ids, token type ids, attention
// mask and one integer label per row. The rows and their four files (PATH, PATH.types,
// PATH.attn, PATH.labels) are common/formats/rows_file.h's; this header re-exports them.
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

#include "common/formats/rows_file.h"
#include "common/status.h"
#include "tokenizer/wordpiece.h"

namespace l2l::tok {

using ::l2l::ClassifyRows;
using ::l2l::kLabelsMagic;
using ::l2l::kLabelsVersion;
using ::l2l::ReadClassifyFiles;
using ::l2l::WriteClassifyFiles;

// Encodes one JSONL line and appends its row to `rows` (rows->max_len must be set, >= 3 for
// a pair and >= 2 for a single text). The label must be a non-negative integer. `where`
// ("data.jsonl:12") prefixes every error. Blank lines are the caller's to skip.
Status AppendClassifyLine(const WordPieceTokenizer& tok, std::string_view line, const std::string& where,
                          ClassifyRows* rows);

}  // namespace l2l::tok

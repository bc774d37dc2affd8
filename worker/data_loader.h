// DataLoader: micro-batches of next-token training windows from an llm.c tokens file.
//
// The token stream is cut into non-overlapping windows of T+1 tokens starting at
// multiples of T (window k = tokens[k*T, k*T+T]; inputs are its first T tokens, targets
// the last T, i.e. shifted by one). Each epoch visits the windows in an order shuffled
// deterministically from (seed, epoch); a micro-batch is B consecutive windows of that
// order. Sharding: rank r of n takes every n-th window of the shuffled order starting
// at r, so ranks see disjoint windows and each gets the same count (the remainder of
// num_windows / n is left out of that epoch, as is a final partial micro-batch).
// Position: (epoch, batch) of the next micro-batch; it round-trips through a string so
// a checkpoint can resume exactly at the next batch.
//
// Loss mask: when a mask file (common/formats/tokens_file.h's LossMaskPath: "<tokens>.mask",
// written by `l2l-tokenize --jsonl`) lies beside the tokens file, Open reads it and every
// target whose mask byte is 0 becomes kernels::kIgnoreTarget (-1): the head gives it no
// loss and no gradient, so only completion / assistant tokens are trained on.
//
// Rows (task classify | mlm, encoder models): the input is common/formats/rows_file.h's rows files
// (PATH, PATH.types, PATH.attn, PATH.labels; row length L = T). A "window" is then a row:
// the shuffle, sharding and position above apply to rows unchanged. Each micro-batch
// carries the rows' token types and attention mask. Targets:
//   classify: the row's label at position 0, kIgnoreTarget elsewhere (the head reads
//             position 0; rows' labels must be < num_labels);
//   mlm:      MaskMlmRow below (the labels file is not read for anything else).
//
// Ownership: holds the whole token array in memory (int32). Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/modes.h"
#include "common/status.h"

namespace l2l::worker {

// One micro-batch of token windows.
struct MicroBatch {
  int64_t B = 0;                 // sequences
  int64_t T = 0;                 // tokens per sequence
  std::vector<int32_t> inputs;   // (B,T) token ids
  std::vector<int32_t> targets;  // (B,T) the next token after each input, or -1
                                 // (kernels::kIgnoreTarget) where the loss mask is 0
  // Optional (empty = absent), read by encoder families (BERT) only:
  std::vector<int32_t> token_types;     // (B,T) segment ids in [0, model.type_vocab_size)
  std::vector<int32_t> attention_mask;  // (B,T) 1 = real token, 0 = padding (keys masked out)
};

struct DataPosition {
  int64_t epoch = 0;  // epochs completed
  int64_t batch = 0;  // micro-batches of this rank already taken in this epoch
  // "epoch=E,batch=K"
  std::string ToString() const;
  static Result<DataPosition> Parse(const std::string& s);
  bool operator==(const DataPosition&) const = default;
};

struct DataLoaderOptions {
  int64_t B = 4;          // sequences per micro-batch
  int64_t T = 64;         // tokens per sequence
  uint64_t seed = 1234;   // shuffle seed (train.seed)
  int64_t rank = 0;       // this shard, in [0, world)
  int64_t world = 1;      // number of shards
  int64_t vocab_size = 0; // > 0: every token must be < vocab_size (checked on load)
  bool shuffle = true;    // false: windows in file order (validation)
  bool loss_mask = true;  // Open: use "<path>.mask" when it exists
  Task task = Task::kLm;  // kLm: a token stream; kClassify / kMlm: rows files (see above)
  int64_t num_labels = 0; // kClassify: every label must be < num_labels (model.num_labels)
  MlmConfig mlm;          // kMlm: mask id, first word id, probability
};

// Masked-language-model targets for one row of T tokens, the same for every worker, rank
// count and resume: a position t is a candidate when attn[t] = 1 and ids[t] >=
// mlm.first_word_id (never [PAD], [CLS], [SEP], [UNK], [MASK] or [unused*] in a BERT
// vocabulary). Each candidate is chosen independently with probability mlm.probability;
// a chosen position gets target ids[t] and input [MASK] (80%), a random word id in
// [first_word_id, vocab_size) (10%) or ids[t] kept (10%); every other target is
// kIgnoreTarget and its input ids[t]. The random bits are SplitMix64 of (seed, epoch, row,
// t): `row` is the row's index in the file, so a row is masked afresh each epoch.
void MaskMlmRow(const MlmConfig& mlm, int64_t vocab_size, uint64_t seed, int64_t epoch, int64_t row,
                const int32_t* ids, const uint8_t* attn, int64_t T, int32_t* inputs, int32_t* targets);

// The checks of a micro-batch's optional token_types / attention_mask (and, for a
// classification model, its targets: the label at position 0, -1 elsewhere); `where`
// prefixes the error. Families other than bert refuse either array.
Status CheckSequenceInputs(const ModelSpec& spec, const MicroBatch& mb, const std::string& where);

class DataLoader {
 public:
  // Reads an llm.c tokens file (common/formats/tokens_file.h); errors name the path.
  static Result<DataLoader> Open(const std::string& path, const DataLoaderOptions& opts);
  // From tokens already in memory; `origin` names them in errors. mask: empty (every
  // target trained on) or one 0/1 byte per token.
  static Result<DataLoader> FromTokens(std::vector<int32_t> tokens, const DataLoaderOptions& opts,
                                       const std::string& origin = "<tokens>",
                                       std::vector<uint8_t> mask = {});

  // Reads rows files (common/formats/rows_file.h) for opts.task classify | mlm; errors name the
  // file (row length != T, labels >= num_labels, ids >= vocab_size, ...).
  static Result<DataLoader> OpenRows(const std::string& path, const DataLoaderOptions& opts);
  // Open or OpenRows by opts.task.
  static Result<DataLoader> OpenForTask(const std::string& path, const DataLoaderOptions& opts);

  // The next micro-batch; wraps to the next epoch (reshuffled) at the end of one.
  MicroBatch Next();
  // The next `m` micro-batches.
  std::vector<MicroBatch> NextMany(int64_t m);

  const DataPosition& position() const { return pos_; }
  // Resumes at `pos` (as returned by position()); errors when out of range.
  Status Seek(const DataPosition& pos);

  int64_t num_windows() const { return num_windows_; }         // whole stream
  int64_t batches_per_epoch() const { return batches_per_epoch_; }  // this rank
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  bool has_loss_mask() const { return !mask_.empty(); }
  // Fraction of the tokens whose mask byte is 1 (1.0 without a mask).
  double trained_fraction() const;
  const DataLoaderOptions& options() const { return opts_; }

 private:
  DataLoader() = default;
  void Shuffle(int64_t epoch);
  // Rows mode: row `row` into sequence b of *mb (inputs, targets, types, attention).
  void FillRow(int64_t row, int64_t b, MicroBatch* mb) const;

  DataLoaderOptions opts_;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> mask_;  // empty, or one byte per token
  bool rows_ = false;           // rows mode: tokens_ holds num_windows_ rows of T ids
  std::vector<uint8_t> types_, attn_;  // rows mode: (rows, T) token types, attention mask
  std::vector<int32_t> labels_;        // rows mode: (rows) labels
  int64_t num_windows_ = 0;
  int64_t per_rank_ = 0;
  int64_t batches_per_epoch_ = 0;
  std::vector<int64_t> order_;  // window indices of the current epoch, all ranks
  int64_t order_epoch_ = -1;
  DataPosition pos_;
};

}  // namespace l2l::worker

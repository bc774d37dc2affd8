// Job configuration: the typed structs a training job is described by, and their YAML
// loading. One YAML file describes a job (model + optimizer + training + data); the EPS
// reads it (CreateJob / --config) and hands it to workers when they register.
// Daemon-only settings (listen address, state dir, memory budget) live in
// eps_server/eps_config.h and reuse the YAML helpers below.
//
// Rules: every field has a default and a comment; unknown keys are errors; every error
// names the key path, the file and the line ("configs/x.yaml:7: model.n_head=12 does not
// divide model.d_model=1000"). CLI overrides are applied in main() only.
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/adamw.h"
#include "common/dtype.h"
#include "common/lora.h"
#include "common/model_spec.h"
#include "common/modes.h"
#include "common/status.h"

namespace l2l {

struct PathRoots;  // common/path_policy.h

struct TrainingConfig {
  int64_t steps = 100;             // optimizer steps to run
  int64_t micro_batch_size = 4;    // B: sequences per micro-batch
  int64_t micro_batches = 2;       // M: micro-batches per worker per step (accumulated)
  // `micro_batches: auto`: each worker picks M at start from its measured rates
  // (common/micro_batch_plan.h; worker_main.cc logs the choice and why); until then
  // micro_batches keeps its default.
  bool micro_batches_auto = false;
  int64_t seq_len = 0;             // T per sequence; 0 = model.seq_len
  uint64_t seed = 1234;            // init and data order
  int64_t log_every = 1;           // steps between progress lines
  int64_t skip_pause_after = 3;    // steps skipped in a row (non-finite gradient or loss)
                                   // after which the EPS pauses training; 0 = never
  int64_t checkpoint_every = 0;    // steps between checkpoints; 0 = only on request/exit
  TrainMode mode = TrainMode::kSync;  // "sync" or "lockfree"
  int64_t staleness = 1;           // lock-free bound s: a layer version >= t - s is used
  ClipMode clip = ClipMode::kGlobal;  // "none", "per_layer", "global"
  StashPlacement stash = StashPlacement::kDevice;  // "device" or "host" (pinned host memory on a GPU)
  // dtype of the layer outputs the relay stashes (f32 | bf16). bf16: every training
  // forward rounds each layer's output (the embedding's and every block's) to bf16 (round
  // to nearest even) at the layer boundary, the next layer reads the rounded value, the
  // stash holds it in half the bytes (device memory, or host memory and PCIe traffic with
  // stash: host), and the backward treats the rounding as the identity (autocast's
  // casts). The reference trainer rounds at the same places; evaluation never rounds.
  DType stash_dtype = DType::kF32;
  RecomputeMode recompute = RecomputeMode::kAlways;  // "always", "never", "auto" (common/modes.h)
  // Memory for kept block intermediates (recompute never/auto), MiB; 0: the worker picks
  // (half the host RAM on the CPU backend, 4096 MiB on a GPU).
  int64_t activation_budget_mb = 0;
};

struct DataConfig {
  std::string train_path;          // llm.c .bin tokens file; relative paths in a config file
                                   // are resolved against its directory and stored absolute
  std::string val_path;            // optional (empty: no validation)
};

// `mlm:` (used when the job's task is mlm): how rows are masked. The defaults are the
// ids of BERT's uncased WordPiece vocabulary (bert-base-uncased, all-MiniLM-L6-v2):
// [PAD] 0, [unused*] 1..99 and 104..998, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103.
struct MlmConfig {
  int64_t mask_id = 103;         // the [MASK] token id
  int64_t first_word_id = 999;   // ids below it are special or unused: never chosen, never
                                 // drawn as a random replacement
  double probability = 0.15;     // fraction of a row's word tokens chosen for prediction
};

// In-job validation (`eval: {data, every, tokens}`): every `every` steps and at the
// last step the workers score the first `tokens` tokens of `data_path`, cut into
// windows of seq_len+1 tokens as l2l-eval cuts them, with the weights that step's training
// loss is computed at; the daemon logs val_loss / val_ppl (docs/finetune.md "Validation
// during training"). Disabled while data_path is empty.
struct EvalConfig {
  std::string data_path;   // tokens file (a "<data>.mask" beside it is honoured); relative
                           // paths in a config file are resolved against its directory
  int64_t every = 0;       // steps between evaluations (>= 1 when data_path is set)
  int64_t tokens = 0;      // leading tokens scored: >= micro_batch_size * seq_len + 1 (one
                           // micro-batch of windows), at most the file's length
  bool enabled() const { return !data_path.empty(); }
  // Windows of seq_len+1 tokens (starting at multiples of T) that the first `tokens`
  // tokens give, and micro-batches of B of them (the last one may be partial).
  int64_t windows(int64_t T) const { return T > 0 ? (tokens - 1) / T : 0; }
  int64_t micro_batches(int64_t B, int64_t T) const { return B > 0 ? (windows(T) + B - 1) / B : 0; }
};

struct JobConfig {
  ModelSpec model;
  OptimizerConfig optim;
  TrainingConfig train;
  DataConfig data;
  EvalConfig eval;
  DType publish_dtype = DType::kF32;  // dtype of the copy workers fetch: f32 | bf16
  // `task: lm | mlm | classify` (common/modes.h); absent (nullopt) = the family's default:
  // mlm for a bert model with num_labels 0, classify for one with num_labels > 0, lm otherwise.
  std::optional<Task> task;
  MlmConfig mlm;
  // `lora: {r, alpha, dropout, target, base_dtype, init_seed, modules_to_save}`
  // (common/lora.h): train low-rank adapters on a frozen base. Absent: lora.enabled is
  // false and the job trains every parameter.
  LoraConfig lora;

  // `model.from: PATH`: a pretrained model (Hugging Face dir or GGUF file) gives the
  // architecture, the shapes and the initial weights. Parsing only records it (relative
  // paths resolved against the config's directory; model_from_written keeps the text for
  // a daemon that confines paths to its state dir) with the model keys set beside it and
  // where; common/pretrained/pretrained.h ResolveModelFrom replaces `model` by the file's
  // spec, checks those keys against it, and clears model_from. Until then the model and
  // the checks that involve it are not validated.
  std::string model_from;
  std::string model_from_written;
  std::vector<std::pair<std::string, std::string>> model_keys_set;  // (key, "file:line")
  // The file the weights were imported from (set by ResolveModelFrom; serialised as
  // top-level `imported_from`): export copies its tokenizer from there.
  std::string imported_from;

  int64_t seq_len() const { return train.seq_len > 0 ? train.seq_len : model.seq_len; }
  // `task`, or the family's default when the config does not name one.
  Task effective_task() const;
  // The one validation of a job: every field's range and the cross-field checks
  // (seq_len <= model.seq_len, ...). Loading runs it; so do the EPS (CreateJob) and the
  // relay, for configs built in code.
  Status Validate() const;
  // The task's checks (part of Validate): mlm and classify need family bert with the
  // matching head (num_labels 0 / > 0); bert has no lm task.
  Status ValidateTask() const;

  // Whether worker step `step` (0-based; the run log's step step+1) evaluates: its
  // 1-based number is a multiple of eval.every, or it is the job's last step.
  bool EvalAt(int64_t step) const {
    return eval.enabled() && eval.every > 0 && ((step + 1) % eval.every == 0 || step + 1 == train.steps);
  }
};

// Checks eval.data_path against the model: the file exists and is a tokens file (its
// "<data>.mask" too, when present), holds at least eval.tokens tokens, and its first
// eval.tokens ids are below model.vocab_size. Errors name eval.data (and eval.tokens).
// Run by LoadJobConfig (a job file on this host, when the model is known), by the EPS's
// CreateJob (after model.from is resolved) and by the worker before it reads the file;
// not by ParseJobConfig (job text from the daemon, a checkpoint or an rpc: the file may
// live elsewhere or be gone, which must not stop l2l-eval reading a checkpoint). OK when
// eval is disabled.
Status CheckEvalData(const JobConfig& job);

// Loads a job config from YAML. Relative data paths are resolved against the file's
// directory. A missing section keeps its defaults; `preset: NAME` inside `model:` starts
// from configs/models/NAME.yaml's model (lookup order: $L2L_CONFIG_DIR/models, then
// models/, ../models/, ../configs/models/, configs/models/ beside the config file; see
// config.cc). Errors name file, line and key.
// With `roots` (the daemon), every path the job names is confined to them
// (common/path_policy.h ConfineJobPaths; a model.preset path too) before any is opened:
// a path outside is PermissionDenied naming the key and the roots.
Result<JobConfig> LoadJobConfig(const std::string& path, const PathRoots* roots = nullptr);
// Same, from a string (`origin` names it in errors, e.g. "<rpc CreateJob>"); relative
// paths resolve against `base_dir`.
Result<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::string& origin,
                                 const std::string& base_dir = ".", const PathRoots* roots = nullptr);
// Serialises to YAML that ParseJobConfig reads back to an equal JobConfig.
std::string JobConfigToYaml(const JobConfig& cfg);

// Applies "section.key=value" overrides (from a CLI --set flag) with the same checks.
Status ApplyOverride(JobConfig* cfg, const std::string& assignment);

// DType, DTypeName, ParseDType and DTypeSize live in common/dtype.h.

}  // namespace l2l

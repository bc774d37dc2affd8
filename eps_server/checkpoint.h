// Checkpoints of the EPS's model state: one directory per checkpoint,
//
//   <root>/step-<N>/layer-<LLLL>.bin   per layer: 64-byte header, then fp32 master,
//                                      AdamW m, AdamW v (numel each, little-endian)
//   <root>/step-<N>/manifest.json      written last: format, step, the full job config,
//                                      per-expert AdamW step counts (MoE jobs)
//                                      (optimizer, schedule, seed), expected workers,
//                                      per layer file/numel/bytes/crc32, per worker id
//                                      name + data-loader position (the data-order RNG
//                                      state is inside that position; the EPS itself
//                                      has no RNG state beyond train.seed)
//   <root>/latest                      "step-<N>\n", replaced atomically
//
// Atomicity: everything is written into a hidden sibling directory
// (".step-<N>.tmp-<pid>-<k>") with write + fsync per file (common/file_util.h's
// AtomicFileWriter), the manifest last; then the directory is renamed into place (an
// existing step-<N> is swapped out with renameat2(RENAME_EXCHANGE) and removed only
// after), the parent is fsync'ed, and only then `latest` is rewritten. A crash at any
// point leaves the previous checkpoint and `latest` intact.
//
// Streaming: layer files are written from and read into the ParamStore's pages
// directly (page by page) through one ParamStore::StateLease per layer: pages on SSD
// (eps_server/spill_tier.h) pass through the tier's bounded staging pool, so neither a
// whole model nor, beyond that pool, a whole layer is ever held in RAM. A resume
// rebuilds the tiering: loaded pages of spilled arrays are written to the spill file.
// Loading verifies sizes, headers and crc32 of every file and names the file in every
// error (DATA_LOSS for corrupt/truncated, NOT_FOUND for missing).
//
// Thread-safety: free functions. The caller must keep the layers' writers out while
// writing or loading (EpsCore holds the update pipeline's gate).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "eps_server/param_store.h"

namespace l2l::eps {

inline constexpr char kCheckpointManifest[] = "manifest.json";
inline constexpr char kCheckpointLatest[] = "latest";

struct CheckpointWorker {
  int32_t id = -1;
  std::string name;
  std::string data_position;  // loader position at the start of step `step` ("" = start)
};

struct CheckpointMeta {
  int64_t step = 0;                       // optimizer steps the state holds
  JobConfig job;                          // the job (model, optimizer, training, data)
  int32_t expected_workers = 1;
  std::vector<CheckpointWorker> workers;  // by id
  // Mixture-of-experts jobs: AdamW steps each expert has had (n_layer x num_experts,
  // block-major; an expert skipped in a step did not count it); empty otherwise.
  // manifest.json "expert_steps", required for such a job.
  std::vector<int64_t> expert_steps;
  // LoRA jobs: the frozen base the adapters were trained on, by content (ParamStore::
  // BaseHash of the encoded base; the base itself is the job's model.from, or its seed,
  // and is not in the checkpoint). manifest.json "lora_base": {"model_from", "hash"},
  // required for such a job; a resume whose base hashes differently is refused.
  std::string lora_base_hash;
};

struct CheckpointLayerFile {
  std::string file;   // name inside the checkpoint directory
  uint64_t numel = 0;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct CheckpointManifest {
  std::string dir;    // the checkpoint directory it was read from
  CheckpointMeta meta;
  std::vector<CheckpointLayerFile> layers;
};

// "step-00000042" style directory name for step N (fixed width sorts lexically).
std::string CheckpointDirName(int64_t step);

// Writes a checkpoint of `store` into `dir` (created; replaced atomically if it exists).
// Returns the bytes written. When update_latest, <parent of dir>/latest then names it.
Result<int64_t> WriteCheckpoint(const ParamStore& store, const CheckpointMeta& meta,
                                const std::string& dir, bool update_latest);

// Sharded jobs (common/shard_plan.h): every shard writes the layer files of its layers
// (named and headed by model layer) into a part directory <root>/.step-<N>.part-<K>
// (written like a checkpoint: temp dir, fsync, rename); shard 0, once it holds every
// shard's part, assembles them into an ordinary checkpoint <root>/step-<N> (the files
// are renamed in, the manifest written last, then `latest`), so a checkpoint exists only
// when every shard's part is on disk, and it resumes any sharding, or one daemon.
// The root must be one filesystem that every shard sees.
struct CheckpointPart {
  int shard = 0;
  int64_t step = 0;
  std::string dir;                          // name inside the root
  std::vector<int64_t> model_layers;        // per file
  std::vector<CheckpointLayerFile> files;
  int64_t bytes = 0;
};
std::string CheckpointPartDirName(int64_t step, int shard);
Result<CheckpointPart> WriteCheckpointPart(const ParamStore& store, int shard, int64_t step, const std::string& root);
// Errors: a layer no part holds or two parts hold, a part file missing or of another
// size than its shard reported (nothing is installed then; `latest` is unchanged).
Result<int64_t> AssembleCheckpoint(const CheckpointMeta& meta, const std::vector<CheckpointPart>& parts,
                                   const std::string& root, bool update_latest);

// Removes the temporary directories (".<name>.tmp-<pid>-<n>") that WriteCheckpoint left
// in `root` when its process died mid-write (kill -9, OOM, power loss): those whose pid
// is no longer a running process, and those named with this process's pid (call it
// before this process writes checkpoints there). Another live pid's directory is kept (a
// checkpoint in progress, or an unrelated process that reuses the pid: the conservative
// side). Returns how many were removed; a root that does not exist holds none.
Result<int64_t> RemoveStaleCheckpointTemps(const std::string& root);

// `path` is a checkpoint directory (holds manifest.json) or a checkpoint root (holds
// `latest`); returns the checkpoint directory. NOT_FOUND names what was looked for.
Result<std::string> ResolveCheckpointDir(const std::string& path);

// Reads and validates manifest.json (not the layer files).
Result<CheckpointManifest> ReadCheckpointManifest(const std::string& dir);

// Streams every layer file into the store's master/m/v (verifying size, header and
// crc32 first-to-last). The store must have been created for manifest.meta.job.model.
// On error the store's content is unspecified (callers discard it).
Status LoadCheckpointState(const CheckpointManifest& manifest, ParamStore* store);

}  // namespace l2l::eps

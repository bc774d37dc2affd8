// JobStart: where a job's initial state (fp32 master, AdamW m and v, the step it holds)
// comes from, and ChooseJobStart, the one place that picks it, for l2l-eps at start-up
// (--resume, --job) and for the CreateJob rpc alike:
//
//   origin                      start            master (and m, v)
//   a checkpoint (--resume)     FromCheckpoint   master, m, v, step, data positions: its files
//   model.from in the job       FromPretrained   a HF dir or GGUF file (common/pretrained)
//   CreateJob.init_safetensors  FromSafetensors  a safetensors file (common/model_io.h)
//   buffers (tests)             FromBuffers      one fp32 buffer per layer
//   none of these               JobStart{}       InitLayerParams(train.seed)
//
// Every origin but a checkpoint starts the moments at zero: its layers are written by
// ParamStore::WriteMasterZeroMoments, as the seed's are. A start's `load` runs at
// CreateJob and again at every rollback to the initial state (EpsCore::Rollback), so it
// re-reads its source rather than keeping the model in memory (buffers excepted: they
// are copied). EpsCore::CreateJob then refuses a loaded state that is not finite.
//
// Thread-safety: the functions are free; a JobStart's `load` may run on any thread (one
// at a time: the core holds its recovery lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/path_policy.h"
#include "common/status.h"

namespace l2l {
class Pretrained;  // common/pretrained/pretrained.h
}  // namespace l2l

namespace l2l::eps {

class ParamStore;
struct CheckpointManifest;

// How CreateJob initialises the state.
struct JobStart {
  int64_t step = 0;  // optimizer steps the initial state holds (published version)
  // Fills the store's master (and m, v); null: InitLayerParams(train.seed), zero moments.
  std::function<Status(ParamStore*)> load;
  std::string description = "seed";        // for logs: "seed", "checkpoint DIR", "FILE"
  std::string checkpoint_dir;              // when resumed from a checkpoint: its directory
  std::vector<std::string> data_positions; // by worker id, at the start of `step`
  // Mixture-of-experts jobs from a checkpoint: each expert's AdamW step count (empty: 0).
  std::vector<int64_t> expert_steps;
  // The directories the job's data files were confined to (canonical; RegisterReply
  // data_roots: workers refuse data paths outside them). Empty: the core sends its state
  // dir and the directories of the job's own data files (a job from a checkpoint or
  // from code: the operator's).
  std::vector<std::string> data_roots;
};

// A checkpoint as ReadCheckpointManifest read it: its step, directory and the workers'
// data positions; master, m and v are streamed from its layer files at load (sizes,
// headers and crc32 checked then, eps_server/checkpoint.h).
// A LoRA job's checkpoint holds the adapters' state only: `base` (FromPretrained of the
// job's model.from; an empty start: the seed) loads the frozen base first, and the load
// fails (FAILED_PRECONDITION) when the base's hash is not the manifest's lora_base.hash.
JobStart FromCheckpoint(CheckpointManifest manifest, JobStart base = {});

// model.from: `model` as opened by ResolveModelFrom (shapes checked against the job).
// Loads layer by layer: one layer's fp32 values and no more are held at a time, so a
// store on the SSD tier fills without holding the model.
JobStart FromPretrained(std::shared_ptr<const Pretrained> model);

// A safetensors file of the model `spec` (common/model_io.h LoadModel): read once
// here to check every tensor's shape (the error names the tensor), re-read at load.
Result<JobStart> FromSafetensors(const std::string& path, const ModelSpec& spec);

// One fp32 buffer per layer in model order (copied: rollbacks need them after the
// caller's are gone). The layer count and sizes are checked against the store at load.
JobStart FromBuffers(std::vector<std::vector<float>> layers);

// Where a job comes from, as its caller was told.
struct JobSource {
  // A checkpoint directory, or a root whose `latest` names one (l2l-eps --resume): the
  // job, step, worker count and data positions are the checkpoint's. REQUIRES: the
  // fields below empty (the caller says which flags clash).
  std::string checkpoint;
  // Otherwise the job config: a YAML file (l2l-eps --job; errors name the file), or else
  // YAML text sent by `request` (the CreateJob rpc; errors name the request's field).
  std::string job_file;
  std::string job_yaml;
  std::string request = "CreateJob";
  // A safetensors file of the job's model; exclusive with model.from in the job.
  std::string init_safetensors;
  // The directories the job's paths must lie in (common/path_policy.h: model.from,
  // init_safetensors, a model.preset path, data.train_path, data.val_path, eval.data),
  // checked before any is opened; a job file's own directory is added to every list.
  // Null: nothing confined (tests and tools on the user's own files). l2l-eps always
  // passes its paths.* roots, the state dir among them. A checkpoint's job is not
  // re-checked: it was confined when it was created.
  const PathRoots* roots = nullptr;
  // Where a request's relative paths resolve (l2l-eps: its state dir); a job file's
  // resolve against the file's directory.
  std::string base_dir = ".";
};

// The job to create and its start.
struct PlannedJob {
  JobConfig job;   // with model.from, the model is the file's
  JobStart start;
  int32_t checkpoint_workers = 0;  // a checkpoint's expected workers; 0 = not from one
};

// The choice: checkpoint, else the job's model.from, else init_safetensors, else the
// seed. Everything is read and checked here (the job, the checkpoint's manifest, the
// pretrained model's shapes, the safetensors file's tensors) before anything is written.
Result<PlannedJob> ChooseJobStart(const JobSource& source);

}  // namespace l2l::eps

// Model loading for inference. See tools/inference_model.h.
#include "tools/inference_model.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/config.h"
#include "common/formats/lora_adapter.h"
#include "common/formats/model_io.h"
#include "common/formats/peft_adapter.h"
#include "common/pretrained/pretrained.h"
#include "eps_server/checkpoint.h"
#include "tokenizer/load.h"

namespace l2l::tools {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kLayerHeaderBytes = 64;  // eps_server/checkpoint.h's layer file header

// Reads `n` floats at byte `offset` of an open file.
Status PreadAll(int fd, float* out, uint64_t n, uint64_t offset, const std::string& what) {
  char* p = reinterpret_cast<char*>(out);
  uint64_t left = n * sizeof(float);
  while (left > 0) {
    const ssize_t r = ::pread(fd, p, left, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return DataLoss(what + ": read failed: " + std::strerror(errno));
    if (r == 0) return DataLoss(what + ": truncated (end of file at byte " + std::to_string(offset) + ")");
    p += r;
    offset += static_cast<uint64_t>(r);
    left -= static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Result<InferenceModel> FromPretrained(const std::string& path, ModelSourceKind kind, const PretrainedOptions& o = {}) {
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<Pretrained> p, Pretrained::Open(path, o));
  InferenceModel m;
  m.spec = p->spec();
  m.kind = kind;
  m.path = path;
  m.tokenizer_path = path;
  m.layers.resize(p->layout().size());
  for (size_t l = 0; l < p->layout().size(); ++l) {
    m.layers[l].resize(static_cast<size_t>(p->layout()[l].numel));
    L2L_RETURN_IF_ERROR(p->LoadLayer(static_cast<int64_t>(l), m.layers[l].data()));
  }
  return m;
}

}  // namespace

const char* ModelSourceKindName(ModelSourceKind k) {
  switch (k) {
    case ModelSourceKind::kHfDir: return "hf";
    case ModelSourceKind::kGguf: return "gguf";
    case ModelSourceKind::kCheckpoint: return "checkpoint";
    case ModelSourceKind::kSafetensors: return "safetensors";
  }
  return "?";
}

Result<InferenceModel> LoadCheckpointModel(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return NotFound(path + ": no such checkpoint directory");
  if (!fs::exists(fs::path(path) / eps::kCheckpointManifest) && !fs::exists(fs::path(path) / eps::kCheckpointLatest)) {
    return NotFound(path + ": not a checkpoint (neither " + eps::kCheckpointManifest + " nor " +
                    eps::kCheckpointLatest + " inside)");
  }
  L2L_ASSIGN_OR_RETURN(std::string dir, eps::ResolveCheckpointDir(path));
  L2L_ASSIGN_OR_RETURN(eps::CheckpointManifest man, eps::ReadCheckpointManifest(dir));
  const std::string manifest_path = (fs::path(dir) / eps::kCheckpointManifest).string();
  const ModelSpec& spec = man.meta.job.model;
  L2L_RETURN_IF_ERROR(spec.Validate().WithContext(manifest_path));
  if (man.meta.job.lora.enabled) {
    return FailedPrecondition(manifest_path + ": a LoRA job's checkpoint holds its adapters, not the model; evaluate "
                              "the base with the adapter (--model BASE --adapter DIR, after `l2lctl export --format "
                              "peft DIR`) or the merged model (`l2lctl export --format hf --merge DIR`)");
  }
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  if (man.layers.size() != layout.size()) {
    return InvalidArgument(manifest_path + ": " + std::to_string(man.layers.size()) +
                           " layer files, the model has " + std::to_string(layout.size()) + " layers");
  }
  InferenceModel m;
  m.spec = spec;
  m.kind = ModelSourceKind::kCheckpoint;
  m.path = dir;
  m.step = man.meta.step;
  m.tokenizer_path = man.meta.job.imported_from;
  m.layers.resize(layout.size());
  for (size_t l = 0; l < layout.size(); ++l) {
    const eps::CheckpointLayerFile& lf = man.layers[l];
    const std::string file = (fs::path(dir) / lf.file).string();
    const uint64_t numel = static_cast<uint64_t>(layout[l].numel);
    const uint64_t want = kLayerHeaderBytes + 3 * numel * sizeof(float);
    if (lf.numel != numel) {
      return InvalidArgument(manifest_path + ": layer " + std::to_string(l) + " (" + lf.file + ") has numel " +
                             std::to_string(lf.numel) + ", the model's layout needs " + std::to_string(numel));
    }
    if (lf.bytes != want) {
      return InvalidArgument(manifest_path + ": layer " + std::to_string(l) + " (" + lf.file + ") is listed with " +
                             std::to_string(lf.bytes) + " bytes, expected " + std::to_string(want));
    }
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NotFound(file + ": cannot open checkpoint layer file: " + std::strerror(errno));
    struct stat st{};
    Status s = ::fstat(fd, &st) == 0 ? Status::Ok() : DataLoss(file + ": stat failed: " + std::strerror(errno));
    if (s.ok() && static_cast<uint64_t>(st.st_size) != want) {
      s = DataLoss(file + ": " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(want) +
                   " (64-byte header + master, m, v of " + std::to_string(numel) + " floats)");
    }
    if (s.ok()) {
      m.layers[l].resize(numel);
      s = PreadAll(fd, m.layers[l].data(), numel, kLayerHeaderBytes, file);
    }
    ::close(fd);
    L2L_RETURN_IF_ERROR(s);
  }
  return m;
}

Result<InferenceModel> LoadInferenceModel(const std::string& path, const PretrainedOptions& pretrained) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return NotFound(path + ": no such model file or directory");
  if (fs::is_directory(st)) {
    if (fs::exists(fs::path(path) / eps::kCheckpointManifest) || fs::exists(fs::path(path) / eps::kCheckpointLatest)) {
      return LoadCheckpointModel(path);
    }
    if (fs::exists(fs::path(path) / "config.json")) return FromPretrained(path, ModelSourceKind::kHfDir, pretrained);
    return InvalidArgument(path + ": a directory with neither config.json (Hugging Face model) nor " +
                           "manifest.json / latest (checkpoint)");
  }
  if (tok::IsGgufFile(path)) return FromPretrained(path, ModelSourceKind::kGguf);
  L2L_ASSIGN_OR_RETURN(LoadedModel lm, LoadModel(path));
  InferenceModel m;
  m.spec = lm.spec;
  m.layers = std::move(lm.layers);
  m.kind = ModelSourceKind::kSafetensors;
  m.path = path;
  return m;
}

Status ApplyAdapter(InferenceModel* m, const std::string& dir) {
  Result<formats::LoraAdapter> adapter = formats::ReadPeftAdapter(dir);
  if (!adapter.ok()) return adapter.status().WithContext("--adapter");
  Status s = formats::MergeLoraIntoModel(m->spec, *adapter, &m->layers);
  if (!s.ok()) return s.WithContext("--adapter " + dir + " on " + DescribeModel(*m));
  m->adapter = dir;
  return Status::Ok();
}

Result<std::unique_ptr<worker::ReferenceTrainer>> CreateInferenceTrainer(InferenceModel* m) {
  JobConfig cfg;
  cfg.model = m->spec;
  cfg.train.micro_batch_size = 1;
  cfg.train.micro_batches = 1;
  worker::ReferenceTrainerOptions opts;
  opts.device = "cpu";
  Result<std::unique_ptr<worker::ReferenceTrainer>> t = worker::ReferenceTrainer::Create(cfg, std::move(m->layers));
  m->layers.clear();
  if (!t.ok()) return t.status().WithContext(m->path);
  return t;
}

std::string DescribeModel(const InferenceModel& m) {
  std::string s = std::string(ModelSourceKindName(m.kind)) + " " + m.path;
  if (m.step >= 0) s += " (step " + std::to_string(m.step) + ")";
  if (!m.adapter.empty()) s += " + adapter " + m.adapter;
  return s;
}

}  // namespace l2l::tools

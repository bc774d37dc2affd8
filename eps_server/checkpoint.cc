// Checkpoint directories: streaming write and verified load. See checkpoint.h.
#include "eps_server/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/fault_point.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/lora.h"
#include "common/formats/model_io.h"
#include "common/logging.h"

namespace l2l::eps {
namespace {

using nlohmann::json;

// A JSON integer that fits T (common/json_util.h); anything else (a float such as
// 1.4e21, a string, out of range) throws, and the caller reports a corrupt manifest naming
// `key`.
template <typename T>
T JsonInt(const json& j, const char* key) {
  Result<T> v = ::l2l::JsonInt<T>(j.at(key), std::string("\"") + key + "\"");
  if (!v.ok()) throw std::invalid_argument(v.status().message());
  return *v;
}

namespace fs = std::filesystem;

constexpr char kFormat[] = "l2l-checkpoint";
constexpr int kFormatVersion = 1;
constexpr uint64_t kLayerMagic = 0x31544b43324c324cull;  // "L2L2CKT1"
constexpr size_t kHeaderBytes = 64;

struct LayerFileHeader {
  uint64_t magic;
  uint64_t layer;
  uint64_t numel;
  uint64_t arrays;  // 3: master, m, v
  uint8_t pad[32];
};
static_assert(sizeof(LayerFileHeader) == kHeaderBytes);

std::string LayerFileName(int64_t layer) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "layer-%04lld.bin", static_cast<long long>(layer));
  return buf;
}

const float* SpanArray(const StateSpan& s, int which) { return which == 0 ? s.master : which == 1 ? s.m : s.v; }
float* SpanArray(StateSpan& s, int which) { return which == 0 ? s.master : which == 1 ? s.m : s.v; }

// Streams one layer: header, then master, m, v page by page. Returns the file's crc32.
Result<uint32_t> WriteLayerFile(const ParamStore& store, int64_t layer, const std::string& path,
                                uint64_t* bytes) {
  // Spilled pages are read through the SSD tier's staging buffers, one layer at a time.
  L2L_ASSIGN_OR_RETURN(ParamStore::StateLease lease, store.Lease(layer, LeaseMode::kRead));
  L2L_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  LayerFileHeader h{};
  h.magic = kLayerMagic;
  h.layer = static_cast<uint64_t>(store.model_layer(layer));  // a shard's files: model layers
  h.numel = store.layout(layer).numel;
  h.arrays = 3;
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(&h), sizeof(h));
  L2L_RETURN_IF_ERROR(w.Append(&h, sizeof(h)));
  for (int which = 0; which < 3; ++which) {
    for (const StateSpan& s : lease.spans()) {
      const float* p = SpanArray(s, which);
      crc = crc32(crc, reinterpret_cast<const Bytef*>(p), static_cast<uInt>(s.n * sizeof(float)));
      L2L_RETURN_IF_ERROR(w.Append(p, s.n * sizeof(float)));
    }
  }
  *bytes = w.bytes_written();
  L2L_RETURN_IF_ERROR(w.Commit());
  return static_cast<uint32_t>(crc);
}

std::string ManifestJson(const CheckpointMeta& meta, const std::vector<CheckpointLayerFile>& layers) {
  json j;
  j["format"] = kFormat;
  j["version"] = kFormatVersion;
  j["step"] = meta.step;
  j["expected_workers"] = meta.expected_workers;
  j["created_unix"] = static_cast<int64_t>(std::time(nullptr));
  j["model_spec"] = json::parse(ModelSpecToJson(meta.job.model));
  j["job_yaml"] = JobConfigToYaml(meta.job);
  json ls = json::array();
  for (const auto& l : layers) {
    ls.push_back({{"file", l.file}, {"numel", l.numel}, {"bytes", l.bytes}, {"crc32", l.crc32}});
  }
  j["layers"] = ls;
  json ws = json::array();
  for (const auto& w : meta.workers) {
    ws.push_back({{"id", w.id}, {"name", w.name}, {"data_position", w.data_position}});
  }
  j["workers"] = ws;
  if (!meta.expert_steps.empty()) j["expert_steps"] = meta.expert_steps;
  if (meta.job.lora.enabled) {
    // The file the base came from (model.from, as ResolveModelFrom recorded it), or "".
    j["lora_base"] = {{"model_from", meta.job.imported_from}, {"hash", meta.lora_base_hash}};
  }
  return j.dump(1) + "\n";
}

// Moves tmp into place as dir (swapping out an existing dir), then removes the old one.
Status InstallDir(const std::string& tmp, const std::string& dir) {
  if (::rename(tmp.c_str(), dir.c_str()) == 0) return Status::Ok();
  if (errno != ENOTEMPTY && errno != EEXIST) return ErrnoError("rename " + tmp + " ->", dir, errno);
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    return ErrnoError("renameat2(RENAME_EXCHANGE) " + tmp + " <->", dir, errno);
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);  // now the old checkpoint
  if (ec) L2L_LOG_WARN("cannot remove replaced checkpoint {}: {}", tmp, ec.message());
  return Status::Ok();
}

// A hidden sibling ".<name>.tmp-<pid>-<n>" of <parent>/<name> to write a checkpoint (or a
// shard's part) into; removed when it goes out of scope unless Install() put it in place.
class TempCheckpointDir {
 public:
  static Result<std::unique_ptr<TempCheckpointDir>> Make(const std::string& parent, const std::string& name) {
    static std::atomic<int> counter{0};
    auto t = std::unique_ptr<TempCheckpointDir>(new TempCheckpointDir());
    t->parent_ = parent;
    t->path_ = parent + "/." + name + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
    if (::mkdir(t->path_.c_str(), 0755) != 0) {
      const int err = errno;
      t->armed_ = false;
      return ErrnoError("mkdir", t->path_, err);
    }
    return t;
  }
  ~TempCheckpointDir() {
    if (!armed_) return;
    std::error_code e;
    fs::remove_all(path_, e);
  }
  const std::string& path() const { return path_; }
  // fsync the directory, rename it to `dir` (swapping out an existing one), fsync the parent.
  Status Install(const std::string& dir) {
    L2L_RETURN_IF_ERROR(FsyncDir(path_));
    L2L_RETURN_IF_ERROR(InstallDir(path_, dir));
    armed_ = false;
    return FsyncDir(parent_);
  }

 private:
  TempCheckpointDir() = default;
  std::string parent_, path_;
  bool armed_ = true;
};

}  // namespace

std::string CheckpointDirName(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

Result<int64_t> WriteCheckpoint(const ParamStore& store, const CheckpointMeta& meta,
                                const std::string& dir_in, bool update_latest) {
  if (dir_in.empty()) return InvalidArgument("checkpoint directory is empty");
  // A spill write fault leaves the SSD copy untrustworthy: never checkpoint from it.
  L2L_RETURN_IF_ERROR(store.health().WithContext("checkpoint " + dir_in));
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const fs::path p(dir);
  const std::string parent = p.has_parent_path() ? p.parent_path().string() : ".";
  const std::string name = p.filename().string();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return Status(StatusCode::kIoError, "cannot create checkpoint root " + parent + ": " + ec.message());
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<TempCheckpointDir> temp, TempCheckpointDir::Make(parent, name));
  const std::string& tmp = temp->path();

  std::vector<CheckpointLayerFile> files;
  int64_t total = 0;
  if (store.num_layers() != store.model_num_layers()) {
    return FailedPrecondition("checkpoint " + dir_in + ": this store is a shard (layers " +
                              std::to_string(store.first_layer()) + ".." +
                              std::to_string(store.first_layer() + store.num_layers() - 1) +
                              "); a shard writes a part (WriteCheckpointPart)");
  }
  for (int64_t l = 0; l < store.num_layers(); ++l) {
    CheckpointLayerFile f;
    f.file = LayerFileName(l);
    f.numel = store.layout(l).numel;
    L2L_ASSIGN_OR_RETURN(f.crc32, WriteLayerFile(store, l, tmp + "/" + f.file, &f.bytes));
    total += static_cast<int64_t>(f.bytes);
    files.push_back(f);
    FaultPoint("eps.checkpoint");  // tests: die with some layer files written
  }
  const std::string manifest = ManifestJson(meta, files);
  L2L_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + kCheckpointManifest, manifest.data(), manifest.size()));
  total += static_cast<int64_t>(manifest.size());
  L2L_RETURN_IF_ERROR(temp->Install(dir));
  if (update_latest) {
    const std::string latest = name + "\n";
    L2L_RETURN_IF_ERROR(WriteFileAtomic(parent + "/" + kCheckpointLatest, latest.data(), latest.size()));
  }
  return total;
}

std::string CheckpointPartDirName(int64_t step, int shard) {
  return "." + CheckpointDirName(step) + ".part-" + std::to_string(shard);
}

Result<CheckpointPart> WriteCheckpointPart(const ParamStore& store, int shard, int64_t step, const std::string& root) {
  L2L_RETURN_IF_ERROR(store.health().WithContext("checkpoint part of step " + std::to_string(step)));
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Status(StatusCode::kIoError, "cannot create checkpoint root " + root + ": " + ec.message());
  CheckpointPart part;
  part.shard = shard;
  part.step = step;
  part.dir = CheckpointPartDirName(step, shard);
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<TempCheckpointDir> temp, TempCheckpointDir::Make(root, part.dir.substr(1)));
  const std::string& tmp = temp->path();
  for (int64_t l = 0; l < store.num_layers(); ++l) {
    CheckpointLayerFile f;
    f.file = LayerFileName(store.model_layer(l));
    f.numel = store.layout(l).numel;
    L2L_ASSIGN_OR_RETURN(f.crc32, WriteLayerFile(store, l, tmp + "/" + f.file, &f.bytes));
    part.bytes += static_cast<int64_t>(f.bytes);
    part.model_layers.push_back(store.model_layer(l));
    part.files.push_back(f);
    FaultPoint("eps.checkpoint");  // tests: die with some layer files written
  }
  L2L_RETURN_IF_ERROR(temp->Install(root + "/" + part.dir));
  return part;
}

Result<int64_t> AssembleCheckpoint(const CheckpointMeta& meta, const std::vector<CheckpointPart>& parts,
                                   const std::string& root, bool update_latest) {
  const int64_t L = static_cast<int64_t>(BuildLayout(meta.job.model).size());
  std::vector<const CheckpointLayerFile*> files(static_cast<size_t>(L), nullptr);
  std::vector<const CheckpointPart*> owner(static_cast<size_t>(L), nullptr);
  for (const CheckpointPart& p : parts) {
    if (p.step != meta.step) {
      return Internal("checkpoint part of shard " + std::to_string(p.shard) + " is of step " +
                      std::to_string(p.step) + ", assembling step " + std::to_string(meta.step));
    }
    if (p.dir.empty() || p.dir.find('/') != std::string::npos || p.model_layers.size() != p.files.size()) {
      return InvalidArgument("checkpoint part of shard " + std::to_string(p.shard) + " is malformed (dir '" + p.dir +
                             "')");
    }
    for (size_t i = 0; i < p.files.size(); ++i) {
      const int64_t l = p.model_layers[i];
      if (l < 0 || l >= L || files[static_cast<size_t>(l)] != nullptr ||
          p.files[i].file != LayerFileName(l)) {
        return InvalidArgument("checkpoint part of shard " + std::to_string(p.shard) + " lists layer " +
                               std::to_string(l) + " (" + p.files[i].file + "): out of range, or listed twice");
      }
      files[static_cast<size_t>(l)] = &p.files[i];
      owner[static_cast<size_t>(l)] = &p;
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    if (files[static_cast<size_t>(l)] == nullptr) {
      return FailedPrecondition("checkpoint of step " + std::to_string(meta.step) + ": no shard's part holds layer " +
                                std::to_string(l));
    }
  }
  const std::string name = CheckpointDirName(meta.step);
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<TempCheckpointDir> temp, TempCheckpointDir::Make(root, name));
  const std::string& tmp = temp->path();
  // Each part's files are on disk (fsync'ed by their shard); a rename moves them in
  // (the root is one shared filesystem). Sizes are checked first: a part that lost a
  // file since it was reported must not make a checkpoint.
  std::vector<CheckpointLayerFile> listed;
  int64_t total = 0;
  for (int64_t l = 0; l < L; ++l) {
    const CheckpointLayerFile& f = *files[static_cast<size_t>(l)];
    const std::string from = root + "/" + owner[static_cast<size_t>(l)]->dir + "/" + f.file;
    std::error_code ec;
    const uintmax_t size = fs::file_size(from, ec);
    if (ec || size != f.bytes) {
      return DataLoss("checkpoint part file " + from + (ec ? " is missing: " + ec.message()
                                                           : " has " + std::to_string(size) + " bytes, its shard said " +
                                                                 std::to_string(f.bytes)));
    }
    if (::rename(from.c_str(), (tmp + "/" + f.file).c_str()) != 0) return ErrnoError("rename", from, errno);
    listed.push_back(f);
    total += static_cast<int64_t>(f.bytes);
  }
  const std::string manifest = ManifestJson(meta, listed);
  L2L_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + kCheckpointManifest, manifest.data(), manifest.size()));
  total += static_cast<int64_t>(manifest.size());
  L2L_RETURN_IF_ERROR(temp->Install(root + "/" + name));
  if (update_latest) {
    const std::string latest = name + "\n";
    L2L_RETURN_IF_ERROR(WriteFileAtomic(root + "/" + kCheckpointLatest, latest.data(), latest.size()));
  }
  for (const CheckpointPart& p : parts) {  // now empty
    std::error_code ec;
    fs::remove_all(root + "/" + p.dir, ec);
  }
  return total;
}

Result<int64_t> RemoveStaleCheckpointTemps(const std::string& root) {
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec == std::errc::no_such_file_or_directory) return int64_t{0};
  if (ec) return Status(StatusCode::kIoError, "cannot list checkpoint root " + root + ": " + ec.message());
  int64_t removed = 0;
  for (const fs::directory_entry& e : it) {
    // ".<name>.tmp-<pid>-<n>", as WriteCheckpoint names them.
    const std::string name = e.path().filename().string();
    const size_t tag = name.rfind(".tmp-");
    if (name.size() < 2 || name[0] != '.' || tag == std::string::npos || tag == 0) continue;
    long pid = 0, n = 0;
    int used = 0;
    if (std::sscanf(name.c_str() + tag, ".tmp-%ld-%ld%n", &pid, &n, &used) != 2 ||
        static_cast<size_t>(used) != name.size() - tag || pid <= 0) {
      continue;
    }
    // Another process that is alive, or exists but is not ours to signal (EPERM): keep
    // it. This process's own pid counts as stale (a daemon restarted in a container may
    // get its predecessor's pid); see the header.
    if (pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;
    std::error_code rec;
    fs::remove_all(e.path(), rec);
    if (rec) return Status(StatusCode::kIoError, "cannot remove partial checkpoint " + e.path().string() + ": " +
                                                     rec.message());
    ++removed;
  }
  return removed;
}

Result<std::string> ResolveCheckpointDir(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kCheckpointManifest, ec)) return path;
  const std::string latest = path + "/" + kCheckpointLatest;
  if (!fs::exists(latest, ec)) {
    return NotFound("--resume " + path + ": neither " + path + "/" + kCheckpointManifest +
                    " (a checkpoint directory) nor " + latest + " (a checkpoint root) exists");
  }
  L2L_ASSIGN_OR_RETURN(std::string name, ReadFileToString(latest));
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return DataLoss(latest + ": expected a checkpoint directory name like step-00000042, found '" + name + "'");
  }
  const std::string dir = path + "/" + name;
  if (!fs::exists(fs::path(dir) / kCheckpointManifest, ec)) {
    return NotFound(latest + " names " + name + " but " + dir + "/" + kCheckpointManifest + " does not exist");
  }
  return dir;
}

Result<CheckpointManifest> ReadCheckpointManifest(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointManifest;
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  CheckpointManifest m;
  m.dir = dir;
  try {
    const json j = json::parse(text);
    if (j.at("format").get<std::string>() != kFormat) return DataLoss(path + ": not an l2l checkpoint manifest");
    if (JsonInt<int>(j, "version") != kFormatVersion) {
      return DataLoss(path + ": checkpoint format version " + std::to_string(JsonInt<int>(j, "version")) +
                      ", this l2l-eps reads version " + std::to_string(kFormatVersion));
    }
    m.meta.step = JsonInt<int64_t>(j, "step");
    m.meta.expected_workers = JsonInt<int32_t>(j, "expected_workers");
    L2L_ASSIGN_OR_RETURN(m.meta.job, ParseJobConfig(j.at("job_yaml").get<std::string>(), path + " job_yaml"));
    L2L_ASSIGN_OR_RETURN(ModelSpec spec, ModelSpecFromJson(j.at("model_spec").dump()));
    if (!(spec == m.meta.job.model)) return DataLoss(path + ": model_spec differs from job_yaml's model");
    for (const auto& l : j.at("layers")) {
      CheckpointLayerFile f;
      f.file = l.at("file").get<std::string>();
      f.numel = JsonInt<uint64_t>(l, "numel");
      f.bytes = JsonInt<uint64_t>(l, "bytes");
      f.crc32 = JsonInt<uint32_t>(l, "crc32");
      if (f.file.find('/') != std::string::npos) return DataLoss(path + ": layer file name '" + f.file + "' has a '/'");
      m.layers.push_back(f);
    }
    for (const auto& w : j.at("workers")) {
      CheckpointWorker cw;
      cw.id = JsonInt<int32_t>(w, "id");
      cw.name = w.at("name").get<std::string>();
      cw.data_position = w.at("data_position").get<std::string>();
      m.meta.workers.push_back(cw);
    }
    if (j.contains("expert_steps")) {
      for (const auto& s : j.at("expert_steps")) {
        if (!s.is_number_integer() || s.get<int64_t>() < 0) return DataLoss(path + ": expert_steps holds " + s.dump());
        m.meta.expert_steps.push_back(s.get<int64_t>());
      }
    }
    if (j.contains("lora_base")) m.meta.lora_base_hash = j.at("lora_base").at("hash").get<std::string>();
  } catch (const std::exception& e) {
    return DataLoss(path + ": corrupt manifest: " + e.what());
  }
  if (m.meta.step < 0) return DataLoss(path + ": negative step");
  const ModelSpec& ms = m.meta.job.model;
  if (m.meta.expert_steps.size() != static_cast<size_t>(ms.n_layer * ms.num_experts)) {
    return DataLoss(path + ": expert_steps has " + std::to_string(m.meta.expert_steps.size()) +
                    " entries, the model has " + std::to_string(ms.n_layer * ms.num_experts) +
                    " experts (model.n_layer x model.num_experts)");
  }
  if (m.meta.job.lora.enabled && m.meta.lora_base_hash.size() != 16) {
    return DataLoss(path + ": a LoRA job's manifest must name its base (lora_base.hash, 16 hex digits)");
  }
  // The state's layouts: a LoRA job keeps state for its trainable vectors only.
  std::vector<LayerLayout> layouts;
  for (const LayerLayout& l : BuildLoraLayout(m.meta.job.model, m.meta.job.lora)) layouts.push_back(TrainableLayout(l));
  if (layouts.size() != m.layers.size()) {
    return DataLoss(path + ": " + std::to_string(m.layers.size()) + " layer files listed, the model has " +
                    std::to_string(layouts.size()) + " layers");
  }
  for (size_t l = 0; l < layouts.size(); ++l) {
    if (m.layers[l].numel != layouts[l].numel || m.layers[l].bytes != kHeaderBytes + 12 * m.layers[l].numel) {
      return DataLoss(path + ": layer " + std::to_string(l) + " (" + m.layers[l].file + ") lists numel " +
                      std::to_string(m.layers[l].numel) + " / " + std::to_string(m.layers[l].bytes) +
                      " bytes; the model's layer has " + std::to_string(layouts[l].numel) + " parameters");
    }
  }
  return m;
}

Status LoadCheckpointState(const CheckpointManifest& m, ParamStore* store) {
  if (static_cast<int64_t>(m.layers.size()) != store->model_num_layers()) {
    return InvalidArgument("checkpoint " + m.dir + " has " + std::to_string(m.layers.size()) +
                           " layers, the store " + std::to_string(store->model_num_layers()));
  }
  for (int64_t l = 0; l < store->num_layers(); ++l) {  // a shard loads its layers only
    const int64_t ml = store->model_layer(l);
    const CheckpointLayerFile& f = m.layers[static_cast<size_t>(ml)];
    const std::string path = m.dir + "/" + f.file;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      return err == ENOENT ? NotFound("checkpoint layer file " + path + " is missing") : ErrnoError("open", path, err);
    }
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) return ErrnoError("fstat", path, errno);
    if (static_cast<uint64_t>(st.st_size) != f.bytes) {
      return DataLoss("checkpoint layer file " + path + " has " + std::to_string(st.st_size) +
                      " bytes, the manifest says " + std::to_string(f.bytes) + " (truncated or corrupt)");
    }
    auto read_all = [&](void* dst, size_t n) -> Status {
      auto* p = static_cast<char*>(dst);
      while (n > 0) {
        const ssize_t r = ::read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ErrnoError("read", path, errno);
        if (r == 0) return DataLoss("checkpoint layer file " + path + " ended early");
        p += r;
        n -= static_cast<size_t>(r);
      }
      return Status::Ok();
    };
    LayerFileHeader h{};
    L2L_RETURN_IF_ERROR(read_all(&h, sizeof(h)));
    if (h.magic != kLayerMagic || h.layer != static_cast<uint64_t>(ml) || h.numel != f.numel || h.arrays != 3) {
      return DataLoss("checkpoint layer file " + path + " has a bad header (expected layer " + std::to_string(ml) +
                      " with " + std::to_string(f.numel) + " parameters)");
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(&h), sizeof(h));
    // Overwrite lease: spilled pages are filled in staging buffers and written back to
    // the spill file when the lease ends (no whole-model buffer).
    L2L_ASSIGN_OR_RETURN(ParamStore::StateLease lease, store->Lease(l, LeaseMode::kOverwrite));
    for (int which = 0; which < 3; ++which) {
      for (StateSpan s : lease.spans()) {
        float* p = SpanArray(s, which);
        L2L_RETURN_IF_ERROR(read_all(p, s.n * sizeof(float)));
        crc = crc32(crc, reinterpret_cast<const Bytef*>(p), static_cast<uInt>(s.n * sizeof(float)));
      }
    }
    if (static_cast<uint32_t>(crc) != f.crc32) {
      return DataLoss("checkpoint layer file " + path + " is corrupt: crc32 " + std::to_string(crc) +
                      ", the manifest says " + std::to_string(f.crc32));
    }
  }
  // The loaded pages reach the spill file behind the leases: wait for them, so a
  // resume that returns OK has its whole state durable in its tier.
  if (SpillTier* t = store->tier(); t != nullptr) L2L_RETURN_IF_ERROR(t->Flush().WithContext("resume " + m.dir));
  return Status::Ok();
}

}  // namespace l2l::eps

// The path policy: resolving a named path and checking it against the allowed roots.
// See common/path_policy.h.
#include "common/path_policy.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "common/config.h"

namespace l2l {
namespace {

namespace fs = std::filesystem;

// True when `p` is `root` or below it (both absolute and normalised).
bool Inside(const fs::path& p, const fs::path& root) {
  auto q = p.begin();
  for (auto r = root.begin(); r != root.end(); ++r) {
    if (r->empty()) continue;  // a trailing separator
    if (q == p.end() || *q != *r) return false;
    ++q;
  }
  return true;
}

std::string RootList(const std::vector<std::string>& roots) {
  std::string out = "[";
  for (size_t i = 0; i < roots.size(); ++i) out += (i ? ", " : "") + roots[i];
  return out + "]";
}

}  // namespace

void PathRoots::AddToAll(const std::string& dir) {
  models.push_back(dir);
  data.push_back(dir);
  presets.push_back(dir);
}

std::string ResolveAllowedPath(const std::string& path, const std::string& base_dir) {
  if (path.empty()) return "";
  std::error_code ec;
  fs::path p(path);
  if (p.is_relative()) {
    fs::path base = base_dir.empty() ? fs::current_path(ec) : fs::path(base_dir);
    if (ec) return "";
    if (base.is_relative()) base = fs::absolute(base, ec);
    if (ec) return "";
    p = base / p;
  }
  // Normalised first, so what is checked is what is opened: the caller opens the
  // returned path, never the text it was given.
  const fs::path real = fs::weakly_canonical(p.lexically_normal(), ec);
  if (ec) return "";
  return real.string();
}

std::vector<std::string> CanonicalRoots(const std::vector<std::string>& roots, const std::string& base_dir) {
  std::vector<std::string> out;
  for (const std::string& r : roots) {
    std::string c = ResolveAllowedPath(r, base_dir);
    if (c.empty() || std::find(out.begin(), out.end(), c) != out.end()) continue;
    out.push_back(std::move(c));
  }
  return out;
}

Result<std::string> ConfinePath(std::string_view key, const std::string& path, const std::string& base_dir,
                                const std::vector<std::string>& roots, std::string_view how_to_allow) {
  const std::vector<std::string> allowed = CanonicalRoots(roots);
  const std::string real = ResolveAllowedPath(path, base_dir);
  if (!real.empty()) {
    for (const std::string& root : allowed) {
      if (Inside(fs::path(real), fs::path(root))) return real;
    }
  }
  // One message for every refusal: outside, unresolvable, a symlink leading out, or
  // missing; it must not tell the caller anything about the file.
  return PermissionDenied(std::string(key) + ": refused: allowed only inside " + RootList(allowed) + " (" +
                          std::string(how_to_allow) + ")");
}

std::vector<std::pair<std::string, std::string>> JobDataPaths(const JobConfig& job) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!job.data.train_path.empty()) out.emplace_back("data.train_path", job.data.train_path);
  if (!job.data.val_path.empty()) out.emplace_back("data.val_path", job.data.val_path);
  if (!job.eval.data_path.empty()) out.emplace_back("eval.data", job.eval.data_path);
  return out;
}

Status ConfineJobPaths(JobConfig* job, const PathRoots& roots, const std::string& base_dir) {
  if (!job->model_from.empty()) {
    L2L_ASSIGN_OR_RETURN(job->model_from, ConfinePath("model.from", job->model_from, base_dir, roots.models,
                                                      kAllowModelsHint));
  }
  // imported_from (a job's YAML may carry it: checkpoints, CreateJob): Export copies the
  // tokenizer files of that model directory.
  if (!job->imported_from.empty()) {
    L2L_ASSIGN_OR_RETURN(job->imported_from, ConfinePath("imported_from", job->imported_from, base_dir, roots.models,
                                                         kAllowModelsHint));
  }
  std::string* data[] = {&job->data.train_path, &job->data.val_path, &job->eval.data_path};
  const char* keys[] = {"data.train_path", "data.val_path", "eval.data"};
  for (int i = 0; i < 3; ++i) {
    if (data[i]->empty()) continue;
    L2L_ASSIGN_OR_RETURN(*data[i], ConfinePath(keys[i], *data[i], base_dir, roots.data, kAllowDataHint));
  }
  return Status::Ok();
}

}  // namespace l2l

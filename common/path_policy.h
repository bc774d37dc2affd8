// Path policy: the directories a job may name files in (the daemon config's
// `paths.models`, `paths.data`, `paths.presets`), and ConfinePath, the one function that
// resolves a path a job or a client names and checks it against an explicit list of
// allowed roots before anything opens it. The daemon confines every path of a job with
// it (model.from, init_safetensors, model.preset, data.train_path, data.val_path,
// eval.data), and its Export / Checkpoint targets; workers check the job's data paths
// with it against the roots the daemon sends at Register.
//
// A refusal is PermissionDenied naming the key and the allowed roots and nothing about
// the refused file: not whether it exists, not what it resolves to, not its contents.
// (nginx `root` + `disable_symlinks`, systemd `ReadWritePaths=`.)
//
// Known limit: the check and the later open are two steps; whoever can write inside an
// allowed root can swap a checked component for a symlink in between. The roots are
// meant to be directories only the operator (and the daemon's user) can write.
//
// Thread-safety: pure functions (they read the filesystem).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace l2l {

struct JobConfig;  // common/config.h

// The allowed roots, by what the files are for. Entries are directories; a path is
// allowed when it resolves to the root itself or to something below it.
struct PathRoots {
  std::vector<std::string> models;   // paths.models: model.from, init_safetensors, imported_from
  std::vector<std::string> data;     // paths.data: data.train_path, data.val_path, eval.data
  std::vector<std::string> presets;  // paths.presets: model.preset given as a path to a .yaml file

  // Appends `dir` to all three lists (the state dir, a job file's directory).
  void AddToAll(const std::string& dir);
};

// `path` made absolute (a relative one against `base_dir`, "" = the working directory)
// and lexically normalised, then every symlink of its existing prefix followed (so its
// last components need not exist: an export target). Empty on failure.
std::string ResolveAllowedPath(const std::string& path, const std::string& base_dir);

// Each root resolved as ResolveAllowedPath does (relative ones against `base_dir`);
// duplicates and roots that cannot be resolved dropped, order kept.
std::vector<std::string> CanonicalRoots(const std::vector<std::string>& roots, const std::string& base_dir = "");

// Resolves `path` (ResolveAllowedPath) and returns the resolved path when it lies in one
// of `roots` (each resolved too). Otherwise, and for an empty or unresolvable path:
//   PermissionDenied "<key>: refused: allowed only inside [ROOT, ...] (<how_to_allow>)"
// `key` names what the path is for ("data.train_path", "Export path"); `how_to_allow`
// tells the operator which setting adds a root ("paths.data in the daemon config, or
// l2l-eps --allow-data DIR").
Result<std::string> ConfinePath(std::string_view key, const std::string& path, const std::string& base_dir,
                                const std::vector<std::string>& roots, std::string_view how_to_allow);

// What the daemon's operator sets to add a root of each kind (for ConfinePath's message).
inline constexpr std::string_view kAllowModelsHint = "paths.models in the daemon config, or l2l-eps --allow-models DIR";
inline constexpr std::string_view kAllowDataHint = "paths.data in the daemon config, or l2l-eps --allow-data DIR";
inline constexpr std::string_view kAllowPresetsHint =
    "paths.presets in the daemon config, or l2l-eps --allow-presets DIR";

// Confines the files a parsed job names, replacing each by its resolved path: model.from
// and imported_from (whose tokenizer files Export copies) against roots.models, and
// data.train_path, data.val_path, eval.data (against
// roots.data). Relative paths were made absolute by the parser, so `base_dir` only
// matters for jobs built in code. model.preset is confined while the job is parsed
// (common/config.h ParseJobConfig's `roots`).
Status ConfineJobPaths(JobConfig* job, const PathRoots& roots, const std::string& base_dir = "");

// The data paths of `job` (train, val, eval) that are set, as (key, path) pairs.
std::vector<std::pair<std::string, std::string>> JobDataPaths(const JobConfig& job);

}  // namespace l2l

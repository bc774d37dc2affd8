// YAML loading, validation, overrides and serialisation of JobConfig. See
// common/config.h; the strict field readers are in common/yaml_util.h.
//
// Model presets: `model: {preset: NAME}` starts from the `model:` section of the first
// existing file among
//   1. $L2L_CONFIG_DIR/models/NAME.yaml             (when the variable is set)
//   2. <config dir>/models/NAME.yaml                (configs/job.yaml -> configs/models/)
//   3. <config dir>/../models/NAME.yaml             (configs/jobs/x.yaml -> configs/models/)
//   4. <config dir>/../configs/models/NAME.yaml     (a config beside the repo's configs/)
//   5. <config dir>/configs/models/NAME.yaml        (a config in the repo root)
// NAME may instead be a path ending in ".yaml" (relative to the config's directory);
// when the job's paths are confined (the daemon's paths.presets, common/path_policy.h)
// such a path must lie inside an allowed root, checked before the file is opened. A bare
// NAME cannot leave the lookup directories above.
// Keys given beside `preset:` override the preset's values. A preset file holds only a
// `model:` section and cannot name another preset.
//
// Thread-safety: pure functions (reads the environment and files).
#include "common/config.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "common/env.h"
#include "common/formats/tokens_file.h"
#include "common/model_spec_table.h"
#include "common/models/registry.h"
#include "common/path_policy.h"
#include "common/yaml_util.h"

namespace l2l {
namespace {

namespace fs = std::filesystem;

constexpr IntRange kPositive{.min = 1};
constexpr IntRange kNonNegative{.min = 0};

std::string FloatText(float v) {
  char buf[64];
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  return std::string(buf, ec == std::errc() ? ptr : buf);
}

std::string DoubleText(double v) {
  char buf[64];
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  return std::string(buf, ec == std::errc() ? ptr : buf);
}

bool ValidPresetName(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

// A preset named by a path to its file rather than by its name.
bool IsPresetPath(const std::string& name) { return name.size() > 5 && name.compare(name.size() - 5, 5, ".yaml") == 0; }

Result<std::string> FindPreset(const std::string& name, const std::string& base_dir) {
  const fs::path base = base_dir.empty() ? fs::path(".") : fs::path(base_dir);
  std::vector<fs::path> candidates;
  if (IsPresetPath(name)) {
    candidates.push_back(fs::path(name).is_absolute() ? fs::path(name) : base / name);
  } else {
    if (!ValidPresetName(name)) {
      return InvalidArgument("preset name '" + name + "' must be letters, digits, '-', '_' or '.', or a path to a .yaml file");
    }
    const std::string file = name + ".yaml";
    if (const std::string env = EnvString(EnvVar::kConfigDir); !env.empty()) {
      candidates.push_back(fs::path(env) / "models" / file);
    }
    candidates.push_back(base / "models" / file);
    candidates.push_back(base / ".." / "models" / file);
    candidates.push_back(base / ".." / "configs" / "models" / file);
    candidates.push_back(base / "configs" / "models" / file);
  }
  std::string tried;
  for (const fs::path& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c.lexically_normal().string();
    tried += (tried.empty() ? "" : ", ") + c.lexically_normal().string();
  }
  return NotFound("model preset '" + name + "' not found (tried " + tried + "; set L2L_CONFIG_DIR to the configs dir)");
}

std::string ResolvePath(const std::string& p, const std::string& base_dir) {
  if (p.empty()) return p;
  fs::path path(p);
  if (path.is_relative()) path = fs::path(base_dir.empty() ? "." : base_dir) / path;
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  return (ec ? path : abs).lexically_normal().string();
}

// Reads `model:` of `root` into *spec (a preset first, then the keys beside it) and
// validates the result, reporting failures at the section's line. With `from: PATH` (job
// files only) it records the path and the keys set beside it in *import and leaves the
// validation to ResolveModelFrom (common/pretrained/pretrained.h).
Status ReadModel(YamlMap* root, const std::string& base_dir, bool allow_preset, ModelSpec* spec,
                 JobConfig* import = nullptr, const PathRoots* roots = nullptr) {
  if (!root->Has("model")) {
    root->Accept("model");
    return Status::Ok();
  }
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("model"));
  std::string preset;
  L2L_RETURN_IF_ERROR(m.Get("preset", &preset));
  std::string from;
  if (allow_preset && import != nullptr) L2L_RETURN_IF_ERROR(m.Get("from", &from));
  if (!from.empty()) {
    if (!preset.empty()) return m.Error("from", "model.from and model.preset are exclusive (the file gives the model)");
    import->model_from_written = from;
    import->model_from = ResolvePath(from, base_dir);
    import->model_keys_set.clear();
    for (const std::string& key : SpecTopLevelKeys()) {
      if (m.Has(key)) import->model_keys_set.emplace_back(key, m.Where(key));
    }
    L2L_RETURN_IF_ERROR(ReadSpecFields(&m, spec));
    return m.Finish();  // validated against the file by ResolveModelFrom
  }
  if (!preset.empty()) {
    if (!allow_preset) return m.Error("preset", "a preset file cannot name another preset");
    std::string lookup = preset;
    if (roots != nullptr && IsPresetPath(preset)) {  // a path: confined before it is looked at
      Result<std::string> allowed =
          ConfinePath("model.preset", preset, base_dir, roots->presets, kAllowPresetsHint);
      if (!allowed.ok()) return allowed.status().WithContext(m.Where("preset"));
      lookup = *allowed;
    }
    Result<std::string> path = FindPreset(lookup, base_dir);
    if (!path.ok()) return m.Error("preset", path.status().message());
    L2L_ASSIGN_OR_RETURN(YamlDoc doc, LoadYamlFile(*path));
    L2L_ASSIGN_OR_RETURN(YamlMap proot, YamlMap::Wrap(doc.root, doc.origin, ""));
    const std::string preset_dir = fs::path(*path).parent_path().string();
    Status st = ReadModel(&proot, preset_dir, /*allow_preset=*/false, spec);
    if (st.ok()) st = proot.Finish();
    if (!st.ok()) return st.WithContext(m.Where("preset") + ": loading model preset '" + preset + "'");
  }
  L2L_RETURN_IF_ERROR(ReadSpecFields(&m, spec));
  L2L_RETURN_IF_ERROR(m.Finish());
  if (Status st = spec->Validate(); !st.ok()) {
    return InvalidArgument(root->Where("model") + ": model: " + st.message());
  }
  return Status::Ok();
}

Status ReadOptim(YamlMap* root, OptimizerConfig* o) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("optim"));
  L2L_RETURN_IF_ERROR(m.Get("lr", &o->lr, FloatRange{.min = 0, .min_exclusive = true}));
  L2L_RETURN_IF_ERROR(m.Get("min_lr_ratio", &o->min_lr_ratio, FloatRange{.min = 0, .max = 1}));
  L2L_RETURN_IF_ERROR(m.Get("warmup_steps", &o->warmup_steps, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("total_steps", &o->total_steps, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("beta1", &o->beta1, FloatRange{.min = 0, .max = 1, .max_exclusive = true}));
  L2L_RETURN_IF_ERROR(m.Get("beta2", &o->beta2, FloatRange{.min = 0, .max = 1, .max_exclusive = true}));
  L2L_RETURN_IF_ERROR(m.Get("eps", &o->eps, FloatRange{.min = 0, .min_exclusive = true}));
  L2L_RETURN_IF_ERROR(m.Get("weight_decay", &o->weight_decay, FloatRange{.min = 0}));
  L2L_RETURN_IF_ERROR(m.Get("grad_clip", &o->grad_clip, FloatRange{}));
  L2L_RETURN_IF_ERROR(m.GetEnum("gpu_fraction", &o->gpu_fraction, ParseGpuFraction));
  return m.Finish();
}

Status ReadTrain(YamlMap* root, TrainingConfig* t) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("train"));
  L2L_RETURN_IF_ERROR(m.Get("steps", &t->steps, kPositive));
  L2L_RETURN_IF_ERROR(m.Get("micro_batch_size", &t->micro_batch_size, kPositive));
  if (m.Has("micro_batches") && m.node()["micro_batches"].IsScalar() &&
      m.node()["micro_batches"].Scalar() == "auto") {
    t->micro_batches_auto = true;  // the worker plans it (common/micro_batch_plan.h)
    m.Accept("micro_batches");
  } else {
    L2L_RETURN_IF_ERROR(m.Get("micro_batches", &t->micro_batches, kPositive));
  }
  L2L_RETURN_IF_ERROR(m.Get("seq_len", &t->seq_len, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("seed", &t->seed));
  L2L_RETURN_IF_ERROR(m.Get("log_every", &t->log_every, kPositive));
  L2L_RETURN_IF_ERROR(m.Get("skip_pause_after", &t->skip_pause_after, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("checkpoint_every", &t->checkpoint_every, kNonNegative));
  L2L_RETURN_IF_ERROR(m.GetEnum("mode", &t->mode, ParseTrainMode));
  L2L_RETURN_IF_ERROR(m.Get("staleness", &t->staleness, kNonNegative));
  L2L_RETURN_IF_ERROR(m.GetEnum("clip", &t->clip, ParseClipMode));
  L2L_RETURN_IF_ERROR(m.GetEnum("stash", &t->stash, ParseStashPlacement));
  std::string stash_dtype = DTypeName(t->stash_dtype);
  L2L_RETURN_IF_ERROR(m.GetChoice("stash_dtype", &stash_dtype, {"f32", "bf16"}));
  t->stash_dtype = ParseDType(stash_dtype).value();
  L2L_RETURN_IF_ERROR(m.GetEnum("recompute", &t->recompute, ParseRecomputeMode));
  L2L_RETURN_IF_ERROR(m.Get("activation_budget_mb", &t->activation_budget_mb, kNonNegative));
  return m.Finish();
}

Status ReadData(YamlMap* root, const std::string& base_dir, DataConfig* d) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("data"));
  std::string train = d->train_path, val = d->val_path;
  L2L_RETURN_IF_ERROR(m.Get("train_path", &train));
  L2L_RETURN_IF_ERROR(m.Get("val_path", &val));
  if (m.Has("train_path")) d->train_path = ResolvePath(train, base_dir);
  if (m.Has("val_path")) d->val_path = ResolvePath(val, base_dir);
  return m.Finish();
}

Status ReadMlm(YamlMap* root, MlmConfig* mlm) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("mlm"));
  L2L_RETURN_IF_ERROR(m.Get("mask_id", &mlm->mask_id, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("first_word_id", &mlm->first_word_id, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("probability", &mlm->probability, FloatRange{.min = 0, .max = 1, .min_exclusive = true}));
  return m.Finish();
}

// `eval: {data: PATH, every: N, tokens: M}`.
Status ReadEval(YamlMap* root, const std::string& base_dir, EvalConfig* e) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("eval"));
  std::string data = e->data_path;
  L2L_RETURN_IF_ERROR(m.Get("data", &data));
  if (m.Has("data")) {
    if (data.empty()) return m.Error("data", "eval.data is empty; name a tokens file (or drop the eval section)");
    e->data_path = ResolvePath(data, base_dir);
  }
  L2L_RETURN_IF_ERROR(m.Get("every", &e->every, kPositive));
  L2L_RETURN_IF_ERROR(m.Get("tokens", &e->tokens, kPositive));
  return m.Finish();
}

// A list of strings, or (for `target`) one string: `target: all-linear`.
Status ReadStringList(YamlMap* m, const std::string& key, std::vector<std::string>* out) {
  if (!m->Has(key)) return Status::Ok();
  m->Accept(key);
  const YAML::Node n = m->node()[key];
  std::vector<std::string> v;
  try {
    if (n.IsScalar()) {
      v.push_back(n.as<std::string>());
    } else if (n.IsSequence()) {
      for (const YAML::Node& e : n) {
        if (!e.IsScalar()) return m->Error(key, m->KeyPath(key) + ": expected a list of names");
        v.push_back(e.as<std::string>());
      }
    } else if (!n.IsNull()) {
      return m->Error(key, m->KeyPath(key) + ": expected a list of names");
    }
  } catch (const std::exception& e) {
    return m->Error(key, m->KeyPath(key) + ": " + e.what());
  }
  *out = std::move(v);
  return Status::Ok();
}

// `lora: {r, alpha, dropout, target, base_dtype, init_seed, modules_to_save}`.
Status ReadLora(YamlMap* root, LoraConfig* lora) {
  if (!root->Has("lora")) return Status::Ok();
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("lora"));
  lora->enabled = true;
  L2L_RETURN_IF_ERROR(m.Get("r", &lora->r));
  L2L_RETURN_IF_ERROR(m.Get("alpha", &lora->alpha));
  L2L_RETURN_IF_ERROR(m.Get("dropout", &lora->dropout));
  L2L_RETURN_IF_ERROR(ReadStringList(&m, "target", &lora->target));
  L2L_RETURN_IF_ERROR(m.GetEnum("base_dtype", &lora->base_dtype, ParseLoraBaseDType));
  L2L_RETURN_IF_ERROR(m.Get("init_seed", &lora->init_seed));
  L2L_RETURN_IF_ERROR(ReadStringList(&m, "modules_to_save", &lora->modules_to_save));
  return m.Finish();
}

// Applies every section present in `doc` onto *cfg, then runs the cross-field checks;
// with check_files also CheckEvalData (a job file a user loads on this host; not a job
// text from the daemon, a checkpoint manifest or an rpc, whose files may live elsewhere).
// With `roots`, the paths the job names are confined (common/path_policy.h) before any
// of them is opened.
Status ApplyDoc(const YamlDoc& doc, const std::string& base_dir, JobConfig* cfg, bool check_files,
                const PathRoots* roots = nullptr) {
  // An empty document (nothing, whitespace or comments only) is a mistake (a truncated
  // or wrong file), not a request for every default.
  if (!doc.root.IsDefined() || doc.root.IsNull()) {
    return InvalidArgument(doc.origin + ": the job config is empty (no keys, only whitespace or comments); "
                           "a job needs at least its model, e.g. configs/quickstart.yaml");
  }
  L2L_ASSIGN_OR_RETURN(YamlMap root, YamlMap::Wrap(doc.root, doc.origin, ""));
  L2L_RETURN_IF_ERROR(ReadModel(&root, base_dir, /*allow_preset=*/true, &cfg->model, cfg, roots));
  L2L_RETURN_IF_ERROR(ReadOptim(&root, &cfg->optim));
  L2L_RETURN_IF_ERROR(ReadTrain(&root, &cfg->train));
  L2L_RETURN_IF_ERROR(ReadData(&root, base_dir, &cfg->data));
  L2L_RETURN_IF_ERROR(ReadEval(&root, base_dir, &cfg->eval));
  std::string dtype = DTypeName(cfg->publish_dtype);
  L2L_RETURN_IF_ERROR(root.GetChoice("publish_dtype", &dtype, {"f32", "bf16"}));
  cfg->publish_dtype = ParseDType(dtype).value();
  L2L_RETURN_IF_ERROR(root.Get("imported_from", &cfg->imported_from));
  if (root.Has("task")) {
    Task task = Task::kLm;
    L2L_RETURN_IF_ERROR(root.GetEnum("task", &task, ParseTask));
    cfg->task = task;
  }
  L2L_RETURN_IF_ERROR(ReadMlm(&root, &cfg->mlm));
  L2L_RETURN_IF_ERROR(ReadLora(&root, &cfg->lora));
  L2L_RETURN_IF_ERROR(root.Finish());
  if (roots != nullptr) {
    if (Status st = ConfineJobPaths(cfg, *roots, base_dir); !st.ok()) return st.WithContext(doc.origin);
  }
  if (!cfg->model_from.empty()) return Status::Ok();  // the model comes with ResolveModelFrom
  // The per-field reads above check what one value can; JobConfig::Validate is the one
  // place for the rest. Its message starts "section.key=value"; point at that key's line.
  if (Status st = cfg->Validate(); !st.ok()) return root.Locate(st);
  if (check_files) {
    if (Status st = CheckEvalData(*cfg); !st.ok()) return root.Locate(st);
  }
  return Status::Ok();
}

}  // namespace

Task JobConfig::effective_task() const {
  if (task.has_value()) return *task;
  if (!models::IsEncoder(model)) return Task::kLm;
  return model.num_labels > 0 ? Task::kClassify : Task::kMlm;
}

Status JobConfig::Validate() const {
  L2L_RETURN_IF_ERROR(model.Validate());
  auto bad = [](const std::string& key, const std::string& value, const std::string& expected) {
    return InvalidArgument(key + "=" + value + ": expected " + expected);
  };
  const OptimizerConfig& o = optim;
  if (!(o.lr > 0) || !std::isfinite(o.lr)) return bad("optim.lr", FloatText(o.lr), "a number > 0");
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) {
    return bad("optim.min_lr_ratio", FloatText(o.min_lr_ratio), "a number in [0, 1]");
  }
  if (o.warmup_steps < 0) return bad("optim.warmup_steps", std::to_string(o.warmup_steps), "an integer >= 0");
  if (o.total_steps < 0) return bad("optim.total_steps", std::to_string(o.total_steps), "an integer >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return bad("optim.beta1", FloatText(o.beta1), "a number in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return bad("optim.beta2", FloatText(o.beta2), "a number in [0, 1)");
  if (!(o.eps > 0) || !std::isfinite(o.eps)) return bad("optim.eps", FloatText(o.eps), "a number > 0");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) {
    return bad("optim.weight_decay", FloatText(o.weight_decay), "a number >= 0");
  }
  if (!std::isfinite(o.grad_clip)) return bad("optim.grad_clip", FloatText(o.grad_clip), "a finite number");
  if (!o.gpu_fraction.automatic && !(o.gpu_fraction.value >= 0 && o.gpu_fraction.value <= 1)) {
    return bad("optim.gpu_fraction", ToString(o.gpu_fraction), "auto or a number in [0, 1]");
  }
  const TrainingConfig& t = train;
  if (t.steps < 1) return bad("train.steps", std::to_string(t.steps), "an integer >= 1");
  if (t.micro_batch_size < 1) return bad("train.micro_batch_size", std::to_string(t.micro_batch_size), "an integer >= 1");
  if (t.micro_batches < 1) return bad("train.micro_batches", std::to_string(t.micro_batches), "an integer >= 1");
  if (t.seq_len < 0) return bad("train.seq_len", std::to_string(t.seq_len), "an integer >= 0");
  if (t.seq_len > model.seq_len) {
    return bad("train.seq_len", std::to_string(t.seq_len), "at most model.seq_len=" + std::to_string(model.seq_len));
  }
  if (t.log_every < 1) return bad("train.log_every", std::to_string(t.log_every), "an integer >= 1");
  if (t.skip_pause_after < 0) {
    return bad("train.skip_pause_after", std::to_string(t.skip_pause_after), "an integer >= 0");
  }
  if (t.checkpoint_every < 0) return bad("train.checkpoint_every", std::to_string(t.checkpoint_every), "an integer >= 0");
  if (t.staleness < 0) return bad("train.staleness", std::to_string(t.staleness), "an integer >= 0");
  if (publish_dtype != DType::kF32 && publish_dtype != DType::kBF16) {
    return bad("publish_dtype", DTypeName(publish_dtype), "f32 or bf16");
  }
  if (t.stash_dtype != DType::kF32 && t.stash_dtype != DType::kBF16) {
    return bad("train.stash_dtype", DTypeName(t.stash_dtype), "f32 or bf16");
  }
  const EvalConfig& e = eval;
  if (!e.enabled()) {
    if (e.every != 0 || e.tokens != 0) {
      return bad("eval.data", "\"\"", "a tokens file (eval.every / eval.tokens are set without it)");
    }
  } else {
    if (e.every < 1) return bad("eval.every", std::to_string(e.every), "an integer >= 1 (steps between evaluations)");
    const int64_t B = t.micro_batch_size, T = seq_len();
    if (e.tokens < B * T + 1) {
      return bad("eval.tokens", std::to_string(e.tokens),
                 "at least one micro-batch of windows, micro_batch_size*seq_len+1 = " + std::to_string(B) + "*" +
                     std::to_string(T) + "+1 = " + std::to_string(B * T + 1));
    }
    if (models::IsEncoder(model)) {
      return bad("eval.data", e.data_path, "no eval section: in-job validation scores next-token prediction, which "
                                           "the bert family does not train (use l2l-eval)");
    }
  }
  L2L_RETURN_IF_ERROR(ValidateTask());
  return ValidateLora(model, lora);
}

Status JobConfig::ValidateTask() const {
  const Task t = effective_task();
  const bool bert = models::IsEncoder(model);
  const std::string family = ToString(model.family);
  switch (t) {
    case Task::kLm:
      if (bert) {
        return InvalidArgument("task=lm: a bert model (an encoder) has no next-token task; use task: mlm "
                               "(model.num_labels: 0) or task: classify (model.num_labels > 0)");
      }
      break;
    case Task::kMlm:
      if (!bert) {
        return InvalidArgument("task=mlm: needs model.family bert (the masked-language-model head), got " + family);
      }
      if (model.num_labels != 0) {
        return InvalidArgument("task=mlm: needs model.num_labels 0 (the MLM head), got " +
                               std::to_string(model.num_labels) + " (a classification head); use task: classify");
      }
      // The ids are checked here when the config names the task (a bert model built in code
      // for a forward pass only need not set them); the data loader checks them again.
      if (task.has_value() && (mlm.mask_id >= model.vocab_size || mlm.first_word_id >= model.vocab_size)) {
        return InvalidArgument("mlm.mask_id=" + std::to_string(mlm.mask_id) + " / mlm.first_word_id=" +
                               std::to_string(mlm.first_word_id) + ": expected ids below model.vocab_size=" +
                               std::to_string(model.vocab_size) + " (set them for this vocabulary)");
      }
      if (!(mlm.probability > 0 && mlm.probability <= 1)) {
        return InvalidArgument("mlm.probability=" + DoubleText(mlm.probability) + ": expected a number in (0, 1]");
      }
      break;
    case Task::kClassify:
      if (!bert) {
        return InvalidArgument("task=classify: needs model.family bert (the sequence-classification head), got " +
                               family);
      }
      if (model.num_labels <= 0) {
        return InvalidArgument("task=classify: needs model.num_labels > 0 (the number of classes), got " +
                               std::to_string(model.num_labels));
      }
      break;
  }
  return Status::Ok();
}

Status CheckEvalData(const JobConfig& job) {
  const EvalConfig& e = job.eval;
  if (!e.enabled()) return Status::Ok();
  const std::string key = "eval.data=" + e.data_path + ": ";
  std::error_code ec;
  if (!fs::is_regular_file(e.data_path, ec)) return NotFound(key + "no such file (a tokens file from l2l-tokenize)");
  Result<TokensFile> f = TokensFile::Open(e.data_path);
  if (!f.ok()) return InvalidArgument(key + f.status().message());
  if (static_cast<int64_t>(f->size()) < e.tokens) {
    return InvalidArgument(key + "holds " + std::to_string(f->size()) + " tokens, fewer than eval.tokens=" +
                           std::to_string(e.tokens));
  }
  const int64_t V = job.model.vocab_size;
  for (int64_t i = 0; i < e.tokens; ++i) {
    if (static_cast<int64_t>(f->token(static_cast<size_t>(i))) >= V) {
      return OutOfRange(key + "token " + std::to_string(i) + " is id " + std::to_string(f->token(static_cast<size_t>(i))) +
                        ", outside the model's vocabulary [0, " + std::to_string(V) +
                        ") (tokenized with another tokenizer?)");
    }
  }
  const std::string mask = LossMaskPath(e.data_path);
  if (fs::exists(mask, ec)) {
    Result<std::vector<uint8_t>> m = ReadLossMaskFile(mask, static_cast<int64_t>(f->size()));
    if (!m.ok()) return InvalidArgument(key + "its loss mask: " + m.status().message());
  }
  return Status::Ok();
}

Result<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::string& origin, const std::string& base_dir,
                                 const PathRoots* roots) {
  L2L_ASSIGN_OR_RETURN(YamlDoc doc, ParseYaml(yaml_text, origin));
  JobConfig cfg;
  L2L_RETURN_IF_ERROR(ApplyDoc(doc, base_dir, &cfg, /*check_files=*/false, roots));
  return cfg;
}

Result<JobConfig> LoadJobConfig(const std::string& path, const PathRoots* roots) {
  L2L_ASSIGN_OR_RETURN(YamlDoc doc, LoadYamlFile(path));
  JobConfig cfg;
  const std::string dir = fs::path(path).parent_path().string();
  L2L_RETURN_IF_ERROR(ApplyDoc(doc, dir.empty() ? "." : dir, &cfg, /*check_files=*/true, roots));
  return cfg;
}

Status ApplyOverride(JobConfig* cfg, const std::string& assignment) {
  const std::string origin = "override '" + assignment + "'";
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument(origin + ": expected section.key=value (e.g. train.steps=5)");
  }
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  YamlDoc value_doc;
  L2L_ASSIGN_OR_RETURN(value_doc, ParseYaml(value, origin));
  YamlDoc doc;
  doc.origin = origin;
  try {
    const size_t dot = key.find('.');
    if (dot == std::string::npos) {
      doc.root[key] = value_doc.root;
    } else {
      const std::string section = key.substr(0, dot), field = key.substr(dot + 1);
      if (section.empty() || field.empty() || field.find('.') != std::string::npos) {
        return InvalidArgument(origin + ": expected section.key=value (e.g. train.steps=5)");
      }
      doc.root[section][field] = value_doc.root;
    }
  } catch (const std::exception& e) {
    return InvalidArgument(origin + ": " + e.what());
  }
  JobConfig updated = *cfg;
  L2L_RETURN_IF_ERROR(ApplyDoc(doc, ".", &updated, /*check_files=*/false));
  *cfg = std::move(updated);
  return Status::Ok();
}

std::string JobConfigToYaml(const JobConfig& cfg) {
  std::ostringstream os;
  const ModelSpec& m = cfg.model;
  if (!cfg.model_from.empty()) os << "model:\n  from: " << YamlQuote(cfg.model_from) << "\n";
  if (cfg.model_from.empty()) {
    os << "model:\n";
    WriteSpecYaml(m, 2, os);
  }
  const OptimizerConfig& o = cfg.optim;
  os << "optim:\n"
     << "  lr: " << FloatText(o.lr) << "\n"
     << "  min_lr_ratio: " << FloatText(o.min_lr_ratio) << "\n"
     << "  warmup_steps: " << o.warmup_steps << "\n"
     << "  total_steps: " << o.total_steps << "\n"
     << "  beta1: " << FloatText(o.beta1) << "\n"
     << "  beta2: " << FloatText(o.beta2) << "\n"
     << "  eps: " << FloatText(o.eps) << "\n"
     << "  weight_decay: " << FloatText(o.weight_decay) << "\n"
     << "  grad_clip: " << FloatText(o.grad_clip) << "\n"
     << "  gpu_fraction: " << ToString(o.gpu_fraction) << "\n";
  const TrainingConfig& t = cfg.train;
  os << "train:\n"
     << "  steps: " << t.steps << "\n"
     << "  micro_batch_size: " << t.micro_batch_size << "\n"
     << "  micro_batches: " << (t.micro_batches_auto ? std::string("auto") : std::to_string(t.micro_batches)) << "\n"
     << "  seq_len: " << t.seq_len << "\n"
     << "  seed: " << t.seed << "\n"
     << "  log_every: " << t.log_every << "\n"
     << "  skip_pause_after: " << t.skip_pause_after << "\n"
     << "  checkpoint_every: " << t.checkpoint_every << "\n"
     << "  mode: " << ToString(t.mode) << "\n"
     << "  staleness: " << t.staleness << "\n"
     << "  clip: " << ToString(t.clip) << "\n"
     << "  stash: " << ToString(t.stash) << "\n"
     << "  stash_dtype: " << DTypeName(t.stash_dtype) << "\n"
     << "  recompute: " << ToString(t.recompute) << "\n"
     << "  activation_budget_mb: " << t.activation_budget_mb << "\n";
  os << "data:\n"
     << "  train_path: " << YamlQuote(cfg.data.train_path) << "\n"
     << "  val_path: " << YamlQuote(cfg.data.val_path) << "\n";
  if (cfg.eval.enabled()) {
    os << "eval:\n"
       << "  data: " << YamlQuote(cfg.eval.data_path) << "\n"
       << "  every: " << cfg.eval.every << "\n"
       << "  tokens: " << cfg.eval.tokens << "\n";
  }
  os << "publish_dtype: " << DTypeName(cfg.publish_dtype) << "\n";
  if (cfg.task.has_value()) os << "task: " << ToString(*cfg.task) << "\n";
  os << "mlm:\n"
     << "  mask_id: " << cfg.mlm.mask_id << "\n"
     << "  first_word_id: " << cfg.mlm.first_word_id << "\n"
     << "  probability: " << DoubleText(cfg.mlm.probability) << "\n";
  if (!cfg.imported_from.empty()) os << "imported_from: " << YamlQuote(cfg.imported_from) << "\n";
  if (cfg.lora.enabled) {
    const LoraConfig& l = cfg.lora;
    auto list = [](const std::vector<std::string>& v) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + YamlQuote(v[i]);
      return out + "]";
    };
    os << "lora:\n"
       << "  r: " << l.r << "\n"
       << "  alpha: " << DoubleText(l.alpha) << "\n"
       << "  dropout: " << DoubleText(l.dropout) << "\n"
       << "  target: " << list(l.target) << "\n"
       << "  base_dtype: " << ToString(l.base_dtype) << "\n"
       << "  init_seed: " << l.init_seed << "\n"
       << "  modules_to_save: " << list(l.modules_to_save) << "\n";
  }
  return os.str();
}

}  // namespace l2l

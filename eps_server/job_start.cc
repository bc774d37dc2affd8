// See eps_server/job_start.h.
#include "eps_server/job_start.h"

#include <filesystem>
#include <optional>
#include <utility>

#include "common/formats/model_io.h"
#include "common/pretrained/pretrained.h"
#include "eps_server/checkpoint.h"
#include "eps_server/param_store.h"

namespace l2l::eps {

JobStart FromCheckpoint(CheckpointManifest manifest, JobStart base) {
  JobStart start;
  start.step = manifest.meta.step;
  start.checkpoint_dir = manifest.dir;
  start.description = "checkpoint " + manifest.dir;
  start.expert_steps = manifest.meta.expert_steps;
  for (const CheckpointWorker& w : manifest.meta.workers) {
    if (w.id < 0) continue;
    if (start.data_positions.size() <= static_cast<size_t>(w.id)) start.data_positions.resize(w.id + 1);
    start.data_positions[w.id] = w.data_position;
  }
  auto m = std::make_shared<const CheckpointManifest>(std::move(manifest));
  if (!m->meta.job.lora.enabled) {
    start.load = [m](ParamStore* store) { return LoadCheckpointState(*m, store); };
    return start;
  }
  // A LoRA job: the frozen base from where the job had it (model.from or the seed), then
  // the adapters' state from the checkpoint, if the base is the one they were trained on.
  start.load = [m, base_load = std::move(base.load), what = base.description](ParamStore* store) -> Status {
    if (base_load) {
      L2L_RETURN_IF_ERROR(base_load(store).WithContext("loading the LoRA base " + what));
    } else {
      L2L_RETURN_IF_ERROR(store->InitFromSeed(m->meta.job.train.seed));
    }
    const std::string hash = store->BaseHash();
    if (hash != m->meta.lora_base_hash) {
      return FailedPrecondition("checkpoint " + m->dir + " holds LoRA adapters trained on a base with hash " +
                                m->meta.lora_base_hash + ", but the base " + what + " hashes to " + hash +
                                " (the file changed, or lora.base_dtype differs): resume needs the same base");
    }
    return LoadCheckpointState(*m, store);
  };
  return start;
}

JobStart FromPretrained(std::shared_ptr<const Pretrained> model) {
  JobStart start;
  start.description = model->path();
  start.load = [model](ParamStore* store) -> Status {
    if (store->model_num_layers() != static_cast<int64_t>(model->layout().size())) {
      return InvalidArgument(model->path() + ": " + std::to_string(model->layout().size()) + " layers, the store has " +
                             std::to_string(store->model_num_layers()));
    }
    std::vector<float> master;
    for (int64_t l = 0; l < store->num_layers(); ++l) {  // a shard: its layers only
      const int64_t ml = store->model_layer(l);
      const size_t n = store->base_numel(l);
      if (n != model->layout()[static_cast<size_t>(ml)].numel) {
        return InvalidArgument(model->path() + ": layer " + std::to_string(ml) + " size differs from the store's");
      }
      master.assign(n, 0.0f);
      L2L_RETURN_IF_ERROR(model->LoadLayer(ml, master.data()));
      L2L_RETURN_IF_ERROR(store->WriteInitialLayer(l, master.data()));
    }
    return Status::Ok();
  };
  return start;
}

Result<JobStart> FromSafetensors(const std::string& path, const ModelSpec& spec) {
  L2L_RETURN_IF_ERROR(LoadModel(path, spec).status());  // checks every tensor's shape
  JobStart start;
  start.description = path;
  start.load = [path, spec](ParamStore* store) -> Status {
    L2L_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(path, spec));
    for (int64_t l = 0; l < store->num_layers(); ++l) {
      L2L_RETURN_IF_ERROR(store->WriteInitialLayer(l, m.layers[store->model_layer(l)].data()));
    }
    return Status::Ok();
  };
  return start;
}

JobStart FromBuffers(std::vector<std::vector<float>> layers) {
  auto copy = std::make_shared<const std::vector<std::vector<float>>>(std::move(layers));
  JobStart start;
  start.description = "initial weights";
  start.load = [copy](ParamStore* store) -> Status {
    if (static_cast<int64_t>(copy->size()) != store->model_num_layers()) {
      return InvalidArgument("initial weights have " + std::to_string(copy->size()) + " layers, the model has " +
                             std::to_string(store->model_num_layers()));
    }
    for (int64_t l = 0; l < store->num_layers(); ++l) {  // a shard: its layers only
      const std::vector<float>& w = (*copy)[static_cast<size_t>(store->model_layer(l))];
      if (w.size() != store->base_numel(l)) {
        return InvalidArgument("initial weights of layer " + std::to_string(store->model_layer(l)) + " have " +
                               std::to_string(w.size()) + " floats, expected " +
                               std::to_string(store->base_numel(l)));
      }
      L2L_RETURN_IF_ERROR(store->WriteInitialLayer(l, w.data()));
    }
    return Status::Ok();
  };
  return start;
}

Result<PlannedJob> ChooseJobStart(const JobSource& source) {
  PlannedJob plan;
  if (!source.checkpoint.empty()) {
    L2L_ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(source.checkpoint));
    L2L_ASSIGN_OR_RETURN(CheckpointManifest m, ReadCheckpointManifest(dir));
    plan.job = m.meta.job;
    plan.checkpoint_workers = m.meta.expected_workers;
    JobStart base;  // a LoRA job's frozen base: the file it was imported from (the seed when none)
    base.description = "seed " + std::to_string(plan.job.train.seed);
    if (plan.job.lora.enabled && !plan.job.imported_from.empty()) {
      const std::string& path = plan.job.imported_from;
      const std::string what = "checkpoint " + dir + ": its LoRA job's base " + path;
      JobConfig probe = plan.job;  // ResolveModelFrom replaces the model by the file's
      probe.model_from = path;
      auto model = ResolveModelFrom(&probe, path);
      if (!model.ok()) {
        return model.status().WithContext(what + " (resume needs the base the adapters were trained on)");
      }
      if (!(probe.model == plan.job.model)) {
        return FailedPrecondition(what + " no longer holds the model the adapters were trained on (its config "
                                  "differs): resume needs the same base");
      }
      base = FromPretrained(*model);
    }
    plan.start = FromCheckpoint(std::move(m), std::move(base));
    return plan;
  }
  const bool from_file = !source.job_file.empty();
  // The roots: the caller's, and a job file's own directory.
  std::optional<PathRoots> roots;
  if (source.roots != nullptr) {
    roots = *source.roots;
    if (from_file) {
      const std::string dir = std::filesystem::path(source.job_file).parent_path().string();
      roots->AddToAll(ResolveAllowedPath(dir.empty() ? "." : dir, ""));
    }
  }
  const PathRoots* confined = roots ? &*roots : nullptr;
  if (from_file) {
    L2L_ASSIGN_OR_RETURN(plan.job, LoadJobConfig(source.job_file, confined));
  } else {
    L2L_ASSIGN_OR_RETURN(plan.job, ParseJobConfig(source.job_yaml, "<rpc " + source.request + ">", source.base_dir,
                                                  confined));
  }
  // An error names the job file, or the request's field.
  auto where = [&](const std::string& field) { return from_file ? source.job_file : source.request + " " + field; };
  if (!plan.job.model_from.empty()) {
    // model.from (confined by the parse): the file gives the model and its weights.
    if (!source.init_safetensors.empty()) {
      return InvalidArgument((from_file ? source.job_file : source.request) +
                             ": model.from and init_safetensors are exclusive");
    }
    const std::string path = plan.job.model_from;
    auto model = ResolveModelFrom(&plan.job, path);
    if (!model.ok()) return model.status().WithContext(where("model.from"));
    plan.start = FromPretrained(*model);
  } else if (!source.init_safetensors.empty()) {
    std::string path = source.init_safetensors;
    if (confined != nullptr) {
      auto allowed = ConfinePath("init_safetensors", path, source.base_dir, confined->models, kAllowModelsHint);
      if (!allowed.ok()) return allowed.status().WithContext(from_file ? source.job_file : source.request);
      path = *allowed;
    }
    auto start = FromSafetensors(path, plan.job.model);
    if (!start.ok()) return start.status().WithContext(where("init_safetensors " + path));
    plan.start = std::move(start).value();
  }
  if (confined != nullptr) plan.start.data_roots = CanonicalRoots(confined->data);
  return plan;
}

}  // namespace l2l::eps

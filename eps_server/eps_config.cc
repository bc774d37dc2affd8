// YAML loading of EpsConfig through common/yaml_util.h (as the job's config is read, so
// errors have the same shape: "<file>:<line>: <key path>: expected ..., found '...'").
// See eps_config.h.
#include "eps_server/eps_config.h"

#include <filesystem>
#include <limits>
#include <vector>

#include "common/yaml_util.h"

namespace l2l::eps {
namespace {

constexpr IntRange kPositive{.min = 1};
constexpr IntRange kNonNegative{.min = 0};

// publish_dtype: "" = the job's (no override), else f32 | bf16.
Status ReadPublishDtype(YamlMap* root, std::optional<DType>* out) {
  if (!root->Has("publish_dtype")) return Status::Ok();
  std::string name;
  L2L_RETURN_IF_ERROR(root->Get("publish_dtype", &name));
  if (name.empty()) {
    out->reset();
    return Status::Ok();
  }
  L2L_RETURN_IF_ERROR(root->GetChoice("publish_dtype", &name, {"f32", "bf16"}));
  *out = ParseDType(name).value();
  return Status::Ok();
}

Status ReadMemory(YamlMap* root, EpsConfig* c) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("memory"));
  L2L_RETURN_IF_ERROR(m.Get("host_bytes", &c->host_bytes, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("guard_bytes", &c->guard_bytes, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("page_bytes", &c->page_bytes, kPositive));
  return m.Finish();
}

Status ReadCheckpoint(YamlMap* root, EpsConfig* c) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("checkpoint"));
  L2L_RETURN_IF_ERROR(m.Get("dir", &c->checkpoint_dir));
  L2L_RETURN_IF_ERROR(m.Get("every", &c->checkpoint_every, kNonNegative));
  return m.Finish();
}

Status ReadSecurity(YamlMap* root, EpsConfig* c) {
  L2L_ASSIGN_OR_RETURN(YamlMap tls, root->Map("tls"));
  L2L_RETURN_IF_ERROR(tls.Get("cert", &c->tls_cert));
  L2L_RETURN_IF_ERROR(tls.Get("key", &c->tls_key));
  L2L_RETURN_IF_ERROR(tls.Get("client_ca", &c->tls_client_ca));
  L2L_RETURN_IF_ERROR(tls.Finish());
  L2L_ASSIGN_OR_RETURN(YamlMap auth, root->Map("auth"));
  L2L_RETURN_IF_ERROR(auth.Get("token_file", &c->auth_token_file));
  L2L_RETURN_IF_ERROR(auth.Finish());
  return root->Get("insecure", &c->insecure);
}

Status ReadSpill(YamlMap* root, EpsConfig* c) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("spill"));
  L2L_RETURN_IF_ERROR(m.Get("dir", &c->spill_dir));
  L2L_RETURN_IF_ERROR(m.Get("queue_depth", &c->spill_queue_depth, IntRange{.min = 1, .max = 4096}));
  L2L_RETURN_IF_ERROR(m.Get("block_bytes", &c->spill_block_bytes, kPositive));
  L2L_RETURN_IF_ERROR(m.Get("prefetch_layers", &c->spill_prefetch_layers, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("pool_bytes", &c->spill_pool_bytes, kNonNegative));
  L2L_RETURN_IF_ERROR(m.Get("direct", &c->spill_direct));
  return m.Finish();
}

// `paths: {models: [DIR...], data: [...], presets: [...]}` (a single DIR is a list of one).
Status ReadPaths(YamlMap* root, EpsConfig* c) {
  L2L_ASSIGN_OR_RETURN(YamlMap m, root->Map("paths"));
  std::vector<std::string>* lists[] = {&c->paths.models, &c->paths.data, &c->paths.presets};
  const char* keys[] = {"models", "data", "presets"};
  for (int i = 0; i < 3; ++i) {
    m.Accept(keys[i]);
    if (!m.Has(keys[i])) continue;
    const YAML::Node node = m.node()[keys[i]];
    lists[i]->clear();
    if (node.IsNull()) continue;
    if (!node.IsScalar() && !node.IsSequence()) {
      return m.Error(keys[i], "expected a directory or a list of directories");
    }
    for (const YAML::Node& e : node.IsScalar() ? std::vector<YAML::Node>{node}
                                               : std::vector<YAML::Node>(node.begin(), node.end())) {
      if (!e.IsScalar() || e.Scalar().empty()) return m.Error(keys[i], "expected directory names (non-empty strings)");
      lists[i]->push_back(e.Scalar());
    }
  }
  return m.Finish();
}

// Reads every key of the document into *c; unknown keys are errors naming file:line.
Status ApplyDoc(const YamlDoc& doc, EpsConfig* c) {
  L2L_ASSIGN_OR_RETURN(YamlMap root, YamlMap::Wrap(doc.root, doc.origin, ""));
  L2L_RETURN_IF_ERROR(root.Get("listen", &c->listen));
  L2L_RETURN_IF_ERROR(root.Get("allow_remote", &c->allow_remote));
  L2L_RETURN_IF_ERROR(root.Get("state_dir", &c->state_dir));
  L2L_RETURN_IF_ERROR(root.Get("job_id", &c->job_id));
  L2L_RETURN_IF_ERROR(ReadPublishDtype(&root, &c->publish_dtype));
  int64_t workers = c->expected_workers;
  L2L_RETURN_IF_ERROR(
      root.Get("expected_workers", &workers, IntRange{.min = 1, .max = std::numeric_limits<int32_t>::max()}));
  c->expected_workers = static_cast<int32_t>(workers);
  L2L_RETURN_IF_ERROR(root.Get("heartbeat_timeout_ms", &c->heartbeat_timeout_ms, kNonNegative));
  L2L_RETURN_IF_ERROR(root.Get("update_deadline_ms", &c->update_deadline_ms, kPositive));
  L2L_RETURN_IF_ERROR(root.GetEnum("on_worker_loss", &c->on_worker_loss, ParseOnWorkerLoss));
  L2L_RETURN_IF_ERROR(root.GetEnum("transport", &c->transport, ParseTransport));
  L2L_RETURN_IF_ERROR(root.Get("allow_absolute_paths", &c->allow_absolute_paths));
  L2L_RETURN_IF_ERROR(ReadMemory(&root, c));
  L2L_RETURN_IF_ERROR(ReadCheckpoint(&root, c));
  L2L_RETURN_IF_ERROR(ReadSecurity(&root, c));
  L2L_RETURN_IF_ERROR(ReadSpill(&root, c));
  L2L_RETURN_IF_ERROR(ReadPaths(&root, c));
  L2L_RETURN_IF_ERROR(root.Finish());
  // The reads check what one value can; Validate the rest ("key=value ..." messages,
  // pointed at that key's line).
  return root.Locate(c->Validate());
}

}  // namespace

Status EpsConfig::Validate() const {
  if (expected_workers < 1) return InvalidArgument("expected_workers=" + std::to_string(expected_workers) + " must be >= 1");
  if (page_bytes <= 0 || page_bytes % 4096 != 0) {
    return InvalidArgument("memory.page_bytes=" + std::to_string(page_bytes) + " must be a positive multiple of 4096");
  }
  if (host_bytes < 0) return InvalidArgument("memory.host_bytes must be >= 0");
  if (checkpoint_every < 0) return InvalidArgument("checkpoint.every must be >= 0");
  if (heartbeat_timeout_ms < 0) return InvalidArgument("heartbeat_timeout_ms must be >= 0 (0 = no liveness check)");
  if (update_deadline_ms <= 0) return InvalidArgument("update_deadline_ms must be > 0");
  if (transport == Transport::kShm) return InvalidArgument("transport=shm: expected auto or grpc");
  if (publish_dtype && *publish_dtype != DType::kF32 && *publish_dtype != DType::kBF16) {
    return InvalidArgument(std::string("publish_dtype=") + DTypeName(*publish_dtype) + ": expected f32 or bf16");
  }
  if ((tls_cert.empty()) != (tls_key.empty())) {
    return InvalidArgument("tls.cert and tls.key must be given together (got " +
                           std::string(tls_cert.empty() ? "tls.key only" : "tls.cert only") + ")");
  }
  if (!tls_client_ca.empty() && tls_cert.empty()) {
    return InvalidArgument("tls.client_ca (--tls-client-ca) needs tls.cert and tls.key (--tls-cert/--tls-key): "
                           "client certificates are only asked for over TLS");
  }
  if (spill_queue_depth < 1 || spill_queue_depth > 4096) {
    return InvalidArgument("spill.queue_depth=" + std::to_string(spill_queue_depth) + " must be in 1..4096");
  }
  if (spill_block_bytes <= 0 || spill_block_bytes % 4096 != 0) {
    return InvalidArgument("spill.block_bytes=" + std::to_string(spill_block_bytes) + " must be a positive multiple of 4096");
  }
  if (spill_block_bytes > page_bytes || page_bytes % spill_block_bytes != 0) {
    return InvalidArgument("spill.block_bytes=" + std::to_string(spill_block_bytes) +
                           " must divide memory.page_bytes=" + std::to_string(page_bytes));
  }
  if (spill_prefetch_layers < 0) return InvalidArgument("spill.prefetch_layers must be >= 0");
  if (spill_pool_bytes < 0) return InvalidArgument("spill.pool_bytes must be >= 0 (0 = auto)");
  if (job_id.empty() || job_id.find('/') != std::string::npos) {
    return InvalidArgument("job_id=" + job_id + ": must be non-empty without '/'");
  }
  return Status::Ok();
}

Result<EpsConfig> ParseEpsConfig(const std::string& text, const std::string& origin) {
  L2L_ASSIGN_OR_RETURN(YamlDoc doc, ParseYaml(text, origin));
  EpsConfig c;
  L2L_RETURN_IF_ERROR(ApplyDoc(doc, &c));
  return c;
}

Result<EpsConfig> LoadEpsConfig(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(YamlDoc doc, LoadYamlFile(path));
  EpsConfig c;
  L2L_RETURN_IF_ERROR(ApplyDoc(doc, &c));
  // paths.*: relative to the config file's directory.
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (std::vector<std::string>* list : {&c.paths.models, &c.paths.data, &c.paths.presets}) {
    for (std::string& p : *list) {
      if (std::filesystem::path(p).is_relative()) p = (dir / p).lexically_normal().string();
    }
  }
  return c;
}

}  // namespace l2l::eps

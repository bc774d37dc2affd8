// YAML loading of EpsConfig. See eps_config.h.
#include "eps_server/eps_config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

namespace l2l::eps {
namespace {

std::string At(const std::string& origin, const YAML::Node& n) {
  return origin + ":" + std::to_string(n.Mark().line + 1);
}

template <typename T>
Status Read(const YAML::Node& n, const std::string& origin, const std::string& key, T* out) {
  try {
    *out = n.as<T>();
  } catch (const std::exception& e) {
    return InvalidArgument(At(origin, n) + ": " + key + ": cannot read '" + n.Scalar() + "'");
  }
  return Status::Ok();
}

// A mode name (common/modes.h), parsed here at the edge.
template <typename E>
Status ReadEnum(const YAML::Node& n, const std::string& origin, const std::string& key, E* out,
                Result<E> (*parse)(std::string_view)) {
  std::string text;
  L2L_RETURN_IF_ERROR(Read(n, origin, key, &text));
  Result<E> e = parse(text);
  if (!e.ok()) return InvalidArgument(At(origin, n) + ": " + key + ": " + e.status().message());
  *out = *e;
  return Status::Ok();
}

Status ApplyMap(const YAML::Node& root, const std::string& origin, const std::string& prefix, EpsConfig* c) {
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = prefix + it->first.as<std::string>();
    const YAML::Node v = it->second;  // a copy: *it is a temporary
    if (key == "memory" || key == "checkpoint" || key == "tls" || key == "auth" || key == "spill") {
      if (!v.IsMap()) return InvalidArgument(At(origin, v) + ": " + key + " must be a mapping");
      L2L_RETURN_IF_ERROR(ApplyMap(v, origin, key + ".", c));
    } else if (key == "listen") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->listen));
    } else if (key == "allow_remote") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->allow_remote));
    } else if (key == "state_dir") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->state_dir));
    } else if (key == "job_id") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->job_id));
    } else if (key == "memory.host_bytes") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->host_bytes));
    } else if (key == "memory.page_bytes") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->page_bytes));
    } else if (key == "publish_dtype") {
      std::string name;
      L2L_RETURN_IF_ERROR(Read(v, origin, key, &name));
      if (name.empty()) {
        c->publish_dtype.reset();  // "": the job's publish dtype
      } else {
        DType d = DType::kF32;
        L2L_RETURN_IF_ERROR(ReadEnum(v, origin, key, &d, +[](std::string_view s) { return ParseDType(std::string(s)); }));
        c->publish_dtype = d;
      }
    } else if (key == "expected_workers") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->expected_workers));
    } else if (key == "heartbeat_timeout_ms") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->heartbeat_timeout_ms));
    } else if (key == "update_deadline_ms") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->update_deadline_ms));
    } else if (key == "on_worker_loss") { L2L_RETURN_IF_ERROR(ReadEnum(v, origin, key, &c->on_worker_loss, ParseOnWorkerLoss));
    } else if (key == "transport") { L2L_RETURN_IF_ERROR(ReadEnum(v, origin, key, &c->transport, ParseTransport));
    } else if (key == "checkpoint.dir") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->checkpoint_dir));
    } else if (key == "checkpoint.every") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->checkpoint_every));
    } else if (key == "allow_absolute_paths") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->allow_absolute_paths));
    } else if (key == "tls.cert") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->tls_cert));
    } else if (key == "tls.key") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->tls_key));
    } else if (key == "auth.token_file") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->auth_token_file));
    } else if (key == "insecure") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->insecure));
    } else if (key == "spill.dir") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->spill_dir));
    } else if (key == "spill.queue_depth") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->spill_queue_depth));
    } else if (key == "spill.block_bytes") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->spill_block_bytes));
    } else if (key == "spill.prefetch_layers") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->spill_prefetch_layers));
    } else if (key == "spill.pool_bytes") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->spill_pool_bytes));
    } else if (key == "spill.direct") { L2L_RETURN_IF_ERROR(Read(v, origin, key, &c->spill_direct));
    } else {
      return InvalidArgument(At(origin, YAML::Node(it->first)) + ": unknown key '" + key + "'");
    }
  }
  return Status::Ok();
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
  if (job_id.empty() || job_id.find('/') != std::string::npos) return InvalidArgument("job_id must be non-empty without '/'");
  return Status::Ok();
}

Result<EpsConfig> ParseEpsConfig(const std::string& text, const std::string& origin) {
  EpsConfig c;
  try {
    YAML::Node root = YAML::Load(text);
    if (root.IsNull()) return c;
    if (!root.IsMap()) return InvalidArgument(origin + ": the daemon config must be a mapping");
    L2L_RETURN_IF_ERROR(ApplyMap(root, origin, "", &c));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(origin + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  L2L_RETURN_IF_ERROR(c.Validate().WithContext(origin));
  return c;
}

Result<EpsConfig> LoadEpsConfig(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFound("cannot open daemon config " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseEpsConfig(ss.str(), path);
}

}  // namespace l2l::eps

// l2lctl: the operator's command line for a running l2l-eps daemon (Control service,
// proto/control.proto, through ctl/ctl_client.h).
//
//   l2lctl [--eps HOST:PORT] [--state-dir DIR] [--json] [--connect-timeout-ms MS]
//          [--token-file FILE] [--tls-ca CA.pem [--tls-server-name NAME] [--tls-cert C --tls-key K]]
//          COMMAND
//     status                         one screen: step, loss, tokens/s, layers, workers, memory
//     watch [--steps N] [--timeout S] [--interval S]
//                                    live progress (bar + ETA on a TTY, plain lines otherwise)
//     checkpoint [--dir DIR]         durable checkpoint now (or at the step boundary)
//     export [--format safetensors|hf|gguf|peft|gguf-lora] [--merge]
//            [--dtype f32|bf16|f16|q8_0|q4_k_m] [--max-shard-size SIZE] PATH
//                                        weights: one safetensors file, a Hugging Face
//                                        directory (from_pretrained; sharded above SIZE,
//                                        default 5GB, as transformers' max_shard_size:
//                                        bytes, or KB/MB/GB = 1000^n, KiB/MiB/GiB = 1024^n)
//                                        or a GGUF file; a LoRA job: its adapter (peft: a
//                                        PEFT directory, gguf-lora: llama.cpp's GGUF LoRA)
//                                        or, with --merge, the merged model in the others
//   (checkpoint/export paths are the daemon's: relative ones land in its state dir)
//     pause | resume                 hold / release publishing of new layer versions
//     stop [--abort-step] [--skip-checkpoint] [--no-wait]
//
// The daemon's address: --eps, else 127.0.0.1:<port> from eps.port in --state-dir, else
// $L2L_EPS, else eps.port in $L2L_STATE_DIR, /var/lib/l2l, /tmp/l2l-eps (the first found).
// --json prints one JSON object (watch: one per line) on stdout, errors included.
// Security (docs/operations.md "Security"): --token-file (default $L2L_TOKEN_FILE) sends
// the daemon's shared token; --tls-ca makes the connection TLS, verified against CA.pem;
// --tls-server-name NAME: the name the daemon's certificate must hold when it is not the
// host dialled (e.g. --eps 10.0.0.5:PORT, certificate for eps.internal); --tls-cert and
// --tls-key (with --tls-ca; the key not readable by others): this client's certificate,
// for a daemon that requires one (l2l-eps --tls-client-ca, mutual TLS).
//
// Exit status: 0 ok; 1 the daemon refused or failed the command (also: it wants a token
// and got none or a wrong one); 2 the daemon cannot be reached (within
// --connect-timeout-ms, default 3000; also a plaintext client of a TLS daemon) or no
// address is known; 3 watch timed out before the job (or --steps) finished; 64 bad usage
// (also an unreadable or group/world-readable token file, an unreadable CA file,
// --tls-server-name without --tls-ca, --tls-cert without --tls-key or --tls-ca, a --tls-key
// others may read).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/auth_token.h"
#include "common/env.h"
#include "common/status.h"
#include "ctl/ctl_client.h"

namespace {

using l2l::Result;
using l2l::Status;
using l2l::StatusCode;
using l2l::eps::CtlClient;
using l2l::eps::CtlStatus;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kExitRefused = 1, kExitUnreachable = 2, kExitTimeout = 3;

struct Globals {
  std::string eps, state_dir;
  bool json = false;
  int connect_timeout_ms = 3000;
  std::string token_file, tls_ca, tls_server_name, tls_cert, tls_key;  // flags
  std::string token;             // what they hold (LoadSecrets)
  l2l::ClientTlsFiles tls;
};

// Reads --token-file (else $L2L_TOKEN_FILE), --tls-ca and --tls-cert/--tls-key; checks
// --tls-server-name and the client certificate have a CA.
Status LoadSecrets(Globals* g) {
  if (!g->tls_server_name.empty() && g->tls_ca.empty()) {
    return l2l::InvalidArgument("--tls-server-name " + g->tls_server_name +
                                " needs --tls-ca CA.pem: it names the host the daemon's TLS certificate must "
                                "hold, and without --tls-ca the connection is plaintext");
  }
  const std::string token_file = l2l::TokenFileFromFlagOrEnv(g->token_file);
  if (!token_file.empty()) {
    auto t = l2l::ReadTokenFile(token_file);
    if (!t.ok()) return t.status().WithContext(g->token_file.empty() ? "$L2L_TOKEN_FILE" : "--token-file");
    g->token = *t;
  }
  auto tls = l2l::ReadClientTlsFiles(g->tls_ca, g->tls_cert, g->tls_key);
  if (!tls.ok()) return tls.status();
  g->tls = std::move(tls).value();
  return Status::Ok();
}

struct Target {
  std::string address;
  std::string origin;  // where the address came from, for error messages
};

// --eps > --state-dir's eps.port > $L2L_EPS > eps.port in a default state directory.
Result<Target> ResolveAddress(const Globals& g) {
  if (!g.eps.empty()) return Target{g.eps, "--eps"};
  const std::string env = l2l::EnvString(l2l::EnvVar::kEps);
  if (g.state_dir.empty() && !env.empty()) return Target{env, "$L2L_EPS"};
  std::vector<std::string> dirs;
  if (!g.state_dir.empty()) {
    dirs = {g.state_dir};
  } else {
    if (std::string s = l2l::EnvString(l2l::EnvVar::kStateDir); !s.empty()) dirs.push_back(std::move(s));
    dirs.push_back("/var/lib/l2l");
    dirs.push_back("/tmp/l2l-eps");
  }
  std::string tried;
  for (const std::string& d : dirs) {
    const std::string f = d + "/eps.port";
    std::ifstream in(f);
    int port = 0;
    if (in >> port && port > 0 && port < 65536) return Target{"127.0.0.1:" + std::to_string(port), f};
    tried += (tried.empty() ? "" : ", ") + f + (in.is_open() ? " (no port in it)" : " (missing)");
  }
  return l2l::Unavailable("no daemon address: looked for " + tried +
                          ". Pass --eps HOST:PORT, set $L2L_EPS, or --state-dir DIR of a running l2l-eps.");
}

int EmitError(const Globals& g, const Status& s, const std::string& address, int code) {
  if (g.json) {
    Json j = {{"ok", false},
              {"error", {{"code", l2l::StatusCodeName(s.code())}, {"message", s.message()}}}};
    if (!address.empty()) j["address"] = address;
    std::printf("%s\n", j.dump().c_str());
  }
  std::fprintf(stderr, "l2lctl: %s\n", s.message().c_str());
  return code;
}

int EmitRpcError(const Globals& g, const Status& s, const std::string& address) {
  const bool gone = s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
  return EmitError(g, s, address, gone ? kExitUnreachable : kExitRefused);
}

Result<std::unique_ptr<CtlClient>> Dial(const Globals& g, Target* target) {
  L2L_ASSIGN_OR_RETURN(*target, ResolveAddress(g));
  l2l::eps::CtlClientOptions o;
  o.connect_timeout = std::chrono::milliseconds(g.connect_timeout_ms);
  o.token = g.token;
  o.tls_ca_pem = g.tls.ca_pem;
  o.tls_server_name = g.tls_server_name;
  o.tls_cert_pem = g.tls.cert_pem;
  o.tls_key_pem = g.tls.key_pem;
  auto c = CtlClient::Connect(target->address, o);
  if (!c.ok()) {
    return l2l::Unavailable(
        "cannot reach l2l-eps at " + target->address + " (address from " + target->origin + ") within " +
        std::to_string(g.connect_timeout_ms) + " ms.\n  Check: is l2l-eps running (systemctl status l2l-eps, "
        "pgrep -a l2l-eps)? Is the port in its state dir's eps.port current (a crashed daemon leaves a stale "
        "one)? Override with --eps HOST:PORT or --state-dir DIR." +
        (g.tls.ca_pem.empty() ? "\n  If the daemon serves TLS (--tls-cert), pass --tls-ca CA.pem."
                              : "\n  TLS: is the daemon's certificate signed by --tls-ca and valid for " +
                                    (g.tls_server_name.empty()
                                         ? target->address + "? (If it names another host, pass "
                                                             "--tls-server-name NAME.)"
                                         : "--tls-server-name " + g.tls_server_name + "?") +
                                    " Does the daemon serve TLS at all?" +
                                    (g.tls.cert_pem.empty()
                                         ? "\n  If the daemon requires client certificates (l2l-eps --tls-client-ca), "
                                           "it refuses this client at the TLS handshake (authentication failed: no "
                                           "client certificate): pass --tls-cert FILE --tls-key FILE signed by that CA."
                                         : "\n  If the daemon requires client certificates (l2l-eps --tls-client-ca), "
                                           "authentication fails at the TLS handshake when --tls-cert is not signed "
                                           "by that CA (or has expired).")));
  }
  return c;
}

// ---- formatting ------------------------------------------------------------------------

std::string Bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// A shard size as transformers' max_shard_size spells it: an integer count of bytes, or a
// number with KB/MB/GB (powers of 1000) or KiB/MiB/GiB (powers of 1024), case-insensitive
// ("5GB", "500MB", "1.5GiB", "20KB"). Positive, at most 2^62.
Result<int64_t> ParseShardSize(const std::string& text) {
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"b", 1}};
  std::string s;
  for (char ch : text) s += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = 1;
  for (const auto& [unit, mult] : kUnits) {
    const size_t n = std::strlen(unit);
    if (s.size() > n && s.compare(s.size() - n, n, unit) == 0) {
      s.resize(s.size() - n);
      scale = mult;
      break;
    }
  }
  // strtod (not from_chars: libc++ 14, scripts/tsa.sh, has no floating-point one); the
  // whole rest must be the number, digits first (no sign, no "inf", no spaces).
  char* end = nullptr;
  const double v = s.empty() || !std::isdigit(static_cast<unsigned char>(s[0])) ? -1 : std::strtod(s.c_str(), &end);
  const double bytes = v * scale;
  if (v < 0 || end != s.c_str() + s.size() || !std::isfinite(bytes) || bytes < 1 ||
      bytes > 4.6e18) {
    return l2l::InvalidArgument("--max-shard-size '" + text +
                           "' must be a positive size: bytes, or a number with KB, MB, GB (1000^n) or KiB, MiB, "
                           "GiB (1024^n), e.g. 5GB");
  }
  return static_cast<int64_t>(bytes);
}

std::string Duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof(buf), "%llds", (long long)t);
  return buf;
}

// "12 x5" for runs of equal versions: "0-3:12 4:11".
std::string Versions(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[i]) ++j;
    if (!out.empty()) out += "  ";
    out += (i == j ? std::to_string(i) : std::to_string(i) + "-" + std::to_string(j)) + ":" + std::to_string(v[i]);
    i = j + 1;
  }
  return out.empty() ? "(none)" : out;
}

Json StatusJson(const CtlStatus& s, const std::string& address) {
  Json j = {{"ok", true},          {"address", address},          {"state", s.state},
            {"job_id", s.job_id},  {"step", s.step},              {"total_steps", s.total_steps},
            {"num_params", s.num_params}, {"layer_version", s.layer_version},
            {"last_loss", s.last_loss},   {"tokens_per_s", s.tokens_per_s},
            {"val_loss", s.val_step > 0 ? Json(s.val_loss) : Json()}, {"val_step", s.val_step},
            {"step_time_s", s.step_time_s}, {"update_busy_s", s.update_busy_s},
            {"update_exposed_s", s.update_exposed_s}, {"last_checkpoint", s.last_checkpoint},
            {"error", s.error}, {"staleness_bound", s.staleness_bound}, {"max_version_lag", s.max_version_lag},
            {"skipped_steps", s.skipped_steps}, {"consecutive_skips", s.consecutive_skips},
            {"last_skip_reason", s.last_skip_reason}, {"pause_reason", s.pause_reason}};
  if (s.has_spill) {
    j["spill"] = {{"bytes_read", s.spill_bytes_read}, {"bytes_written", s.spill_bytes_written},
                  {"lease_hits", s.lease_hits}, {"lease_misses", s.lease_misses}, {"lease_wait_s", s.lease_wait_s}};
  }
  j["memory"] = Json::array();
  for (const auto& m : s.memory) {
    j["memory"].push_back({{"tier", m.tier}, {"used_bytes", m.used_bytes}, {"budget_bytes", m.budget_bytes}});
  }
  j["workers"] = Json::array();
  for (const auto& w : s.workers) {
    j["workers"].push_back({{"id", w.id}, {"name", w.name}, {"transport", w.transport}, {"state", w.state},
                            {"step", w.step}, {"last_heartbeat_ms_ago", w.last_heartbeat_ms_ago},
                            {"last_loss", w.last_loss}});
  }
  return j;
}

void PrintStatus(const CtlStatus& s, const std::string& address) {
  std::printf("l2l-eps %s  state %s  job %s\n", address.c_str(), s.state.c_str(),
              s.job_id.empty() ? "(none)" : s.job_id.c_str());
  const double pct = s.total_steps > 0 ? 100.0 * s.step / s.total_steps : 0;
  std::printf("step %lld/%lld (%.1f%%)  loss %.4f  tokens/s %.0f  step %.3f s  update busy %.3f s exposed %.3f s\n",
              (long long)s.step, (long long)s.total_steps, pct, s.last_loss, s.tokens_per_s, s.step_time_s,
              s.update_busy_s, s.update_exposed_s);
  if (s.val_step > 0) {
    std::printf("val_loss %.4f  val_ppl %.3f  (step %lld)\n", s.val_loss, std::exp(s.val_loss), (long long)s.val_step);
  }
  if (!s.error.empty()) std::printf("ERROR %s\n", s.error.c_str());
  if (!s.pause_reason.empty()) std::printf("paused: %s\n", s.pause_reason.c_str());
  if (s.skipped_steps > 0) {
    std::printf("skipped steps %lld (%lld in a row; last: %s)\n", (long long)s.skipped_steps,
                (long long)s.consecutive_skips, s.last_skip_reason.c_str());
  }
  std::printf("params %.3f M  last checkpoint %s\n", s.num_params / 1e6,
              s.last_checkpoint.empty() ? "(none)" : s.last_checkpoint.c_str());
  std::printf("layers (%zu) layer:version  %s\n", s.layer_version.size(), Versions(s.layer_version).c_str());
  std::printf("workers (%zu)\n", s.workers.size());
  if (!s.workers.empty()) {
    std::printf("  %3s  %-16s %-9s %-7s %8s %10s %9s\n", "ID", "NAME", "TRANSPORT", "STATE", "STEP", "HEARTBEAT",
                "LOSS");
  }
  for (const auto& w : s.workers) {
    std::printf("  %3d  %-16s %-9s %-7s %8lld %8.1f s %9.4f\n", w.id, w.name.c_str(), w.transport.c_str(),
                w.state.c_str(), (long long)w.step, w.last_heartbeat_ms_ago / 1000.0, w.last_loss);
  }
  std::printf("memory\n");
  for (const auto& m : s.memory) {
    std::printf("  %-4s %12s%s\n", m.tier.c_str(), Bytes(m.used_bytes).c_str(),
                m.budget_bytes > 0 ? (" / " + Bytes(m.budget_bytes)).c_str() : "");
  }
  if (s.has_spill) {
    std::printf("ssd tier  read %s  written %s  prefetched %lld of %lld updates  waited %.3f s for reads\n",
                Bytes(s.spill_bytes_read).c_str(), Bytes(s.spill_bytes_written).c_str(), (long long)s.lease_hits,
                (long long)(s.lease_hits + s.lease_misses), s.lease_wait_s);
  }
  if (s.staleness_bound > 0) {
    std::printf("lock-free  staleness bound %lld  current max lag %lld\n", (long long)s.staleness_bound,
                (long long)s.max_version_lag);
  }
}

// ---- commands --------------------------------------------------------------------------

// A sharded job (l2l-eps --shard): each shard's status, asked at the address shard 0
// lists, with this command's token and TLS. An unreachable shard is shown as such.
struct ShardView {
  l2l::ShardEndpoint where;
  Result<CtlStatus> status = l2l::Unavailable("not asked");
};

std::vector<ShardView> AskShards(const Globals& g, const CtlStatus& shard0) {
  std::vector<ShardView> out;
  for (const l2l::ShardEndpoint& m : shard0.shard_map) {
    ShardView v;
    v.where = m;
    if (m.index == 0) {
      v.status = shard0;
    } else {
      Globals one = g;
      one.eps = m.address;
      one.connect_timeout_ms = std::min<int64_t>(g.connect_timeout_ms, 3000);
      Target t;
      auto c = Dial(one, &t);
      v.status = c.ok() ? (*c)->GetStatus() : Result<CtlStatus>(c.status());
    }
    out.push_back(std::move(v));
  }
  return out;
}

int64_t TierBytes(const CtlStatus& s, const std::string& tier) {
  for (const auto& m : s.memory) {
    if (m.tier == tier) return m.used_bytes;
  }
  return 0;
}

Json ShardsJson(const std::vector<ShardView>& shards) {
  Json a = Json::array();
  for (const ShardView& v : shards) {
    Json j = {{"index", v.where.index}, {"address", v.where.address}, {"first_layer", v.where.layers.first},
              {"num_layers", v.where.layers.count}, {"reachable", v.status.ok()}};
    if (v.status.ok()) {
      j["state"] = v.status->state;
      j["step"] = v.status->step;
      j["ram_bytes"] = TierBytes(*v.status, "ram");
      j["ssd_bytes"] = TierBytes(*v.status, "ssd");
      j["update_busy_s"] = v.status->update_busy_s;
      j["update_exposed_s"] = v.status->update_exposed_s;
      j["skipped_steps"] = v.status->skipped_steps;
    } else {
      j["error"] = v.status.status().message();
    }
    a.push_back(j);
  }
  return a;
}

void PrintShards(const std::vector<ShardView>& shards) {
  std::printf("shards (%zu)\n", shards.size());
  std::printf("  %2s  %-21s %-9s %-8s %7s %10s %10s %14s\n", "K", "ADDRESS", "LAYERS", "STATE", "STEP", "RAM", "SSD",
              "UPDATE EXPOSED");
  for (const ShardView& v : shards) {
    const std::string layers =
        std::to_string(v.where.layers.first) + "-" + std::to_string(v.where.layers.end() - 1);
    if (!v.status.ok()) {
      std::printf("  %2d  %-21s %-9s unreachable: %s\n", v.where.index, v.where.address.c_str(), layers.c_str(),
                  v.status.status().message().substr(0, 80).c_str());
      continue;
    }
    std::printf("  %2d  %-21s %-9s %-8s %7lld %10s %10s %12.3f s\n", v.where.index, v.where.address.c_str(),
                layers.c_str(), v.status->state.c_str(), (long long)v.status->step,
                Bytes(TierBytes(*v.status, "ram")).c_str(), Bytes(TierBytes(*v.status, "ssd")).c_str(),
                v.status->update_exposed_s);
  }
}

int CmdStatus(const Globals& g) {
  Target t;
  auto c = Dial(g, &t);
  if (!c.ok()) return EmitError(g, c.status(), t.address, kExitUnreachable);
  auto s = (*c)->GetStatus();
  if (!s.ok()) return EmitRpcError(g, s.status(), t.address);
  const std::vector<ShardView> shards = AskShards(g, *s);
  if (g.json) {
    Json j = StatusJson(*s, t.address);
    j["shard"] = s->shard;
    j["shards"] = s->shards;
    j["first_layer"] = s->first_layer;
    if (!shards.empty()) j["shard_status"] = ShardsJson(shards);
    std::printf("%s\n", j.dump().c_str());
  } else {
    PrintStatus(*s, t.address);
    if (s->shards > 1) {
      std::printf("shard %d of %d (model layers from %lld)%s\n", s->shard, s->shards, (long long)s->first_layer,
                  s->shard == 0 ? "" : ": ask shard 0 for the whole job");
    }
    if (!shards.empty()) PrintShards(shards);
  }
  return 0;
}

struct WatchFlags {
  int64_t steps = 0;      // 0 = until the job finishes
  double timeout_s = 0;   // 0 = none
  double interval_s = 1;
};

bool Finished(const CtlStatus& s) {
  return s.state == "finished" || (s.total_steps > 0 && s.step >= s.total_steps);
}

// " val_loss X val_ppl Y (step N)" once the job has logged a validation loss; "" before.
std::string ValText(const CtlStatus& s) {
  if (s.val_step <= 0) return "";
  char buf[96];
  std::snprintf(buf, sizeof(buf), " val_loss %.4f val_ppl %.3f (step %lld)", s.val_loss, std::exp(s.val_loss),
                (long long)s.val_step);
  return buf;
}

int CmdWatch(const Globals& g, const WatchFlags& w) {
  Target t;
  auto c = Dial(g, &t);
  if (!c.ok()) return EmitError(g, c.status(), t.address, kExitUnreachable);
  const bool tty = !g.json && isatty(STDOUT_FILENO);
  const auto start = Clock::now();
  int64_t first_step = -1, last_printed = -1;
  auto first_step_time = start;
  for (;;) {
    auto s = (*c)->GetStatus();
    if (!s.ok()) {
      if (tty) std::printf("\n");
      return EmitRpcError(g, s.status().WithContext("watch: the daemon went away"), t.address);
    }
    const auto now = Clock::now();
    if (first_step < 0) first_step = s->step, first_step_time = now;
    const int64_t target = w.steps > 0 ? std::min(first_step + w.steps, s->total_steps > 0 ? s->total_steps
                                                                                          : first_step + w.steps)
                                       : s->total_steps;
    // ETA from the steps seen during this watch; before the first, from the last step time.
    const double seen_s = std::chrono::duration<double>(now - first_step_time).count();
    const int64_t done_here = s->step - first_step;
    const double per_step = done_here > 0 ? seen_s / done_here : s->step_time_s;
    const double eta = target > s->step && per_step > 0 ? (target - s->step) * per_step : 0;
    const bool done = Finished(*s) || (w.steps > 0 && s->step >= target);
    if (g.json) {
      if (s->step != last_printed || done) {
        Json j = {{"step", s->step},       {"total_steps", s->total_steps}, {"state", s->state},
                  {"loss", s->last_loss},  {"tokens_per_s", s->tokens_per_s}, {"step_time_s", s->step_time_s},
                  {"eta_s", eta},          {"target_steps", target}, {"done", done},
                  {"update_s", s->update_busy_s}, {"update_lag_s", s->update_exposed_s}};
        if (s->val_step > 0) {
          j["val_loss"] = s->val_loss;
          j["val_ppl"] = std::exp(s->val_loss);
          j["val_step"] = s->val_step;
        }
        std::printf("%s\n", j.dump().c_str());
      }
    } else if (tty) {
      // The bar measures progress to the target: the job's end, or --steps N from here.
      const int width = 30;
      const int64_t from = w.steps > 0 ? first_step : 0;
      const double frac =
          target > from ? std::clamp(double(s->step - from) / double(target - from), 0.0, 1.0) : 1.0;
      const int fill = static_cast<int>(frac * width);
      std::printf("\r[%s%s] %5.1f%% step %lld/%lld loss %.4f%s tok/s %.0f %s ETA %s\x1b[K",
                  std::string(fill, '#').c_str(), std::string(width - fill, '-').c_str(), frac * 100,
                  (long long)s->step, (long long)s->total_steps, s->last_loss, ValText(*s).c_str(), s->tokens_per_s,
                  s->state.c_str(), Duration(eta).c_str());
    } else if (s->step != last_printed || done) {
      std::printf("step %lld/%lld loss %.4f%s tok/s %.0f step_s %.3f update_s %.3f update_lag_s %.3f state %s eta %s\n",
                  (long long)s->step, (long long)s->total_steps, s->last_loss, ValText(*s).c_str(), s->tokens_per_s,
                  s->step_time_s, s->update_busy_s, s->update_exposed_s, s->state.c_str(), Duration(eta).c_str());
    }
    std::fflush(stdout);
    last_printed = s->step;
    if (done) {
      if (tty) std::printf("\ndone: step %lld\n", (long long)s->step);
      return 0;
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (w.timeout_s > 0 && elapsed >= w.timeout_s) {
      if (tty) std::printf("\n");
      char msg[160];
      std::snprintf(msg, sizeof(msg), "watch: timed out after %.1f s at step %lld/%lld", elapsed,
                    (long long)s->step, (long long)target);
      return EmitError(g, Status(StatusCode::kDeadlineExceeded, msg), t.address, kExitTimeout);
    }
    double sleep_s = w.interval_s;
    if (w.timeout_s > 0) sleep_s = std::min(sleep_s, w.timeout_s - elapsed);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.01, sleep_s)));
  }
}

int CmdWritten(const Globals& g, const std::string& what, const std::string& path, const std::string& format = "safetensors",
               const std::string& dtype = "", const std::string& max_shard_size = "", bool merge = false) {
  int64_t max_shard_bytes = 0;
  if (!max_shard_size.empty()) {
    if (format != "hf") {
      return EmitError(g, l2l::InvalidArgument("--max-shard-size applies to --format hf only"), "", 64);
    }
    Result<int64_t> n = ParseShardSize(max_shard_size);
    if (!n.ok()) return EmitError(g, n.status(), "", 64);
    max_shard_bytes = *n;
  }
  Target t;
  auto c = Dial(g, &t);
  if (!c.ok()) return EmitError(g, c.status(), t.address, kExitUnreachable);
  // Paths go to the daemon verbatim: it writes on its own host, resolves a relative path
  // under its state dir and confines absolute ones to it unless its config has
  // allow_absolute_paths (EpsCore::ResolveUserPath).
  auto r = what == "checkpoint" ? (*c)->Checkpoint(path) : (*c)->Export(path, format, dtype, max_shard_bytes, merge);
  if (!r.ok()) return EmitRpcError(g, r.status(), t.address);
  if (g.json) {
    Json j = {{"ok", true}, {"address", t.address}, {"path", r->path}, {"bytes", r->bytes}};
    if (what == "checkpoint") j["step"] = r->step;
    std::printf("%s\n", j.dump().c_str());
  } else if (what == "checkpoint") {
    std::printf("checkpoint of step %lld written to %s (%s)\n", (long long)r->step,
                r->path.empty() ? "the daemon's checkpoint dir" : r->path.c_str(), Bytes(r->bytes).c_str());
  } else {
    const char* what_written = format == "hf"          ? "Hugging Face model directory"
                               : format == "gguf"      ? "GGUF"
                               : format == "peft"      ? "PEFT LoRA adapter directory"
                               : format == "gguf-lora" ? "GGUF LoRA adapter"
                                                       : "safetensors, Hugging Face tensor names";
    std::printf("exported %s (%s, %s%s)\n", r->path.c_str(), Bytes(r->bytes).c_str(), what_written,
                merge ? ", LoRA merged" : "");
  }
  return 0;
}

// The pause and resume commands (the subcommand picks one).
enum class Publishing { kPause, kResume };

int CmdPublishing(const Globals& g, Publishing what) {
  const bool pause = what == Publishing::kPause;
  Target t;
  auto c = Dial(g, &t);
  if (!c.ok()) return EmitError(g, c.status(), t.address, kExitUnreachable);
  Status s = pause ? (*c)->Pause() : (*c)->Resume();
  if (!s.ok()) return EmitRpcError(g, s, t.address);
  const char* command = pause ? "pause" : "resume";
  if (g.json) std::printf("%s\n", Json({{"ok", true}, {"address", t.address}, {"command", command}}).dump().c_str());
  else std::printf("%s: %s\n", t.address.c_str(), pause ? "paused" : "resumed");
  return 0;
}

struct StopFlags {
  bool abort_step = false, skip_checkpoint = false, no_wait = false;
  double wait_s = 120;
};

int CmdStop(const Globals& g, const StopFlags& f) {
  Target t;
  auto c = Dial(g, &t);
  if (!c.ok()) return EmitError(g, c.status(), t.address, kExitUnreachable);
  if (Status s = (*c)->Shutdown(f.abort_step, f.skip_checkpoint); !s.ok()) return EmitRpcError(g, s, t.address);
  bool gone = false;
  if (!f.no_wait) {
    // The daemon exits after the final checkpoint; wait until it stops answering.
    const auto deadline = Clock::now() + std::chrono::duration<double>(f.wait_s);
    while (Clock::now() < deadline) {
      if (!(*c)->Health().ok()) {
        gone = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!gone) {
      return EmitError(g, l2l::Aborted("stop: l2l-eps at " + t.address + " still answers after " +
                                       std::to_string(static_cast<int>(f.wait_s)) + " s"),
                       t.address, kExitRefused);
    }
  }
  if (g.json) {
    std::printf("%s\n", Json({{"ok", true}, {"address", t.address}, {"command", "stop"}, {"exited", gone}}).dump().c_str());
  } else {
    std::printf("l2l-eps at %s %s\n", t.address.c_str(), gone ? "stopped" : "asked to stop");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2lctl: control a running l2l-eps daemon"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags may follow the command: l2lctl status --json
  Globals g;
  app.add_option("--eps", g.eps, "daemon address HOST:PORT (default: $L2L_EPS, else eps.port in the state dir)");
  app.add_option("--state-dir", g.state_dir,
                 "daemon state dir holding eps.port (default: $L2L_STATE_DIR, /var/lib/l2l, /tmp/l2l-eps)");
  app.add_flag("--json", g.json, "machine-readable JSON on stdout");
  app.add_option("--connect-timeout-ms", g.connect_timeout_ms, "give up reaching the daemon after this")
      ->check(CLI::Range(1, 600000));
  app.add_option("--token-file", g.token_file,
                 "file (mode 0600) with the daemon's shared token (default: $L2L_TOKEN_FILE)");
  app.add_option("--tls-ca", g.tls_ca, "PEM CA certificate: connect with TLS and verify the daemon against it");
  app.add_option("--tls-server-name", g.tls_server_name,
                 "with --tls-ca: the name the daemon's certificate must hold (default: the host dialled)");
  app.add_option("--tls-cert", g.tls_cert,
                 "with --tls-ca and --tls-key: this client's PEM certificate, for a daemon that requires client "
                 "certificates (l2l-eps --tls-client-ca)");
  app.add_option("--tls-key", g.tls_key, "the PEM private key of --tls-cert (mode 0600: not readable by others)");
  app.add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);

  auto* status = app.add_subcommand("status", "step, loss, tokens/s, layer versions, workers, memory");
  WatchFlags wf;
  auto* watch = app.add_subcommand("watch", "live progress until the job finishes");
  watch->add_option("--steps", wf.steps, "exit after N more steps")->check(CLI::PositiveNumber);
  watch->add_option("--timeout", wf.timeout_s, "exit with status 3 after S seconds")->check(CLI::NonNegativeNumber);
  watch->add_option("--interval", wf.interval_s, "seconds between polls")->check(CLI::Range(0.05, 3600.0));
  std::string ckpt_dir;
  auto* ckpt = app.add_subcommand("checkpoint", "write a durable checkpoint now");
  ckpt->add_option("--dir", ckpt_dir,
                   "directory on the daemon's host, relative to its state dir (default: <checkpoint root>/step-N)");
  std::string format = "safetensors", export_path, export_dtype, export_shard;
  bool export_merge = false;
  auto* exp = app.add_subcommand("export", "write the weights: safetensors file, Hugging Face dir or GGUF file");
  exp->add_option("--format", format,
                  "safetensors (one file, l2l metadata), hf (a from_pretrained directory), gguf (Llama family); "
                  "a LoRA job: peft (a PEFT adapter directory) or gguf-lora (llama.cpp's GGUF LoRA file)")
      ->check(CLI::IsMember({"safetensors", "hf", "gguf", "peft", "gguf-lora"}));
  exp->add_flag("--merge", export_merge,
                "a LoRA job: write the merged model (W + (alpha/r) B A) as safetensors, hf or gguf; without it a "
                "LoRA job exports only --format peft or gguf-lora");
  exp->add_option("--dtype,--type", export_dtype,
                  "f32 (default) or bf16; gguf also f16, q8_0 and q4_k_m (llama.cpp's Q4_K_M mix: Q4_K, Q6_K for "
                  "output and some attn_v/ffn_down, docs/finetune.md)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0", "q4_k_m"}));
  exp->add_option("--max-shard-size", export_shard,
                  "hf: the largest safetensors shard, as transformers' max_shard_size (default 5GB; bytes, or "
                  "KB/MB/GB = 1000^n, KiB/MiB/GiB = 1024^n); above it the weights are sharded with "
                  "model.safetensors.index.json");
  exp->add_option("path", export_path,
                  "output file (directory for hf) on the daemon's host, relative to its state dir")->required();
  auto* pause = app.add_subcommand("pause", "stop publishing new layer versions (workers wait)");
  auto* resume = app.add_subcommand("resume", "resume after pause");
  StopFlags sf;
  auto* stop = app.add_subcommand("stop", "final checkpoint, then the daemon exits");
  stop->add_flag("--abort-step", sf.abort_step, "do not finish the step in flight");
  stop->add_flag("--skip-checkpoint", sf.skip_checkpoint, "exit without the final checkpoint");
  stop->add_flag("--no-wait", sf.no_wait, "return once the daemon accepted the request");
  stop->add_option("--wait", sf.wait_s, "seconds to wait for the daemon to exit")->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 64;
  }
  if (Status s = LoadSecrets(&g); !s.ok()) return EmitError(g, s, "", 64);
  if (status->parsed()) return CmdStatus(g);
  if (watch->parsed()) return CmdWatch(g, wf);
  if (ckpt->parsed()) return CmdWritten(g, "checkpoint", ckpt_dir);
  if (exp->parsed()) return CmdWritten(g, "export", export_path, format, export_dtype, export_shard, export_merge);
  if (pause->parsed()) return CmdPublishing(g, Publishing::kPause);
  if (resume->parsed()) return CmdPublishing(g, Publishing::kResume);
  if (stop->parsed()) return CmdStop(g, sf);
  return 64;
}

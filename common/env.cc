// The environment-variable table and its snapshot. See env.h.
#include "common/env.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace l2l {
namespace {

constexpr size_t kNumVars = static_cast<size_t>(EnvVar::kCount);

// One row per variable, in EnvVar order (checked below). Keep docs/operations.md
// "Environment variables" in step: tests/common/env_test.cc prints the row it misses.
constexpr std::array<EnvVarInfo, kNumVars> kTable = {{
    {EnvVar::kConfigDir, "L2L_CONFIG_DIR", EnvType::kString, "DIR", "unset: beside the job file",
     "job configs (l2l-eps, l2l-worker, tools)",
     "a configs directory searched first for model.preset names (DIR/models/NAME.yaml)"},
    {EnvVar::kTokenFile, "L2L_TOKEN_FILE", EnvType::kString, "FILE", "unset: no token",
     "l2lctl, l2l-worker", "the daemon's shared token file (mode 0600) when --token-file is not given"},
    {EnvVar::kEps, "L2L_EPS", EnvType::kString, "HOST:PORT", "unset: eps.port in a state dir", "l2lctl",
     "the daemon's address when neither --eps nor --state-dir is given"},
    {EnvVar::kStateDir, "L2L_STATE_DIR", EnvType::kString, "DIR", "unset: /var/lib/l2l, /tmp/l2l-eps",
     "l2lctl", "a daemon state dir whose eps.port is tried before /var/lib/l2l and /tmp/l2l-eps"},
    {EnvVar::kMaxFileBytes, "L2L_MAX_FILE_BYTES", EnvType::kInt, "BYTES", "1073741824",
     "every program (common/file_util.h)",
     "the largest file read whole (configs, YAML, tokenizer.json) and the most memory one GGUF file's metadata arrays take"},
    {EnvVar::kCpuIsa, "L2L_CPU_ISA", EnvType::kEnum, "base|avx2|avx512", "unset: the best the CPU has",
     "CPU backend", "caps the CPU kernels' vector ISA (any value also turns bf16 GEMMs off); for tests"},
    {EnvVar::kCpuGemm, "L2L_CPU_GEMM", EnvType::kEnum, "fp32|bf16", "unset: --compute (fp32)", "CPU backend",
     "the CPU backend's matrix-product precision; wins over --compute"},
    {EnvVar::kCpuPin, "L2L_CPU_PIN", EnvType::kBool, "0|1", "0", "CPU backend",
     "pin the CPU backend's TBB workers one per core of the process's affinity mask"},
    {EnvVar::kCudaGemm, "L2L_CUDA_GEMM", EnvType::kEnum, "fp32|tf32|bf16", "unset: the backend's options (fp32)",
     "CUDA backend", "the CUDA backend's GEMM precision; wins over the backend's options"},
    {EnvVar::kCudaAttention, "L2L_CUDA_ATTENTION", EnvType::kEnum, "flash|gemm", "unset: the backend's options (flash)",
     "CUDA backend", "the CUDA backend's attention: the fused kernel (head sizes 64, 80, 96, 128; others use gemm) or cuBLASLt GEMMs around a softmax storing (B,NH,T,T); wins over the backend's options"},
    {EnvVar::kCudaBf16Reuse, "L2L_CUDA_BF16_REUSE", EnvType::kBool, "0|1", "1", "CUDA backend",
     "bf16 GEMM mode: a GEMM reads the bf16 copy of an operand that its producer wrote or the GEMM before cast "
     "(0: cast every operand not in a layer's bf16 copy; the same bits, for timing both); set, it wins over the "
     "backend's options"},
    {EnvVar::kHeadChunkMb, "L2L_HEAD_CHUNK_MB", EnvType::kInt, "MIB", "256", "CPU and CUDA backends (LM head)",
     "the LM head's logits are computed in row chunks of at most this many MiB (fp32), never B x T x V"},
    {EnvVar::kFaultAt, "L2L_FAULT_AT", EnvType::kString, "SITE:N[,SITE:N...]", "unset: none",
     "l2l-eps, l2l-worker", "test only: SIGKILL this process at the N-th visit of a fault site (common/fault_point.h)"},
    {EnvVar::kDelayAt, "L2L_DELAY_AT", EnvType::kString, "SITE:MS[,SITE:MS...]", "unset: none",
     "l2l-eps, l2l-worker", "test only: sleep MS milliseconds at every visit of a fault site"},
    {EnvVar::kStopAt, "L2L_STOP_AT", EnvType::kString, "SITE:N[,SITE:N...]", "unset: none", "l2l-eps, l2l-worker",
     "test only: SIGSTOP this process at the N-th visit of a fault site"},
    {EnvVar::kSpillFaults, "L2L_SPILL_FAULTS", EnvType::kString, "OP:NTH:KIND[,...]", "unset: none", "l2l-eps",
     "test only: SSD-tier I/O faults to inject (eps_server/spill_io.h FaultPlan)"},
    {EnvVar::kTestUpdateFault, "L2L_TEST_UPDATE_FAULT", EnvType::kString, "hang[:N]|bad-done[:N]",
     "unset: none", "l2l-worker",
     "test only: the device-update thread hangs or answers wrongly after N updates"},
    {EnvVar::kTestNanGradient, "L2L_TEST_NAN_GRADIENT", EnvType::kString, "LAYER:STEP", "unset: none", "l2l-worker",
     "test only: the gradient this worker pushes for model layer LAYER at step STEP gets a NaN (the non-finite guard)"},
    {EnvVar::kCpuBf16Fallback, "L2L_CPU_BF16_FALLBACK", EnvType::kBool, "0|1", "0", "CPU backend",
     "test only: bf16 GEMMs on a CPU without AVX512_BF16 run on oneDNN's AVX-512 emulation (slow) instead of "
     "being refused"},
}};

constexpr bool TableInOrder() {
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<size_t>(kTable[i].var) != i) return false;
  }
  return true;
}
static_assert(TableInOrder(), "kTable rows must be in EnvVar order");

struct Snapshot {
  std::mutex mu;
  bool taken = false;
  std::array<std::optional<std::string>, kNumVars> values;
};

Snapshot& TheSnapshot() {
  static Snapshot* s = new Snapshot();  // never destroyed: read during exit too
  return *s;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// "a|b|c" -> "a, b, c".
std::string ChoiceList(const char* values) {
  std::string s = values;
  std::string out;
  for (char c : s) out += c == '|' ? std::string(", ") : std::string(1, c);
  return out;
}

}  // namespace

const char* ToString(EnvType t) {
  switch (t) {
    case EnvType::kString: return "string";
    case EnvType::kBool: return "bool";
    case EnvType::kInt: return "int";
    case EnvType::kEnum: return "enum";
  }
  return "?";
}

std::span<const EnvVarInfo> EnvRegistry() { return kTable; }

const EnvVarInfo& EnvInfo(EnvVar v) {
  L2L_CHECK(v != EnvVar::kCount) << "EnvVar::kCount is not a variable";
  return kTable[static_cast<size_t>(v)];
}

std::optional<std::string> EnvText(EnvVar v) {
  const size_t i = static_cast<size_t>(EnvInfo(v).var);
  Snapshot& s = TheSnapshot();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.taken) {
    for (const EnvVarInfo& info : kTable) {
      const char* text = std::getenv(info.name);
      s.values[static_cast<size_t>(info.var)] =
          text != nullptr && *text != '\0' ? std::optional<std::string>(text) : std::nullopt;
    }
    s.taken = true;
  }
  return s.values[i];
}

void ResetEnvForTesting() {
  Snapshot& s = TheSnapshot();
  std::lock_guard<std::mutex> lock(s.mu);
  s.taken = false;
}

std::string EnvString(EnvVar v) {
  L2L_CHECK(EnvInfo(v).type == EnvType::kString) << EnvInfo(v).name << " is not a string variable";
  return EnvText(v).value_or(std::string());
}

Status EnvError(const EnvVarInfo& info, const std::string& text, const std::string& expected) {
  return InvalidArgument(std::string("environment ") + info.name + "=" + text + ": expected " + expected);
}

Result<bool> ParseEnvBool(const EnvVarInfo& info, const std::string& text) {
  const std::string t = Lower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return EnvError(info, text, "1 or 0 (true/false, yes/no, on/off)");
}

Result<int64_t> ParseEnvInt(const EnvVarInfo& info, const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) return EnvError(info, text, "a whole number");
  return v;
}

Status CheckEnvChoice(const EnvVarInfo& info, const std::string& text) {
  std::string_view rest = info.values;
  while (true) {
    const size_t bar = rest.find('|');
    if (rest.substr(0, bar) == text) return Status::Ok();
    if (bar == std::string_view::npos) break;
    rest.remove_prefix(bar + 1);
  }
  return EnvError(info, text, "one of " + ChoiceList(info.values));
}

Result<bool> EnvBool(EnvVar v) {
  const EnvVarInfo& info = EnvInfo(v);
  L2L_CHECK(info.type == EnvType::kBool) << info.name << " is not a bool variable";
  return ParseEnvBool(info, EnvText(v).value_or(info.default_value));
}

Result<int64_t> EnvInt(EnvVar v) {
  const EnvVarInfo& info = EnvInfo(v);
  L2L_CHECK(info.type == EnvType::kInt) << info.name << " is not an int variable";
  return ParseEnvInt(info, EnvText(v).value_or(info.default_value));
}

std::string EnvHelpText() {
  std::string out =
      "Environment variables (set to \"\" = unset; read once at first use):\n";
  for (const EnvVarInfo& info : kTable) {
    out += "  " + std::string(info.name) + "=" + info.values + "\n";
    out += "      " + std::string(info.doc) + "\n";
    out += "      default: " + std::string(info.default_value) + "; read by: " + info.read_by;
    if (std::optional<std::string> now = EnvText(info.var)) out += "; set here: " + *now;
    out += "\n";
  }
  out +=
      "The CUDA emulator (L2L_CUDA=EMU builds) reads its own L2L_CUDA_EMU_* and "
      "L2L_NCCL_EMU_TIMEOUT_S: see docs/operations.md.\n";
  return out;
}

void PrintEnvHelpAndExit() {
  std::fputs(EnvHelpText().c_str(), stdout);
  std::fflush(stdout);
  std::exit(0);
}

std::string EnvMarkdownRow(const EnvVarInfo& info) {
  std::string values;
  for (const char* p = info.values; *p != '\0'; ++p) values += *p == '|' ? std::string("\\|") : std::string(1, *p);
  return "| `" + std::string(info.name) + "` | `" + values + "` | " + info.default_value + " | " + info.read_by +
         " | " + info.doc + " |";
}

}  // namespace l2l

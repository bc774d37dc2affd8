// Environment variables: every L2L_* variable our programs read, described once in one
// table (name, type, accepted values, default, who reads it, one doc line) and read only
// through the typed accessors below. `--help-env` on l2l-eps, l2l-worker, l2lctl and the
// tools prints the table (EnvHelpText); docs/operations.md "Environment variables" holds
// it as Markdown (EnvMarkdownRow; tests/common/env_test.cc checks every row is there).
//
// Reading: the first accessor call takes one snapshot of every variable in the table;
// later calls answer from it, so each variable is read once per process (a child process
// sees the environment its parent set before starting it). A variable set to "" counts as
// unset. The accessor of the variable's type checks the text; a bad value is
// INVALID_ARGUMENT naming the variable, the value and what is accepted:
//   "environment L2L_CPU_GEMM=fp16: expected one of fp32, bf16"
// In-process tests that change a variable call ResetEnvForTesting() (tests/testing/
// scoped_env.h does, on set and on restore).
//
// The CUDA emulator's switches (L2L_CUDA_EMU_*, L2L_NCCL_EMU_TIMEOUT_S) belong to
// cuda_emu/, a separate component that does not link common: they are listed in
// docs/operations.md, not here.
//
// Thread-safety: accessors may be called from any thread (the snapshot is taken under a
// mutex); ResetEnvForTesting must not run concurrently with them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace l2l {

// One value per variable in the table (the order of the table).
enum class EnvVar {
  kConfigDir,        // L2L_CONFIG_DIR
  kTokenFile,        // L2L_TOKEN_FILE
  kEps,              // L2L_EPS
  kStateDir,         // L2L_STATE_DIR
  kMaxFileBytes,     // L2L_MAX_FILE_BYTES
  kCpuIsa,           // L2L_CPU_ISA
  kCpuGemm,          // L2L_CPU_GEMM
  kCpuPin,           // L2L_CPU_PIN
  kCudaGemm,         // L2L_CUDA_GEMM
  kCudaAttention,    // L2L_CUDA_ATTENTION
  kCudaBf16Reuse,    // L2L_CUDA_BF16_REUSE
  kHeadChunkMb,      // L2L_HEAD_CHUNK_MB
  kFaultAt,          // L2L_FAULT_AT
  kDelayAt,          // L2L_DELAY_AT
  kStopAt,           // L2L_STOP_AT
  kSpillFaults,      // L2L_SPILL_FAULTS
  kTestUpdateFault,  // L2L_TEST_UPDATE_FAULT
  kTestNanGradient,  // L2L_TEST_NAN_GRADIENT
  kCpuBf16Fallback,  // L2L_CPU_BF16_FALLBACK
  kCount,            // not a variable
};

// How a variable's text is read. kString: as is. kBool: 1/0, true/false, yes/no, on/off
// (any case). kInt: a whole decimal number. kEnum: one of the names in `values`, then the
// enum's own Parse function (common/modes.h style).
enum class EnvType { kString, kBool, kInt, kEnum };
const char* ToString(EnvType t);

struct EnvVarInfo {
  EnvVar var;
  const char* name;           // "L2L_CPU_GEMM"
  EnvType type;
  const char* values;         // kEnum: the accepted names, '|'-separated ("fp32|bf16");
                              // else the syntax shown to users ("HOST:PORT")
  const char* default_value;  // kBool/kInt: the value when unset, as text ("0"); else
                              // what unset means, in words ("unset: --compute")
  const char* read_by;        // the programs or parts that read it
  const char* doc;            // one line
};

// The whole table, in EnvVar order.
std::span<const EnvVarInfo> EnvRegistry();
const EnvVarInfo& EnvInfo(EnvVar v);

// The variable's text; nullopt when unset or "". Any type.
std::optional<std::string> EnvText(EnvVar v);
// A kString variable's text, "" when unset.
std::string EnvString(EnvVar v);
// A kBool / kInt variable; the table's default when unset.
Result<bool> EnvBool(EnvVar v);
Result<int64_t> EnvInt(EnvVar v);
// A kEnum variable parsed by `parse` (after the table's names are checked); nullopt when
// unset (the caller's own default applies: an option, a flag, the best the CPU has).
template <typename E>
Result<std::optional<E>> EnvEnum(EnvVar v, Result<E> (*parse)(std::string_view));

// The checks behind the accessors, on given text (public for tests).
Result<bool> ParseEnvBool(const EnvVarInfo& info, const std::string& text);
Result<int64_t> ParseEnvInt(const EnvVarInfo& info, const std::string& text);
// kEnum: OK when `text` is one of info.values.
Status CheckEnvChoice(const EnvVarInfo& info, const std::string& text);
// INVALID_ARGUMENT "environment <NAME>=<text>: expected <expected>".
Status EnvError(const EnvVarInfo& info, const std::string& text, const std::string& expected);

// What `--help-env` prints: every variable with its values, default, reader and doc line,
// and its value in this process's environment when set.
std::string EnvHelpText();
// `--help-env`: prints EnvHelpText() on stdout and exits 0. Each program's flag parser
// registers it with kHelpEnvDoc, e.g. with CLI11:
//   app.add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);
[[noreturn]] void PrintEnvHelpAndExit();
inline constexpr const char* kHelpEnvDoc = "list the L2L_* environment variables (values, default, doc) and exit";
// One row of docs/operations.md's table:
// "| `L2L_CPU_GEMM` | `fp32\|bf16` | unset: ... | CPU backend | doc |".
std::string EnvMarkdownRow(const EnvVarInfo& info);

// Forgets the snapshot: the next accessor call reads the environment again. Tests only.
void ResetEnvForTesting();

// ---- implementation --------------------------------------------------------------------

template <typename E>
Result<std::optional<E>> EnvEnum(EnvVar v, Result<E> (*parse)(std::string_view)) {
  const EnvVarInfo& info = EnvInfo(v);
  L2L_CHECK(info.type == EnvType::kEnum) << info.name << " is not an enum variable";
  const std::optional<std::string> text = EnvText(v);
  if (!text) return std::optional<E>();
  L2L_RETURN_IF_ERROR(CheckEnvChoice(info, *text));
  Result<E> e = parse(*text);
  if (!e.ok()) return e.status().WithContext(std::string("environment ") + info.name);
  return std::optional<E>(*e);
}

}  // namespace l2l

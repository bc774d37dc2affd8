// The Export rpc's choice. See eps_server/export_choice.h.
#include "eps_server/export_choice.h"

#include <utility>

#include "common/name_table.h"

namespace l2l {
namespace {

constexpr std::pair<ExportFormat, const char*> kExportFormats[] = {{ExportFormat::kSafetensors, "safetensors"},
                                                                   {ExportFormat::kHf, "hf"},
                                                                   {ExportFormat::kGguf, "gguf"},
                                                                   {ExportFormat::kPeft, "peft"},
                                                                   {ExportFormat::kGgufLora, "gguf-lora"}};

}  // namespace

const char* ToString(ExportFormat f) { return NameOf(kExportFormats, f); }

Result<ExportChoice> ParseExportChoice(const ExportRequestFields& req, bool lora_job) {
  ExportChoice c;
  if (!req.format.empty()) {  // "" is safetensors
    const Result<ExportFormat> format = ParseName(kExportFormats, req.format);
    if (!format.ok()) {
      return InvalidArgument("format '" + req.format + "' must be safetensors, hf, gguf, peft or gguf-lora");
    }
    c.format = *format;
  }
  const std::string f = ToString(c.format);
  const bool adapter = c.format == ExportFormat::kPeft || c.format == ExportFormat::kGgufLora;
  if (adapter && req.merge) {
    return InvalidArgument("--merge applies to --format safetensors, hf or gguf (the merged model); --format " + f +
                           " writes the LoRA adapter alone");
  }
  if (adapter && !lora_job) {
    return FailedPrecondition("--format " + f +
                              " writes a LoRA adapter, and this job has no lora: section; export its weights with "
                              "--format safetensors, hf or gguf");
  }
  if (!adapter && req.merge && !lora_job) {
    return FailedPrecondition("--merge merges a LoRA job's adapters into its base, and this job has no lora: section; "
                              "export without --merge");
  }
  if (!adapter && !req.merge && lora_job) {
    return FailedPrecondition("this is a LoRA job: --format " + f +
                              " writes a whole model, so add --merge (the base with scale * B A added to each "
                              "targeted weight), or export the adapter alone with --format peft (a PEFT directory) "
                              "or --format gguf-lora (llama.cpp)");
  }
  c.merge = req.merge;
  if (req.max_shard_bytes < 0 || (req.max_shard_bytes != 0 && c.format != ExportFormat::kHf)) {
    return InvalidArgument("max_shard_bytes=" + std::to_string(req.max_shard_bytes) +
                           (req.max_shard_bytes < 0 ? " must be >= 0 (0 = 5 GB)"
                                                    : " applies to format hf only (sharded safetensors)"));
  }
  c.max_shard_bytes = req.max_shard_bytes;
  const std::string d = req.dtype.empty() ? "f32" : req.dtype;
  if (c.format == ExportFormat::kPeft) {
    if (d != "f32") return InvalidArgument("dtype '" + d + "': a PEFT adapter is written in f32 only");
    return c;
  }
  if (c.format == ExportFormat::kGgufLora) {
    if (d == "f32") c.type = formats::GgmlType::kF32;
    else if (d == "f16") c.type = formats::GgmlType::kF16;
    else if (d == "bf16") c.type = formats::GgmlType::kBF16;
    else return InvalidArgument("dtype '" + d + "' must be f32, f16 or bf16 for a GGUF LoRA adapter");
    return c;
  }
  const bool gguf = c.format == ExportFormat::kGguf;
  if (gguf && d == "q8_0") {
    c.type = formats::GgmlType::kQ8_0;
    return c;
  }
  if (gguf && d == "f16") {
    c.type = formats::GgmlType::kF16;
    return c;
  }
  if (gguf && d == "q4_k_m") {
    c.q4_k_m = true;
    return c;
  }
  const Result<DType> dt = ParseDType(d);
  if (!dt.ok() || (*dt != DType::kF32 && *dt != DType::kBF16)) {
    return InvalidArgument("dtype '" + d + "' must be f32 or bf16" + (gguf ? ", f16, q8_0 or q4_k_m" : ""));
  }
  c.type = *dt == DType::kBF16 ? formats::GgmlType::kBF16 : formats::GgmlType::kF32;
  return c;
}

}  // namespace l2l

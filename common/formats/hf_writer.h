// Hugging Face model directory writer: the weights as model.safetensors, or, when their
// total size exceeds HfWriteOptions::max_shard_bytes, as model-0000i-of-0000N.safetensors
// shards plus model.safetensors.index.json ({"metadata": {"total_size": bytes},
// "weight_map": {tensor: shard}}), as transformers' save_pretrained lays them out.
// config.json comes from WriteHfConfig (common/formats/model_config.h).
//
// Tensors are written in the given order, each stored in its TensorToWrite::dtype (F32,
// BF16 or F16; fp32 input rounded to nearest even), packed greedily into shards: a shard
// closes when the next tensor would take it past max_shard_bytes (a tensor larger than
// the limit gets a shard of its own). Every file goes through an AtomicFileWriter; after
// all are written, weight files of the other layout left in the directory by an earlier
// export (model.safetensors, model.safetensors.index.json, model-*-of-*.safetensors not
// written now) are removed so transformers cannot load a stale mix.
//
// Thread-safety: none; one writer per directory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/formats/safetensors.h"
#include "common/status.h"

namespace l2l::formats {

struct HfWriteOptions {
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default max_shard_size "5GB"
  std::map<std::string, std::string> metadata = {{"format", "pt"}};  // each file's __metadata__
};

// Creates `dir` if needed. Returns the weight files written (names relative to dir).
Result<std::vector<std::string>> WriteHfSafetensors(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                                                    const HfWriteOptions& options = {});

}  // namespace l2l::formats

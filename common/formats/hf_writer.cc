// Hugging Face safetensors writer, sharded or not. See common/formats/hf_writer.h.
#include "common/formats/hf_writer.h"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace l2l::formats {

Result<std::vector<std::string>> WriteHfSafetensors(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                                                    const HfWriteOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status(StatusCode::kIoError, "create directory " + dir + ": " + ec.message());
  // Greedy packing in order.
  std::vector<std::vector<TensorToWrite>> shards(1);
  uint64_t total = 0, in_shard = 0;
  for (const TensorToWrite& t : tensors) {
    uint64_t nb = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) return InvalidArgument(dir + ": tensor '" + t.name + "' has a negative dimension");
      nb *= static_cast<uint64_t>(d);
    }
    if (!shards.back().empty() && in_shard + nb > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += nb;
    total += nb;
  }
  std::vector<std::string> names;
  if (total <= o.max_shard_bytes) {
    names.push_back("model.safetensors");
    std::vector<TensorToWrite> all(tensors.begin(), tensors.end());
    shards.assign(1, std::move(all));
  } else {
    for (size_t i = 0; i < shards.size(); ++i) {
      char b[64];
      std::snprintf(b, sizeof(b), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      names.push_back(b);
    }
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    L2L_RETURN_IF_ERROR(WriteSafeTensors(dir + "/" + names[i], shards[i], o.metadata));
    for (const TensorToWrite& t : shards[i]) weight_map[t.name] = names[i];
  }
  const std::string index = "model.safetensors.index.json";
  if (names.size() > 1) {
    nlohmann::json j = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::string text;
    try {
      text = j.dump(2) + "\n";
    } catch (const std::exception& e) {
      return InvalidArgument(dir + "/" + index + ": cannot encode: " + e.what());
    }
    L2L_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + index, text.data(), text.size()));
  }
  // Stale weight files of an earlier export.
  const std::set<std::string> keep(names.begin(), names.end());
  const std::regex shard_re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    const bool ours = f == "model.safetensors" || std::regex_match(f, shard_re) || (f == index && names.size() == 1);
    if (ours && !keep.count(f) && !(f == index && names.size() > 1)) {
      std::filesystem::remove(e.path(), ec);
      if (ec) return Status(StatusCode::kIoError, "remove stale weight file " + e.path().string() + ": " + ec.message());
    }
  }
  if (names.size() > 1) names.push_back(index);
  return names;
}

}  // namespace l2l::formats

// Test helper for tests/common/check_formats.py (not a product binary): lets an
// independent Python reader/writer (json + numpy + torch) check our safetensors files.
//
//   l2l_format_tool write-model DIR
//       DIR/model_{f32,bf16,f16}.safetensors: the same deterministic model (tiny shapes,
//       untied for f16), DIR/layers_{tied,untied}.f32: its fp32 layer buffers
//       concatenated, DIR/spec_{tied,untied}.json.
//   l2l_format_tool read-model IN.safetensors SPEC.json OUT.f32
//       LoadModel(IN, spec) and the loaded layers concatenated as raw fp32.
// Exit status 0 on success, 1 with the error on stderr.
#include <cstdio>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/formats/model_io.h"

namespace l2l {
namespace {

std::vector<std::vector<float>> Init(const ModelSpec& spec) {
  std::vector<std::vector<float>> layers;
  for (const LayerLayout& l : BuildLayout(spec)) {
    std::vector<float> buf(l.numel);
    InitLayerParams(spec, l, 77, buf.data());
    for (size_t i = 0; i < buf.size(); ++i) buf[i] += 1e-3f * static_cast<float>(i % 101);  // non-trivial biases
    layers.push_back(std::move(buf));
  }
  return layers;
}

Status WriteFloats(const std::string& path, const std::vector<std::vector<float>>& layers) {
  std::vector<float> all;
  for (const auto& l : layers) all.insert(all.end(), l.begin(), l.end());
  return WriteFileAtomic(path, all.data(), all.size() * sizeof(float));
}

Status WriteModels(const std::string& dir) {
  ModelSpec tied{256, 32, 32, 2, 2, 128, true};
  ModelSpec untied = tied;
  untied.tied_embeddings = false;
  const auto lt = Init(tied), lu = Init(untied);
  L2L_RETURN_IF_ERROR(SaveModel(dir + "/model_f32.safetensors", tied, lt, DType::kF32));
  L2L_RETURN_IF_ERROR(SaveModel(dir + "/model_bf16.safetensors", tied, lt, DType::kBF16));
  L2L_RETURN_IF_ERROR(SaveModel(dir + "/model_f16.safetensors", untied, lu, DType::kF16));
  L2L_RETURN_IF_ERROR(WriteFloats(dir + "/layers_tied.f32", lt));
  L2L_RETURN_IF_ERROR(WriteFloats(dir + "/layers_untied.f32", lu));
  const std::string st = ModelSpecToJson(tied), su = ModelSpecToJson(untied);
  L2L_RETURN_IF_ERROR(WriteFileAtomic(dir + "/spec_tied.json", st.data(), st.size()));
  return WriteFileAtomic(dir + "/spec_untied.json", su.data(), su.size());
}

Status ReadModel(const std::string& in, const std::string& spec_path, const std::string& out) {
  L2L_ASSIGN_OR_RETURN(std::string spec_text, ReadFileToString(spec_path));
  L2L_ASSIGN_OR_RETURN(ModelSpec spec, ModelSpecFromJson(spec_text));
  L2L_ASSIGN_OR_RETURN(LoadedModel m, LoadModel(in, spec));
  return WriteFloats(out, m.layers);
}

}  // namespace
}  // namespace l2l

int main(int argc, char** argv) {
  l2l::Status st = l2l::InvalidArgument("usage: write-model DIR | read-model IN SPEC OUT");
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "write-model" && argc == 3) st = l2l::WriteModels(argv[2]);
  if (cmd == "read-model" && argc == 5) st = l2l::ReadModel(argv[2], argv[3], argv[4]);
  if (!st.ok()) {
    std::fprintf(stderr, "l2l_format_tool: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

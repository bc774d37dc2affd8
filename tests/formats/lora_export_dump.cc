// l2l_lora_export_dump: writes what a LoRA job's export writes, from a real Hugging Face
// model directory, for tests/formats/lora_export_oracle.py:
//   l2l_lora_export_dump --model HF_DIR --out DIR --r R --alpha A --target T[,T...]
//                        [--modules-to-save M[,M...]] [--seed S]
// The LoRA layers (common/lora.h BuildLoraLayout) hold the model's weights, A as
// InitLoraAdapters draws it, B ~ N(0, 0.3) (non-zero: a trained adapter) and every
// modules_to_save tensor moved by N(0, 0.3) (trained in full). Then, through
// common/formats/lora_export.h only (the daemon's export code path):
//   DIR/peft/             AdapterFromLayers + WritePeftAdapter
//   DIR/merged/           ExportHf of MergedLayerSource (a Hugging Face dir)
//   DIR/merged.safetensors SaveModelStreamed of MergedLayerSource
//   DIR/adapter.gguf      WriteGgufLora (llama family, no modules_to_save); with
//                         modules_to_save DIR/gguf_refused.txt holds its error instead
// Prints one line; errors: one line on stderr, exit 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/formats/gguf_lora.h"
#include "common/formats/lora_export.h"
#include "common/formats/model_io.h"
#include "common/formats/peft_adapter.h"
#include "common/lora.h"
#include "common/pretrained/pretrained.h"

namespace {

using l2l::Result;
using l2l::Status;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

Status Run(const std::string& model, const std::string& out, const l2l::LoraConfig& lora, uint64_t seed) {
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<l2l::Pretrained> pre, l2l::Pretrained::Open(model));
  const l2l::ModelSpec& spec = pre->spec();
  L2L_RETURN_IF_ERROR(l2l::ValidateLora(spec, lora));
  const std::vector<l2l::LayerLayout> layouts = l2l::BuildLoraLayout(spec, lora);
  std::vector<std::vector<float>> layers;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (const l2l::LayerLayout& layout : layouts) {
    std::vector<float> full(layout.numel, 0.0f);
    L2L_RETURN_IF_ERROR(pre->LoadLayer(layout.index, full.data()));  // the base: a prefix
    l2l::InitLoraAdapters(lora, layout, full.data());
    for (const l2l::ParamInfo& p : layout.params) {
      if (!p.trainable) continue;
      const bool is_a = p.name.ends_with(".lora_A.weight");
      for (size_t i = 0; i < p.numel; ++i) {
        if (!is_a) full[p.offset + i] += noise(rng);  // B from 0; saved tensors moved
      }
    }
    layers.push_back(std::move(full));
  }
  const auto read = [&](int64_t l, float* dst) {
    const std::vector<float>& v = layers[static_cast<size_t>(l)];
    std::copy(v.begin(), v.end(), dst);
    return Status::Ok();
  };
  L2L_ASSIGN_OR_RETURN(l2l::formats::LoraAdapter adapter, l2l::formats::AdapterFromLayers(spec, lora, read));
  adapter.base_model = model;
  L2L_RETURN_IF_ERROR(l2l::formats::WritePeftAdapter(out + "/peft", adapter));
  const auto merged = l2l::formats::MergedLayerSource(spec, lora, read);
  L2L_RETURN_IF_ERROR(l2l::ExportHf(out + "/merged", spec, merged).status());
  L2L_RETURN_IF_ERROR(l2l::SaveModelStreamed(out + "/merged.safetensors", spec, merged));
  if (spec.family == l2l::ModelFamily::kLlama) {
    const Status g = l2l::formats::WriteGgufLora(out + "/adapter.gguf", spec, adapter, {.name = "lora_export_dump"});
    if (lora.modules_to_save.empty()) {
      L2L_RETURN_IF_ERROR(g);
    } else {
      if (g.ok()) return l2l::Internal("WriteGgufLora accepted an adapter with modules_to_save");
      std::ofstream(out + "/gguf_refused.txt") << g.ToString() << "\n";
    }
  }
  std::printf("ok: %zu adapted modules, %zu saved tensors written to %s\n", adapter.modules.size(),
              adapter.saved.size(), out.c_str());
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a LoRA job's exports (peft, merged HF dir, merged safetensors, GGUF LoRA) of a HF model"};
  std::string model, out, target, saved;
  l2l::LoraConfig lora;
  lora.enabled = true;
  uint64_t seed = 7;
  app.add_option("--model", model, "Hugging Face model directory")->required();
  app.add_option("--out", out, "output directory")->required();
  app.add_option("--r", lora.r, "rank")->required();
  app.add_option("--alpha", lora.alpha, "lora_alpha")->required();
  app.add_option("--target", target, "comma-separated target modules or all-linear")->required();
  app.add_option("--modules-to-save", saved, "comma-separated modules trained in full");
  app.add_option("--seed", seed, "seed of A and of B's / the saved tensors' noise");
  CLI11_PARSE(app, argc, argv);
  lora.target = Split(target);
  lora.modules_to_save = Split(saved);
  lora.init_seed = seed;
  const Status s = Run(model, out, lora, seed);
  if (!s.ok()) {
    std::fprintf(stderr, "l2l_lora_export_dump: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

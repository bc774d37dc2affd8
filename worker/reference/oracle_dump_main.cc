// l2l-oracle-dump: writes everything the PyTorch oracle (tests/oracle/torch_oracle.py)
// needs to check our model and optimizer arithmetic, for a tiny GPT with random weights
// and random tokens, in two variants (tied and untied embeddings):
//
//   OUT/<variant>/model.safetensors        initial weights (HF GPT-2 names)
//   OUT/<variant>/data.safetensors         inputs, targets (M,B,T) as F32 (exact small
//                                          integers), probs (M,B,T,V) = our softmax(logits)
//   OUT/<variant>/grads.safetensors        d(mean loss)/d(param), HF names (tied: the wte
//                                          gradient includes the head's contribution)
//   OUT/<variant>/after_noclip.safetensors weights after one AdamW step, clip none
//   OUT/<variant>/after_clip.safetensors   weights after one AdamW step, global clip active
//   OUT/<variant>/meta.json                spec, shapes, our loss, hyperparameters,
//                                          gradient norm and clip coefficient
//
//   l2l-oracle-dump --out DIR [--seed N] [--hf]
//
// With --hf it writes instead the variants tests/oracle/hf_oracle.py checks against the
// Hugging Face transformers classes themselves (tensor names as HfTensorName, meta.json
// naming the architecture): GPT2LMHeadModel tied and untied, LlamaForCausalLM with
// grouped-query attention (tied), multi-query attention with llama3 rope scaling
// (untied) and linear rope scaling, Qwen2ForCausalLM (q/k/v biases) and
// MistralForCausalLM (no sliding window), BertForMaskedLM and
// BertForSequenceClassification (token types and padded sequences: data.safetensors also
// holds token_types and attention_mask; masked-LM targets are -1 except at ~1/3 of the
// real tokens, a classification label sits at position 0).
//
// MixtralForCausalLM (E=4 experts, top-2, with and without the auxiliary load-balancing
// loss): the embeddings' channel 0 is shifted up and block 0's router row of expert 3 reads
// it negatively, so that expert never gets a token in block 0; these variants also write
// three AdamW steps (weights before each, our gradients of each, the weights after:
// steps/step<i>_{weights,grads}.safetensors, after_3steps.safetensors) for the oracle's
// set_to_none AdamW loop (an expert without tokens is skipped, moments included).
// With --lora it writes the variants tests/oracle/peft_oracle.py checks against Hugging
// Face PEFT (LoRA adapters on a frozen base, common/lora.h): per variant model.safetensors
// (the base as the trainer holds it: bf16-rounded for base_dtype bf16, whose unrounded
// weights are model_fp32.safetensors), adapters.safetensors (A and B of every adapter,
// non-zero B so that every gradient path matters, "<HF module>.lora_A" / ".lora_B", and
// the modules_to_save tensors under their HF names), grads.safetensors and
// after_noclip.safetensors with the same keys, peft_adapter/ (the adapters after the step
// as a PEFT adapter directory), data.safetensors and meta.json (+ lora). Two variants
// train with adapter dropout 0.1 (meta lora.dropout, train_seed, step: the masks' key).
//
// The weights are GPT-2's initialisation made larger and non-trivial (matrices x5, every
// bias and LayerNorm parameter perturbed) so that every path of the backward matters.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/rng.h"
#include "common/config.h"
#include "common/formats/model_io.h"
#include "common/formats/safetensors.h"
#include "common/lora.h"
#include "common/lora_frozen.h"
#include "common/models/registry.h"
#include "common/status.h"
#include "worker/reference/reference_trainer.h"

namespace {

using l2l::Result;
using l2l::Status;
namespace w = l2l::worker;

using ::l2l::SplitMix64;

// Uniform in [-1, 1) for draw i of stream key.
double Sym(uint64_t key, uint64_t i) {
  return static_cast<double>(SplitMix64(key ^ SplitMix64(i)) >> 11) * 0x1.0p-52 - 1.0;
}

l2l::JobConfig OracleJob(bool tied, uint64_t seed) {
  l2l::JobConfig c;
  c.model.vocab_size = 61;  // odd sizes catch stride/shape mistakes
  c.model.seq_len = 16;
  c.model.d_model = 24;
  c.model.n_layer = 2;
  c.model.n_head = 3;
  c.model.d_ff = 40;
  c.model.tied_embeddings = tied;
  c.train.micro_batch_size = 2;
  c.train.micro_batches = 2;
  c.train.seq_len = 11;  // < model.seq_len: only the first T rows of wpe are used
  c.train.seed = seed;
  c.train.clip = l2l::ClipMode::kNone;
  c.optim.lr = 1e-2f;
  c.optim.warmup_steps = 0;
  c.optim.total_steps = 0;
  c.optim.beta1 = 0.8f;
  c.optim.beta2 = 0.9f;
  c.optim.eps = 1e-6f;
  c.optim.weight_decay = 0.3f;
  c.optim.grad_clip = 0.0f;
  return c;
}

std::vector<std::vector<float>> OracleWeights(const l2l::ModelSpec& spec, uint64_t seed) {
  std::vector<std::vector<float>> out;
  for (const l2l::LayerLayout& l : l2l::BuildLayout(spec)) {
    out.emplace_back(l.numel);
    float* p = out.back().data();
    l2l::InitLayerParams(spec, l, seed, p);
    const uint64_t key = SplitMix64(seed * 1000003 + static_cast<uint64_t>(l.index));
    for (const l2l::ParamInfo& info : l.params) {
      for (size_t i = 0; i < info.numel; ++i) {
        float& x = p[info.offset + i];
        x = info.shape.size() == 2 ? x * 5.0f : x + static_cast<float>(0.1 * Sym(key, info.offset + i));
      }
    }
  }
  return out;
}

std::vector<w::MicroBatch> OracleBatches(const l2l::JobConfig& c, uint64_t seed) {
  std::vector<w::MicroBatch> mbs;
  const uint64_t key = SplitMix64(seed ^ 0x70CE5);
  uint64_t draw = 0;
  auto token = [&] {
    return static_cast<int32_t>(SplitMix64(key ^ SplitMix64(draw++)) % static_cast<uint64_t>(c.model.vocab_size));
  };
  for (int64_t u = 0; u < c.train.micro_batches; ++u) {
    w::MicroBatch mb;
    mb.B = c.train.micro_batch_size;
    mb.T = c.seq_len();
    for (int64_t i = 0; i < mb.B * mb.T; ++i) {
      mb.inputs.push_back(token());
      mb.targets.push_back(token());
    }
    mbs.push_back(std::move(mb));
  }
  return mbs;
}

nlohmann::json OptimJson(const l2l::JobConfig& c, float lr) {
  return {{"lr", lr},
          {"beta1", c.optim.beta1},
          {"beta2", c.optim.beta2},
          {"eps", c.optim.eps},
          {"weight_decay", c.optim.weight_decay},
          {"grad_clip", c.optim.grad_clip},
          {"clip", l2l::ToString(c.train.clip)}};
}

// A small Llama-family job: C=32 in 4 heads of 8, F=40, T=11 of 16 positions.
l2l::JobConfig LlamaJob(bool tied, int64_t n_kv_heads, uint64_t seed) {
  l2l::JobConfig c = OracleJob(tied, seed);
  c.model.family = l2l::ModelFamily::kLlama;
  c.model.d_model = 32;
  c.model.n_head = 4;
  c.model.n_kv_heads = n_kv_heads;
  c.model.rope_theta = 500.0;
  return c;
}

// A small BERT job: C=24 in 3 heads, F=40, 3 token types, T=11 of 16 positions, eps
// 1e-12; num_labels 0 = masked LM (tied decoder), > 0 = sequence classification.
l2l::JobConfig BertJob(int64_t num_labels, uint64_t seed) {
  l2l::JobConfig c = OracleJob(num_labels == 0, seed);
  c.model.family = l2l::ModelFamily::kBert;
  c.model.type_vocab_size = 3;
  c.model.layer_norm_eps = 1e-12;
  c.model.num_labels = num_labels;
  c.train.micro_batch_size = 3;
  return c;
}

// Token types, padding and encoder targets for a BERT job's micro-batches: sequence b of
// micro-batch u keeps T - 3*((b + u) % 3) real tokens (the rest padding, mask 0); types are
// 0 for the first half of the real tokens, then 1 or 2. Masked LM: a target at about a
// third of the real tokens, -1 elsewhere; classification: label at position 0, -1 elsewhere.
void MakeEncoderBatches(const l2l::JobConfig& c, uint64_t seed, std::vector<w::MicroBatch>* mbs) {
  const uint64_t key = SplitMix64(seed ^ 0xBE27);
  uint64_t draw = 0;
  auto next = [&](uint64_t mod) { return static_cast<int32_t>(SplitMix64(key ^ SplitMix64(draw++)) % mod); };
  for (size_t u = 0; u < mbs->size(); ++u) {
    w::MicroBatch& mb = (*mbs)[u];
    mb.token_types.assign(mb.inputs.size(), 0);
    mb.attention_mask.assign(mb.inputs.size(), 0);
    for (int64_t b = 0; b < mb.B; ++b) {
      const int64_t real = mb.T - 3 * static_cast<int64_t>((static_cast<size_t>(b) + u) % 3);
      for (int64_t t = 0; t < mb.T; ++t) {
        const size_t i = static_cast<size_t>(b * mb.T + t);
        mb.attention_mask[i] = t < real ? 1 : 0;
        mb.token_types[i] = t < real / 2 ? 0 : 1 + static_cast<int32_t>(b % 2);
        if (c.model.num_labels > 0) {
          mb.targets[i] = t == 0 ? next(static_cast<uint64_t>(c.model.num_labels)) : l2l::kernels::kIgnoreTarget;
        } else if (t >= real || next(3) != 0) {
          mb.targets[i] = l2l::kernels::kIgnoreTarget;
        }
      }
    }
  }
}

// Mixture of experts: embeddings' channel 0 += 3 (so every token's normed channel 0 is
// large and positive in block 0) and block 0's router row of the last expert = -10 at
// channel 0, 0 elsewhere: that expert is never in a token's top k in block 0.
void StarveExpert(const l2l::ModelSpec& spec, std::vector<std::vector<float>>* weights) {
  const std::vector<l2l::LayerLayout> layouts = l2l::BuildLayout(spec);
  const l2l::ParamInfo& emb = l2l::EmbeddingTable(spec, layouts[0]);
  for (int64_t v = 0; v < spec.vocab_size; ++v) (*weights)[0][emb.offset + v * spec.d_model] += 3.0f;
  const l2l::ParamInfo* router = layouts[1].Find("block_sparse_moe.gate.weight");
  float* row = (*weights)[1].data() + router->offset + (spec.num_experts - 1) * spec.d_model;
  for (int64_t c = 0; c < spec.d_model; ++c) row[c] = c == 0 ? -10.0f : 0.0f;
}

struct LoraVariant {
  std::string name;
  std::string architecture;
  l2l::JobConfig job;
};

std::vector<LoraVariant> LoraVariants(uint64_t seed) {
  std::vector<LoraVariant> v;
  {
    l2l::JobConfig c = LlamaJob(false, 2, seed);  // GQA, untied head trained in full
    c.lora.enabled = true;
    c.lora.r = 4;
    c.lora.alpha = 8;
    c.lora.target = {"all-linear"};
    c.lora.modules_to_save = {"lm_head"};
    v.push_back({"llama_lora_untied", "LlamaForCausalLM", c});
  }
  {
    l2l::JobConfig c = OracleJob(true, seed);  // GPT-2 Conv1D targets, tied embeddings
    c.lora.enabled = true;
    c.lora.r = 3;
    c.lora.alpha = 12;
    c.lora.target = {"c_attn", "c_proj", "c_fc"};
    v.push_back({"gpt2_lora_tied", "GPT2LMHeadModel", c});
  }
  {
    l2l::JobConfig c = LlamaJob(true, 2, seed);  // a bf16 base, some targets
    c.lora.enabled = true;
    c.lora.r = 5;
    c.lora.alpha = 7;
    c.lora.target = {"q_proj", "v_proj", "down_proj"};
    c.lora.base_dtype = l2l::LoraBaseDType::kBF16;
    v.push_back({"llama_lora_bf16", "LlamaForCausalLM", c});
  }
  {
    // Adapter dropout 0.1 (common/lora.h LoraDropoutStream): the oracle recomputes the
    // masks from the documented formula in Python and puts them in PEFT's lora_dropout.
    l2l::JobConfig c = LlamaJob(false, 2, seed);
    c.lora.enabled = true;
    c.lora.r = 4;
    c.lora.alpha = 8;
    c.lora.dropout = 0.1;
    c.lora.target = {"all-linear"};
    v.push_back({"llama_lora_dropout", "LlamaForCausalLM", c});
  }
  {
    l2l::JobConfig c = OracleJob(true, seed);
    c.lora.enabled = true;
    c.lora.r = 3;
    c.lora.alpha = 12;
    c.lora.dropout = 0.1;
    c.lora.target = {"c_attn", "c_proj", "c_fc"};
    v.push_back({"gpt2_lora_dropout", "GPT2LMHeadModel", c});
  }
  return v;
}

// The adapters (and modules_to_save tensors) of `layers` under the oracle's keys.
struct NamedTensors {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> values;
};

NamedTensors LoraTensors(const l2l::JobConfig& c, const std::vector<l2l::LayerLayout>& layouts,
                         const std::vector<std::vector<float>>& layers) {
  NamedTensors out;
  for (l2l::LoraAdapterTensors& t : l2l::ExtractLoraAdapters(c.model, c.lora, layouts, layers)) {
    out.names.push_back(t.module + ".lora_A");
    out.shapes.push_back({t.r, t.in});
    out.values.push_back(std::move(t.A));
    out.names.push_back(t.module + ".lora_B");
    out.shapes.push_back({t.out, t.r});
    out.values.push_back(std::move(t.B));
  }
  for (size_t l = 0; l < layouts.size(); ++l) {
    if (layouts[l].kind == l2l::LayerKind::kBlock) continue;
    for (const l2l::ParamInfo& p : layouts[l].params) {
      if (!p.trainable) continue;
      out.names.push_back(l2l::HfTensorName(c.model, p));
      out.shapes.push_back(p.shape);
      out.values.emplace_back(layers[l].begin() + p.offset, layers[l].begin() + p.offset + p.numel);
    }
  }
  return out;
}

Status WriteNamed(const std::string& path, const NamedTensors& t) {
  std::vector<l2l::TensorToWrite> w;
  for (size_t i = 0; i < t.names.size(); ++i) w.push_back({t.names[i], t.shapes[i], l2l::DType::kF32, t.values[i].data()});
  return l2l::WriteSafeTensors(path, w);
}

// The base prefix of every LoRA layer buffer (BuildLayout(spec) order and sizes).
std::vector<std::vector<float>> BaseOf(const std::vector<l2l::LayerLayout>& layouts,
                                       const std::vector<std::vector<float>>& layers) {
  std::vector<std::vector<float>> out;
  for (size_t l = 0; l < layouts.size(); ++l) {
    out.emplace_back(layers[l].begin(), layers[l].begin() + l2l::BaseNumel(layouts[l]));
  }
  return out;
}

Status DumpLoraVariant(const std::string& dir, const l2l::JobConfig& cfg, uint64_t seed,
                       const std::string& hf_architecture) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return l2l::ErrnoError("mkdir -p", dir, ec.value());
  L2L_RETURN_IF_ERROR(cfg.Validate());
  const l2l::ModelSpec& spec = cfg.model;
  const std::vector<l2l::LayerLayout> layouts = l2l::BuildLoraLayout(spec, cfg.lora);
  const std::vector<std::vector<float>> base = OracleWeights(spec, seed);
  // Full LoRA buffers: the base, then A and B drawn in [-0.3, 0.3) (B non-zero: with
  // PEFT's B = 0 the gradient of A would be 0 and its path untested).
  std::vector<std::vector<float>> full;
  const uint64_t key = SplitMix64(seed ^ 0x10BA);
  for (size_t l = 0; l < layouts.size(); ++l) {
    full.emplace_back(layouts[l].numel, 0.0f);
    std::copy(base[l].begin(), base[l].end(), full.back().begin());
    for (size_t i = base[l].size(); i < layouts[l].numel; ++i) {
      full.back()[i] = static_cast<float>(0.3 * Sym(key + l, i));
    }
    L2L_RETURN_IF_ERROR(l2l::RoundToHeld(layouts[l], cfg.lora, full.back().data()));
  }
  std::vector<w::MicroBatch> mbs = OracleBatches(cfg, seed);
  const int64_t M = cfg.train.micro_batches, B = cfg.train.micro_batch_size, T = cfg.seq_len();

  L2L_ASSIGN_OR_RETURN(auto t, w::ReferenceTrainer::Create(cfg, full));
  L2L_ASSIGN_OR_RETURN(float loss, t->ComputeGradients(mbs));
  L2L_RETURN_IF_ERROR(l2l::SaveModel(dir + "/model.safetensors", spec, BaseOf(layouts, full)));
  if (cfg.lora.base_dtype != l2l::LoraBaseDType::kF32) {
    L2L_RETURN_IF_ERROR(l2l::SaveModel(dir + "/model_fp32.safetensors", spec, base));
  }
  L2L_RETURN_IF_ERROR(WriteNamed(dir + "/adapters.safetensors", LoraTensors(cfg, layouts, full)));
  L2L_RETURN_IF_ERROR(WriteNamed(dir + "/grads.safetensors", LoraTensors(cfg, layouts, t->grads())));
  L2L_ASSIGN_OR_RETURN(auto s, w::ReferenceTrainer::Create(cfg, full));
  L2L_ASSIGN_OR_RETURN(float step_loss, s->Step(mbs));
  if (step_loss != loss) return l2l::Internal("loss of the step differs from ComputeGradients'");
  L2L_RETURN_IF_ERROR(WriteNamed(dir + "/after_noclip.safetensors", LoraTensors(cfg, layouts, s->params())));
  // The adapters after the step as PEFT's own adapter directory (PeftModel.from_pretrained).
  L2L_RETURN_IF_ERROR(s->SavePeftAdapter(dir + "/peft_adapter"));
  // The frozen base must not move.
  for (size_t l = 0; l < layouts.size(); ++l) {
    for (const l2l::ParamInfo& p : layouts[l].params) {
      if (p.trainable) continue;
      for (size_t i = 0; i < p.numel; ++i) {
        if (s->params()[l][p.offset + i] != full[l][p.offset + i]) {
          return l2l::Internal("the frozen base tensor " + p.name + " changed in the step");
        }
      }
    }
  }

  std::vector<float> inputs, targets;
  for (int64_t u = 0; u < M; ++u) {
    inputs.insert(inputs.end(), mbs[u].inputs.begin(), mbs[u].inputs.end());
    targets.insert(targets.end(), mbs[u].targets.begin(), mbs[u].targets.end());
  }
  L2L_RETURN_IF_ERROR(l2l::WriteSafeTensors(dir + "/data.safetensors",
                                            {{"inputs", {M, B, T}, l2l::DType::kF32, inputs.data()},
                                             {"targets", {M, B, T}, l2l::DType::kF32, targets.data()}}));
  nlohmann::json meta;
  meta["spec"] = nlohmann::json::parse(l2l::ModelSpecToJson(spec));
  meta["B"] = B;
  meta["T"] = T;
  meta["M"] = M;
  meta["loss"] = loss;
  meta["hf_architecture"] = hf_architecture;
  std::vector<std::string> modules;
  for (const l2l::LoraTarget& tg : l2l::ResolvedTargets(spec, cfg.lora)) {
    if (std::find(modules.begin(), modules.end(), tg.module) == modules.end()) modules.push_back(tg.module);
  }
  meta["lora"] = {{"r", cfg.lora.r},
                  {"alpha", cfg.lora.alpha},
                  {"target_modules", modules},
                  {"modules_to_save", cfg.lora.modules_to_save},
                  {"base_dtype", l2l::ToString(cfg.lora.base_dtype)},
                  // Adapter dropout: the masks' key (common/lora.h LoraDropoutStream) is
                  // (train.seed, step 0, block, micro-batch u of data.safetensors, weight).
                  {"dropout", cfg.lora.dropout},
                  {"train_seed", cfg.train.seed},
                  {"step", 0}};
  nlohmann::json o = OptimJson(cfg, l2l::LearningRate(cfg.optim, 0));
  o["grad_norm"] = s->last_grad_norm();
  meta["steps"]["noclip"] = o;
  std::ofstream out(dir + "/meta.json");
  out << meta.dump(2) << "\n";
  if (!out.good()) return l2l::ErrnoError("write", dir + "/meta.json", errno);
  std::printf("l2l-oracle-dump: %s (LoRA r=%lld): loss %.6f\n", dir.c_str(), static_cast<long long>(cfg.lora.r),
              loss);
  return Status::Ok();
}

struct HfVariant {
  std::string name;
  std::string architecture;  // the transformers class that must reproduce it
  l2l::JobConfig job;
};

std::vector<HfVariant> HfVariants(uint64_t seed) {
  std::vector<HfVariant> v;
  v.push_back({"gpt2_tied", "GPT2LMHeadModel", OracleJob(true, seed)});
  v.push_back({"gpt2_untied", "GPT2LMHeadModel", OracleJob(false, seed)});
  v.push_back({"llama_gqa_tied", "LlamaForCausalLM", LlamaJob(true, 2, seed)});
  {
    // Multi-query attention, untied head, llama3 scaling whose three frequency bands are
    // all populated (hs=8, theta=100: wavelengths 6.3, 19.9, 62.8, 199 against
    // 32/4 and 32/1).
    l2l::JobConfig c = LlamaJob(false, 1, seed);
    c.model.rope_theta = 100.0;
    c.model.rms_norm_eps = 1e-5;
    c.model.rope_scaling = {l2l::RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 32};
    c.model.seq_len = 64;  // transformers wants original_max_position_embeddings below it
    v.push_back({"llama_mqa_untied_llama3", "LlamaForCausalLM", c});
  }
  {
    l2l::JobConfig c = LlamaJob(true, 4, seed);
    c.model.rope_scaling.type = l2l::RopeScalingType::kLinear;
    c.model.rope_scaling.factor = 2.5;
    v.push_back({"llama_mha_linear", "LlamaForCausalLM", c});
  }
  {
    l2l::JobConfig c = LlamaJob(false, 2, seed);
    c.model.qkv_bias = true;
    c.model.rope_theta = 1e6;
    v.push_back({"qwen2_bias_untied", "Qwen2ForCausalLM", c});
  }
  v.push_back({"mistral_gqa", "MistralForCausalLM", LlamaJob(false, 2, seed)});
  for (bool aux : {false, true}) {
    l2l::JobConfig c = LlamaJob(false, 2, seed);
    c.model.num_experts = 4;
    c.model.experts_per_token = 2;
    c.model.output_router_logits = aux;
    if (aux) c.model.router_aux_loss_coef = 0.25;  // large enough that its gradient shows
    v.push_back({aux ? "mixtral_aux" : "mixtral_noaux", "MixtralForCausalLM", c});
  }
  v.push_back({"bert_mlm", "BertForMaskedLM", BertJob(0, seed)});
  v.push_back({"bert_classify", "BertForSequenceClassification", BertJob(3, seed)});
  return v;
}

Status DumpVariant(const std::string& dir, const l2l::JobConfig& job, uint64_t seed,
                   const std::string& hf_architecture = "") {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return l2l::ErrnoError("mkdir -p", dir, ec.value());
  l2l::JobConfig cfg = job;
  const bool tied = cfg.model.tied_embeddings;
  const l2l::ModelSpec& spec = cfg.model;
  std::vector<std::vector<float>> weights = OracleWeights(spec, seed);
  if (spec.moe()) StarveExpert(spec, &weights);
  std::vector<w::MicroBatch> mbs = OracleBatches(cfg, seed);
  const bool encoder = l2l::models::IsEncoder(spec);
  if (encoder) MakeEncoderBatches(cfg, seed, &mbs);
  const int64_t M = cfg.train.micro_batches, B = cfg.train.micro_batch_size, T = cfg.seq_len();
  const int64_t V = spec.vocab_size;

  L2L_ASSIGN_OR_RETURN(auto t, w::ReferenceTrainer::Create(cfg, weights));
  L2L_RETURN_IF_ERROR(l2l::SaveModel(dir + "/model.safetensors", spec, weights));
  L2L_ASSIGN_OR_RETURN(float loss, t->ComputeGradients(mbs));
  L2L_RETURN_IF_ERROR(l2l::SaveModel(dir + "/grads.safetensors", spec, t->grads()));

  std::vector<float> inputs, targets, types, mask, probs(static_cast<size_t>(M * B * T * V));
  for (int64_t u = 0; u < M; ++u) {
    inputs.insert(inputs.end(), mbs[u].inputs.begin(), mbs[u].inputs.end());
    targets.insert(targets.end(), mbs[u].targets.begin(), mbs[u].targets.end());
    types.insert(types.end(), mbs[u].token_types.begin(), mbs[u].token_types.end());
    mask.insert(mask.end(), mbs[u].attention_mask.begin(), mbs[u].attention_mask.end());
    // Probabilities of the decoders only (the encoders' oracle checks loss and gradients).
    if (!encoder) L2L_RETURN_IF_ERROR(t->Probs(mbs[u].inputs.data(), B, T, probs.data() + u * B * T * V));
  }
  std::vector<l2l::TensorToWrite> data = {{"inputs", {M, B, T}, l2l::DType::kF32, inputs.data()},
                                            {"targets", {M, B, T}, l2l::DType::kF32, targets.data()}};
  if (encoder) {
    data.push_back({"token_types", {M, B, T}, l2l::DType::kF32, types.data()});
    data.push_back({"attention_mask", {M, B, T}, l2l::DType::kF32, mask.data()});
  } else {
    data.push_back({"probs", {M, B, T, V}, l2l::DType::kF32, probs.data()});
  }
  L2L_RETURN_IF_ERROR(l2l::WriteSafeTensors(dir + "/data.safetensors", data));

  nlohmann::json meta;
  meta["spec"] = nlohmann::json::parse(l2l::ModelSpecToJson(spec));
  meta["B"] = B;
  meta["T"] = T;
  meta["M"] = M;
  meta["loss"] = loss;
  if (!hf_architecture.empty()) {
    meta["hf_architecture"] = hf_architecture;
    meta["num_params"] = spec.NumParams();
    nlohmann::json names = nlohmann::json::object();  // our name -> the HF file's name
    for (const l2l::LayerLayout& l : l2l::BuildLayout(spec)) {
      for (const l2l::ParamInfo& p : l.params) names[p.name] = l2l::HfTensorName(spec, p);
    }
    meta["hf_names"] = names;
  }
  // Step 0 of each case, from the same initial weights.
  for (const char* which : {"noclip", "clip"}) {
    l2l::JobConfig c = cfg;
    if (std::string(which) == "clip") {
      c.train.clip = l2l::ClipMode::kGlobal;
      c.optim.grad_clip = 0.5f;  // below the gradient norm: the clip is active
    }
    L2L_ASSIGN_OR_RETURN(auto s, w::ReferenceTrainer::Create(c, weights));
    L2L_ASSIGN_OR_RETURN(float step_loss, s->Step(mbs));
    if (step_loss != loss) return l2l::Internal("loss of the step differs from ComputeGradients'");
    L2L_RETURN_IF_ERROR(l2l::SaveModel(dir + "/after_" + which + ".safetensors", spec, s->params()));
    nlohmann::json o = OptimJson(c, l2l::LearningRate(c.optim, 0));
    o["grad_norm"] = s->last_grad_norm();
    o["clip_coefficient"] = s->last_clip_coefficient();
    meta["steps"][which] = o;
  }
  if (spec.moe()) {
    // Three steps: the weights before each and our gradients of each, then the result.
    L2L_ASSIGN_OR_RETURN(auto s, w::ReferenceTrainer::Create(cfg, weights));
    std::filesystem::create_directories(dir + "/steps", ec);
    nlohmann::json steps = nlohmann::json::array();
    for (int i = 0; i < 3; ++i) {
      const std::string stem = dir + "/steps/step" + std::to_string(i);
      L2L_RETURN_IF_ERROR(l2l::SaveModel(stem + "_weights.safetensors", spec, s->params()));
      L2L_ASSIGN_OR_RETURN(float step_loss, s->Step(mbs));
      L2L_RETURN_IF_ERROR(l2l::SaveModel(stem + "_grads.safetensors", spec, s->grads()));
      steps.push_back({{"loss", step_loss}, {"touched", s->experts_touched()}, {"lr", l2l::LearningRate(cfg.optim, i)}});
    }
    L2L_RETURN_IF_ERROR(l2l::SaveModel(dir + "/after_3steps.safetensors", spec, s->params()));
    meta["moe_steps"] = steps;
    meta["expert_steps"] = s->expert_steps();
  }
  std::ofstream out(dir + "/meta.json");
  out << meta.dump(2) << "\n";
  if (!out.good()) return l2l::ErrnoError("write", dir + "/meta.json", errno);
  std::printf("l2l-oracle-dump: %s (%s embeddings): loss %.6f\n", dir.c_str(), tied ? "tied" : "untied", loss);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Dump a tiny GPT's weights, gradients and AdamW step for the PyTorch oracle"};
  std::string out;
  uint64_t seed = 2024;
  app.add_option("--out", out, "output directory")->required();
  bool hf = false;
  app.add_option("--seed", seed, "weights and tokens seed")->capture_default_str();
  app.add_flag("--hf", hf, "write the Hugging Face transformers oracle's variants instead");
  bool lora = false;
  app.add_flag("--lora", lora, "write the PEFT (LoRA) oracle's variants instead");
  CLI11_PARSE(app, argc, argv);
  if (lora) {
    for (const LoraVariant& v : LoraVariants(seed)) {
      const Status st = DumpLoraVariant(out + "/" + v.name, v.job, seed, v.architecture);
      if (!st.ok()) {
        std::fprintf(stderr, "l2l-oracle-dump: %s: %s\n", v.name.c_str(), st.ToString().c_str());
        return 1;
      }
    }
    return 0;
  }
  if (hf) {
    for (const HfVariant& v : HfVariants(seed)) {
      const Status st = DumpVariant(out + "/" + v.name, v.job, seed, v.architecture);
      if (!st.ok()) {
        std::fprintf(stderr, "l2l-oracle-dump: %s: %s\n", v.name.c_str(), st.ToString().c_str());
        return 1;
      }
    }
    return 0;
  }
  for (bool tied : {true, false}) {
    const Status st = DumpVariant(out + (tied ? "/tied" : "/untied"), OracleJob(tied, seed), seed);
    if (!st.ok()) {
      std::fprintf(stderr, "l2l-oracle-dump: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

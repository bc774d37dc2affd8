// l2l_fuzz_seeds: writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/)
// with l2l's own writers, so every seed is a small valid input of the current formats.
// Usage: l2l_fuzz_seeds OUT_DIR  (scripts/fuzz.sh seeds regenerates the committed corpus;
// regression inputs found by fuzzing are kept beside the seeds, under other names).
//
// Thread-safety: a single-threaded program.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/formats/gguf_writer.h"
#include "common/formats/model_config.h"
#include "common/formats/safetensors.h"
#include "common/formats/tokens_file.h"
#include "common/logging.h"
#include "common/model_spec.h"
#include "eps_server/checkpoint.h"
#include "eps_server/eps_core.h"
#include "proto/control.pb.h"
#include "proto/data.pb.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string g_out;
int g_failures = 0;

void Check(const l2l::Status& s, const std::string& what) {
  if (!s.ok()) {
    std::fprintf(stderr, "l2l_fuzz_seeds: %s: %s\n", what.c_str(), s.ToString().c_str());
    ++g_failures;
  }
}

std::string Dir(const std::string& target) {
  const std::string d = g_out + "/" + target;
  fs::create_directories(d);
  return d;
}

void Put(const std::string& target, const std::string& name, const std::string& bytes) {
  std::ofstream(Dir(target) + "/" + name, std::ios::binary) << bytes;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

l2l::JobConfig TinyJob() {  // the rpc target's job (tests/fuzz/rpc_fuzz.cc)
  l2l::JobConfig j;
  j.model.vocab_size = 64;
  j.model.seq_len = 16;
  j.model.d_model = 32;
  j.model.n_layer = 2;
  j.model.n_head = 4;
  j.model.d_ff = 128;
  j.train.steps = 1000000;
  return j;
}

l2l::formats::ModelConfig LlamaConfig() {
  l2l::formats::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = 258;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.bos_token_id = 257;
  c.eos_token_ids = {257};
  return c;
}

l2l::tok::GgufVocab ByteVocab(const std::string& pre) {
  l2l::tok::GgufVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(l2l::tok::BytesToByteLevel(std::string(1, static_cast<char>(b))));
  v.tokens.push_back("he");          // 256
  v.tokens.push_back("<|im_end|>");  // 257, control
  v.merges = {"h e"};
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[257] = 3;
  v.bos_id = 257;
  v.eos_id = 257;
  v.pre = pre;
  return v;
}

// A SentencePiece vocabulary (tokenizer.ggml.model "llama"): <unk>, <s>, </s>, byte
// tokens for \n and the bytes of "é", and scored pieces.
l2l::tok::GgufVocab SpmVocab() {
  l2l::tok::GgufVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "ab", "  "};
  v.scores = {0, 0, 0, 0, 0, 0, -1, -2, -3, -4, -5, 0};
  v.token_types = {2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 4};
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  return v;
}

void JobConfigSeeds() {
  Put("job_config", "tiny.yaml", l2l::JobConfigToYaml(TinyJob()));
  l2l::JobConfig llama = TinyJob();
  llama.model.family = l2l::ModelFamily::kLlama;
  llama.model.n_kv_heads = 2;
  llama.train.mode = l2l::TrainMode::kLockfree;
  llama.train.staleness = 2;
  llama.publish_dtype = l2l::DType::kBF16;
  Put("job_config", "llama.yaml", l2l::JobConfigToYaml(llama));
  Put("job_config", "sections.yaml",
      "model:\n  preset: tiny\n  n_layer: 3\noptim:\n  lr: 3.0e-4\n  warmup_steps: 2\n  total_steps: 10\n"
      "train:\n  steps: 10\n  clip: per_layer\ndata:\n  train_path: train.bin\n");
  Put("job_config", "from.yaml", "model:\n  from: model.gguf\ntrain:\n  steps: 2\n");
}

void HfConfigSeeds() {
  Put("hf_config", "llama.json", l2l::formats::HfConfigJson(LlamaConfig()).dump(1));
  json gpt2 = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", 64},
               {"n_positions", 16}, {"n_embd", 32},  {"n_layer", 2},        {"n_head", 4},
               {"n_inner", nullptr}, {"layer_norm_epsilon", 1e-5}, {"tie_word_embeddings", true}};
  Put("hf_config", "gpt2.json", gpt2.dump(1));
  json qwen = l2l::formats::HfConfigJson(LlamaConfig());
  qwen["model_type"] = "qwen2";
  qwen["architectures"] = {"Qwen2ForCausalLM"};
  qwen["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  qwen["eos_token_id"] = {1, 2};
  Put("hf_config", "qwen2_rope.json", qwen.dump(1));
}

void TokensSeeds() {
  const std::string tmp = g_out + "/.tmp.bin";
  std::vector<uint16_t> t16 = {1, 2, 3, 250, 7, 0, 9, 64, 65, 66, 67};
  Check(l2l::WriteTokensFile(tmp, t16), "tokens v1");
  Put("tokens_file", "v1.bin", std::string(1, '\0') + Slurp(tmp));
  std::vector<uint32_t> t32 = {1, 70000, 3, 65536, 5};
  Check(l2l::WriteTokensFileForVocab(tmp, t32, 70001), "tokens v2");
  Put("tokens_file", "v2.bin", std::string(1, '\0') + Slurp(tmp));
  std::vector<uint8_t> mask = {0, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1};
  Check(l2l::WriteLossMaskFile(tmp, mask), "mask");
  // Mode byte 23: odd (the mask reader), expected count 11 (= 23 >> 1).
  Put("tokens_file", "mask.bin", std::string(1, '\x17') + Slurp(tmp));
  fs::remove(tmp);
}

void SafetensorsSeeds() {
  const std::string tmp = g_out + "/.tmp.safetensors";
  std::vector<float> a = {1.5f, -2.0f, 0.25f, 3.0f, 0.0f, -0.5f};
  std::vector<float> b = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<l2l::TensorToWrite> ts;
  ts.push_back({"wte.weight", {2, 3}, l2l::DType::kF32, a.data()});
  ts.push_back({"h.0.ln_1.weight", {4}, l2l::DType::kBF16, b.data()});
  ts.push_back({"h.0.ln_1.bias", {2, 2}, l2l::DType::kF16, b.data()});
  Check(l2l::WriteSafeTensors(tmp, ts, {{"format", "pt"}}), "safetensors");
  Put("safetensors", "three.safetensors", Slurp(tmp));
  fs::remove(tmp);
}

void GgufSeeds() {
  const std::string tmp = g_out + "/.tmp.gguf";
  namespace f = l2l::formats;
  f::GgufWriter w;
  Check(f::AddConfigToGguf(LlamaConfig(), &w), "gguf config");
  w.Set("general.name", f::GgufValue::String("fuzz-seed"));
  const l2l::tok::GgufVocab v = ByteVocab("llama-bpe");
  w.Set("tokenizer.ggml.model", f::GgufValue::String("gpt2"));
  w.Set("tokenizer.ggml.pre", f::GgufValue::String(v.pre));
  w.Set("tokenizer.ggml.tokens", f::GgufValue::StringArray(v.tokens));
  w.Set("tokenizer.ggml.merges", f::GgufValue::StringArray(v.merges));
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.125f - 4.0f;
  Check(w.AddTensor({"token_embd.weight", {2, 32}, f::GgmlType::kQ8_0, x.data()}), "gguf q8");
  Check(w.AddTensor({"output_norm.weight", {8}, f::GgmlType::kF32, x.data()}), "gguf f32");
  Check(w.AddTensor({"blk.0.attn_norm.weight", {4, 4}, f::GgmlType::kF16, x.data()}), "gguf f16");
  Check(w.AddTensor({"blk.0.ffn_norm.weight", {16}, f::GgmlType::kBF16, x.data()}), "gguf bf16");
  Check(w.Write(tmp), "gguf write");
  Put("gguf", "llama_tok.gguf", Slurp(tmp));
  f::GgufWriter bare;
  bare.Set("general.architecture", f::GgufValue::String("gpt2"));
  bare.Set("gpt2.block_count", f::GgufValue::U32(2));
  Check(bare.AddTensor({"x", {3}, f::GgmlType::kF32, x.data()}), "gguf bare");
  Check(bare.Write(tmp), "gguf write bare");
  Put("gguf", "bare.gguf", Slurp(tmp));
  f::GgufWriter spm;
  spm.Set("general.architecture", f::GgufValue::String("gemma3"));
  const l2l::tok::GgufVocab sv = SpmVocab();
  spm.Set("tokenizer.ggml.model", f::GgufValue::String("llama"));
  spm.Set("tokenizer.ggml.tokens", f::GgufValue::StringArray(sv.tokens));
  spm.Set("tokenizer.ggml.scores",
          f::GgufValue::FloatArray(f::GgufValueType::kF32, std::vector<double>(sv.scores.begin(), sv.scores.end())));
  spm.Set("tokenizer.ggml.token_type",
          f::GgufValue::IntArray(f::GgufValueType::kI32, std::vector<int64_t>(sv.token_types.begin(), sv.token_types.end())));
  spm.Set("tokenizer.ggml.bos_token_id", f::GgufValue::U32(1));
  spm.Set("tokenizer.ggml.unknown_token_id", f::GgufValue::U32(0));
  spm.Set("tokenizer.ggml.add_space_prefix", f::GgufValue::Bool(true));
  Check(spm.AddTensor({"x", {3}, f::GgmlType::kF32, x.data()}), "gguf spm");
  Check(spm.Write(tmp), "gguf write spm");
  Put("gguf", "spm_tok.gguf", Slurp(tmp));
  fs::remove(tmp);
}

void TokenizerSeeds() {
  for (const char* pre : {"llama-bpe", "qwen2"}) {
    auto spec = l2l::tok::Tokenizer::SpecFromGguf(ByteVocab(pre));
    Check(spec.status(), std::string("bpe spec ") + pre);
    if (spec.ok()) Put("tokenizer_json", std::string("bpe_") + pre + ".json", l2l::tok::BpeSpecToTokenizerJson(*spec));
  }
  auto spm = l2l::tok::Tokenizer::SpecFromGguf(SpmVocab());
  Check(spm.status(), "spm spec");
  if (spm.ok()) Put("tokenizer_json", "spm.json", l2l::tok::BpeSpecToTokenizerJson(*spm));
  json vocab = json::object();
  const char* toks[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "hello", ","};
  for (int i = 0; i < 10; ++i) vocab[toks[i]] = i;
  json added = json::array();
  for (int i = 0; i < 5; ++i) {
    added.push_back({{"id", i}, {"content", toks[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  json wp = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                      {"strip_accents", nullptr}, {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}, {"cls", {"[CLS]", 2}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                 {"max_input_chars_per_word", 100}, {"vocab", vocab}}}};
  Put("tokenizer_json", "wordpiece.json", wp.dump(1));
}

void CheckpointSeeds() {
  const std::string state = g_out + "/.tmp-state";
  fs::create_directories(state);
  {
    l2l::eps::CoreOptions o;
    o.job_id = "fuzzseeds" + std::to_string(::getpid());
    o.transport = l2l::Transport::kGrpc;
    o.state_dir = state;
    l2l::eps::EpsCore core(o);
    Check(core.CreateJob(TinyJob()), "checkpoint job");
    auto ck = core.Checkpoint("");
    Check(ck.status(), "checkpoint");
    if (ck.ok()) Put("checkpoint_manifest", "tiny.json", Slurp(ck->dir + "/" + l2l::eps::kCheckpointManifest));
    core.Stop();
  }
  fs::remove_all(state);
}

// rpc target inputs: a selector byte, then the request (see rpc_fuzz.cc).
template <typename M>
void Rpc(const std::string& name, uint8_t selector, const M& m) {
  Put("rpc", name, std::string(1, static_cast<char>(selector)) + m.SerializeAsString());
}

void RpcSeeds() {
  namespace data = ::l2l::data::v1;
  namespace control = ::l2l::control::v1;
  data::RegisterRequest reg;
  reg.set_worker_name("w1");
  reg.set_hostname("localhost");
  reg.set_transport("grpc");
  reg.set_pid(1);
  Rpc("register", 0, reg);
  reg.set_previous_worker_id(0);
  Rpc("register_rejoin", 0, reg);
  data::HeartbeatRequest hb;
  hb.set_worker_id(0);
  hb.set_step(0);
  Rpc("heartbeat", 1, hb);
  data::FetchLayerRequest fl;
  fl.set_worker_id(0);
  fl.set_layer(1);
  fl.set_min_version(0);
  Rpc("fetch_layer", 2, fl);
  // The head layer's gradient (the last layer of TinyJob; its numel from the layout), in
  // one chunk and in two.
  const auto layout = l2l::BuildLayout(TinyJob().model);
  const int64_t head = static_cast<int64_t>(layout.size()) - 1;
  const int64_t numel = static_cast<int64_t>(layout.back().numel);
  data::GradientChunk c;
  c.set_worker_id(0);
  c.set_layer(head);
  c.set_step(0);
  c.set_micro_batches(2);
  c.set_numel(numel);
  std::vector<float> g(static_cast<size_t>(numel), 0.01f);
  auto framed = [](const data::GradientChunk& m) {
    const std::string s = m.SerializeAsString();
    return std::string{static_cast<char>(s.size() & 0xff), static_cast<char>(s.size() >> 8)} + s;
  };
  if (numel * 4 < 60000) {
    c.set_data(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
    Put("rpc", "push_gradient", std::string(1, '\3') + framed(c));
    const size_t half = static_cast<size_t>(numel / 2) * 4;
    data::GradientChunk c1 = c, c2;
    c1.set_data(c.data().substr(0, half));
    c2.set_data(c.data().substr(half));
    Put("rpc", "push_gradient_2chunks", std::string(1, '\3') + framed(c1) + framed(c2));
  }
  data::StepDoneRequest sd;
  sd.set_worker_id(0);
  sd.set_step(0);
  sd.set_loss(4.1);
  sd.set_tokens(128);
  sd.set_data_position("0:128");
  Rpc("step_done", 4, sd);
  data::DeregisterRequest dr;
  dr.set_worker_id(1);
  Rpc("deregister", 5, dr);
  control::CreateJobRequest cj;
  cj.set_config_yaml(l2l::JobConfigToYaml(TinyJob()));
  Rpc("create_job", 6, cj);
  cj.set_init_safetensors("model.safetensors");
  Rpc("create_job_init", 6, cj);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: l2l_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  (void)l2l::InitLogging("warn");
  g_out = argv[1];
  JobConfigSeeds();
  HfConfigSeeds();
  TokensSeeds();
  SafetensorsSeeds();
  GgufSeeds();
  TokenizerSeeds();
  CheckpointSeeds();
  RpcSeeds();
  return g_failures == 0 ? 0 : 1;
}

// Tests for common/formats/model_io.h: a model survives SaveModel -> LoadModel (F32 exactly, BF16
// as rounded by common/dtype.h), tensors carry Hugging Face GPT-2 names and shapes, and
// files that do not match the model (missing tensor, wrong shape, stray tensor, another
// spec) are rejected naming the tensor and the shapes.
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/formats/model_io.h"
#include "common/formats/safetensors.h"
#include "tests/common/temp_dir.h"

namespace l2l {
namespace {

using testing::TempDir;

const ModelSpec kTiny{256, 32, 32, 2, 2, 128, true};

std::vector<std::vector<float>> InitModel(const ModelSpec& spec, uint64_t seed) {
  std::vector<std::vector<float>> layers;
  for (const LayerLayout& l : BuildLayout(spec)) {
    std::vector<float> buf(l.numel);
    InitLayerParams(spec, l, seed, buf.data());
    // Make biases and LayerNorm params non-trivial so a mix-up shows.
    for (size_t i = 0; i < buf.size(); ++i) buf[i] += 0.001f * static_cast<float>(i % 97);
    layers.push_back(std::move(buf));
  }
  return layers;
}

// Rewrites a saved model's tensors through `edit` (rename / reshape / drop / add).
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
std::vector<Tensor> AllTensors(const std::string& path) {
  SafeTensorsReader r = std::move(SafeTensorsReader::Open(path)).value();
  std::vector<Tensor> out;
  for (const SafeTensorInfo& t : r.tensors()) out.push_back({t.name, t.shape, *r.ReadAsFloat(t.name)});
  return out;
}
void WriteTensors(const std::string& path, const std::vector<Tensor>& ts,
                  const std::map<std::string, std::string>& meta = {}) {
  std::vector<TensorToWrite> w;
  for (const Tensor& t : ts) w.push_back({t.name, t.shape, DType::kF32, t.data.data(), nullptr});
  REQUIRE(WriteSafeTensors(path, w, meta).ok());
}

void ExpectError(const Status& s, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

}  // namespace

TEST_CASE("A model survives SaveModel -> LoadModel with HF GPT-2 names and shapes", "[model_io]") {
  TempDir dir;
  const auto layers = InitModel(kTiny, 5);
  const std::string path = dir.File("m.safetensors");
  REQUIRE(SaveModel(path, kTiny, layers, DType::kF32, {{"step", "12"}}).ok());

  Result<LoadedModel> m = LoadModel(path);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  CHECK(m->spec == kTiny);
  CHECK(m->layers == layers);
  CHECK(m->metadata.at("format") == "pt");
  CHECK(m->metadata.at("step") == "12");
  CHECK(ReadModelSpec(path).value() == kTiny);

  // Names and shapes as Hugging Face's GPT-2 (Conv1D weights stored (in, out)).
  SafeTensorsReader r = std::move(SafeTensorsReader::Open(path)).value();
  const int64_t C = 32;
  CHECK(r.Find("wte.weight")->shape == std::vector<int64_t>{256, C});
  CHECK(r.Find("wpe.weight")->shape == std::vector<int64_t>{32, C});
  CHECK(r.Find("h.1.attn.c_attn.weight")->shape == std::vector<int64_t>{C, 3 * C});
  CHECK(r.Find("h.1.attn.c_proj.bias")->shape == std::vector<int64_t>{C});
  CHECK(r.Find("h.0.mlp.c_fc.weight")->shape == std::vector<int64_t>{C, 128});
  CHECK(r.Find("h.0.mlp.c_proj.weight")->shape == std::vector<int64_t>{128, C});
  CHECK(r.Find("ln_f.bias")->shape == std::vector<int64_t>{C});
  CHECK(r.Find("lm_head.weight") == nullptr);  // tied: not stored, as HF does
  CHECK(r.tensors().size() == 2 + 2 * 12 + 2);
}

TEST_CASE("SaveModelStreamed reads each layer once, in model order, and a read error leaves no file",
          "[model_io]") {
  TempDir dir;
  const auto layers = InitModel(kTiny, 9);
  std::vector<int64_t> calls;
  const std::string path = dir.File("s.safetensors");
  auto read = [&](int64_t l, float* out) {
    calls.push_back(l);
    std::copy(layers[l].begin(), layers[l].end(), out);
    return Status::Ok();
  };
  REQUIRE(SaveModelStreamed(path, kTiny, read).ok());
  std::vector<int64_t> order(layers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  CHECK(calls == order);
  Result<LoadedModel> m = LoadModel(path);
  REQUIRE(m.ok());
  CHECK(m->layers == layers);  // the values the callback handed over, in place

  const std::string bad = dir.File("bad.safetensors");
  Status s = SaveModelStreamed(bad, kTiny, [&](int64_t l, float* out) {
    if (l == 2) return DataLoss("spill read failed");
    std::copy(layers[l].begin(), layers[l].end(), out);
    return Status::Ok();
  });
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("spill read failed") != std::string::npos);
  CHECK(s.message().find("layer 2") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(bad));
}

TEST_CASE("BF16 export stores rounded weights and untied models store lm_head", "[model_io]") {
  TempDir dir;
  ModelSpec spec = kTiny;
  spec.tied_embeddings = false;
  const auto layers = InitModel(spec, 9);
  const std::string path = dir.File("bf16.safetensors");
  REQUIRE(SaveModel(path, spec, layers, DType::kBF16).ok());
  SafeTensorsReader r = std::move(SafeTensorsReader::Open(path)).value();
  CHECK(r.Find("lm_head.weight")->dtype_name == "BF16");
  Result<LoadedModel> m = LoadModel(path);
  REQUIRE(m.ok());
  REQUIRE(m->layers.size() == layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    REQUIRE(m->layers[l].size() == layers[l].size());
    for (size_t i = 0; i < layers[l].size(); ++i) REQUIRE(m->layers[l][i] == Bf16ToFloat(FloatToBf16(layers[l][i])));
  }
}

TEST_CASE("HF-style files load: 'transformer.' prefix, attention buffers, tied lm_head copy", "[model_io]") {
  TempDir dir;
  const auto layers = InitModel(kTiny, 2);
  const std::string src = dir.File("src.safetensors");
  REQUIRE(SaveModel(src, kTiny, layers).ok());
  std::vector<Tensor> ts = AllTensors(src);
  std::vector<float> wte;
  for (Tensor& t : ts) {
    if (t.name == "wte.weight") wte = t.data;
    t.name = "transformer." + t.name;
  }
  ts.push_back({"transformer.h.0.attn.bias", {1, 1, 32, 32}, std::vector<float>(32 * 32, 1.0f)});
  ts.push_back({"transformer.h.1.attn.masked_bias", {}, {-1e4f}});
  ts.push_back({"lm_head.weight", {256, 32}, wte});
  const std::string hf = dir.File("hf.safetensors");
  WriteTensors(hf, ts, {{"format", "pt"}});  // no l2l spec in metadata
  ExpectError(LoadModel(hf).status(), {hf, "load it with an explicit ModelSpec"});
  Result<LoadedModel> m = LoadModel(hf, kTiny);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  CHECK(m->layers == layers);

  // An lm_head that differs from wte cannot be folded into a tied model.
  ts.back().data[5] += 1.0f;
  WriteTensors(hf, ts);
  ExpectError(LoadModel(hf, kTiny).status(), {"lm_head.weight", "tied"});
}

TEST_CASE("A file missing a tensor is rejected naming it and its shape", "[model_io][errors]") {
  TempDir dir;
  const std::string src = dir.File("src.safetensors");
  REQUIRE(SaveModel(src, kTiny, InitModel(kTiny, 1)).ok());
  std::vector<Tensor> ts = AllTensors(src);
  std::erase_if(ts, [](const Tensor& t) { return t.name == "h.1.ln_2.bias"; });
  const std::string p = dir.File("missing.safetensors");
  WriteTensors(p, ts);
  ExpectError(LoadModel(p, kTiny).status(), {p, "missing tensor 'h.1.ln_2.bias'", "(32)"});
}

TEST_CASE("A tensor of the wrong shape is rejected naming expected and found shapes", "[model_io][errors]") {
  TempDir dir;
  const std::string src = dir.File("src.safetensors");
  REQUIRE(SaveModel(src, kTiny, InitModel(kTiny, 1)).ok());
  std::vector<Tensor> ts = AllTensors(src);
  for (Tensor& t : ts) {
    if (t.name == "h.0.attn.c_attn.weight") t.shape = {96, 32};  // transposed (nn.Linear layout)
  }
  const std::string p = dir.File("shape.safetensors");
  WriteTensors(p, ts);
  ExpectError(LoadModel(p, kTiny).status(), {"h.0.attn.c_attn.weight", "(96, 32)", "expected (32, 96)"});
}

TEST_CASE("Stray tensors, another model's spec and bad layer buffers are rejected", "[model_io][errors]") {
  TempDir dir;
  const auto layers = InitModel(kTiny, 1);
  const std::string src = dir.File("src.safetensors");
  REQUIRE(SaveModel(src, kTiny, layers).ok());
  std::vector<Tensor> ts = AllTensors(src);
  ts.push_back({"h.2.ln_1.weight", {32}, std::vector<float>(32, 1.0f)});  // a third block
  const std::string p = dir.File("extra.safetensors");
  WriteTensors(p, ts);
  ExpectError(LoadModel(p, kTiny).status(), {"unexpected tensor 'h.2.ln_1.weight'"});

  ModelSpec other = kTiny;
  other.n_layer = 3;
  ExpectError(LoadModel(src, other).status(), {src, "\"n_layer\":2", "\"n_layer\":3"});

  auto short_layers = layers;
  short_layers[1].pop_back();
  ExpectError(SaveModel(dir.File("x.safetensors"), kTiny, short_layers), {"layer 1", "block"});
  short_layers.pop_back();
  ExpectError(SaveModel(dir.File("x.safetensors"), kTiny, short_layers), {"3 layer buffers", "4 layers"});
}

TEST_CASE("ModelSpec JSON round-trips and rejects bad fields", "[model_io]") {
  const ModelSpec s{50257, 1024, 768, 12, 12, 3072, false};
  CHECK(ModelSpecFromJson(ModelSpecToJson(s)).value() == s);
  ExpectError(ModelSpecFromJson(R"({"vocab_size":1})").status(), {"lacks field"});
  ExpectError(ModelSpecFromJson(R"({"vocab_size":256,"seq_len":32,"d_model":30,"n_layer":1,"n_head":4,"d_ff":8,)"
                                R"("tied_embeddings":true})")
                  .status(),
              {"n_head=4", "d_model=30"});
  ExpectError(ModelSpecFromJson(R"({"vocab_size":"x"})").status(), {"vocab_size", "not an integer"});
  ExpectError(ModelSpecFromJson("{").status(), {"not valid JSON"});
}

}  // namespace l2l

// Encoder (BERT) evaluation on classification rows. See tools/encoder_eval.h.
#include "tools/encoder_eval.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/backend.h"
#include "worker/data_loader.h"

namespace l2l::tools {
namespace {

// The flat head-layer view named `name` (layout order).
Result<const float*> HeadTensor(const worker::ReferenceTrainer& m, const std::string& name) {
  const LayerLayout& head = m.layouts().back();
  for (const ParamInfo& p : head.params) {
    if (p.name == name) return m.params().back().data() + p.offset;
  }
  return InvalidArgument("the model's head has no tensor " + name + " (not a classification model)");
}

}  // namespace

worker::MicroBatch RowsBatch(const ClassifyRows& rows, int64_t first, int64_t n) {
  const int64_t L = rows.max_len;
  worker::MicroBatch mb;
  mb.B = n;
  mb.T = L;
  const size_t b = static_cast<size_t>(first * L), e = static_cast<size_t>((first + n) * L);
  mb.inputs.assign(rows.ids.begin() + b, rows.ids.begin() + e);
  mb.token_types.assign(rows.type_ids.begin() + b, rows.type_ids.begin() + e);
  mb.attention_mask.assign(rows.attention.begin() + b, rows.attention.begin() + e);
  mb.targets.assign(e - b, kernels::kIgnoreTarget);
  for (int64_t r = 0; r < n; ++r) mb.targets[static_cast<size_t>(r * L)] = rows.labels[static_cast<size_t>(first + r)];
  return mb;
}

Result<ClassifyEval> EvaluateClassify(worker::ReferenceTrainer* model, const ClassifyRows& rows, int64_t batch) {
  const ModelSpec& spec = model->spec();
  const int64_t K = spec.num_labels, C = spec.d_model, L = rows.max_len, N = rows.rows();
  if (K <= 0) return InvalidArgument("not a classification model (num_labels 0)");
  if (N == 0) return InvalidArgument("no rows to evaluate");
  for (int64_t i = 0; i < N; ++i) {
    if (rows.labels[static_cast<size_t>(i)] >= K) {
      return OutOfRange("row " + std::to_string(i) + " has label " + std::to_string(rows.labels[static_cast<size_t>(i)]) +
                        ", outside the model's [0, num_labels=" + std::to_string(K) + ")");
    }
  }
  L2L_ASSIGN_OR_RETURN(const float* wp, HeadTensor(*model, "pooler.dense.weight"));  // (C, C) out, in
  L2L_ASSIGN_OR_RETURN(const float* bp, HeadTensor(*model, "pooler.dense.bias"));    // (C)
  L2L_ASSIGN_OR_RETURN(const float* wc, HeadTensor(*model, "classifier.weight"));    // (K, C)
  L2L_ASSIGN_OR_RETURN(const float* bc, HeadTensor(*model, "classifier.bias"));      // (K)
  ClassifyEval r;
  r.rows = N;
  r.logits.resize(static_cast<size_t>(N * K));
  std::vector<float> hidden, pooled(static_cast<size_t>(C));
  double loss_sum = 0.0;
  int64_t correct = 0, tp = 0, fp = 0, fn = 0;
  std::vector<int64_t> counts(static_cast<size_t>(K), 0);
  for (int64_t first = 0; first < N; first += batch) {
    const int64_t n = std::min(batch, N - first);
    const worker::MicroBatch mb = RowsBatch(rows, first, n);
    hidden.resize(static_cast<size_t>(n * L * C));
    L2L_RETURN_IF_ERROR(model->Hidden(mb, hidden.data()));
    for (int64_t b = 0; b < n; ++b) {
      const float* h0 = hidden.data() + b * L * C;  // the [CLS] position
      for (int64_t o = 0; o < C; ++o) {
        double s = bp[o];
        for (int64_t i = 0; i < C; ++i) s += static_cast<double>(wp[o * C + i]) * h0[i];
        pooled[static_cast<size_t>(o)] = static_cast<float>(std::tanh(s));
      }
      float* lg = r.logits.data() + (first + b) * K;
      for (int64_t k = 0; k < K; ++k) {
        double s = bc[k];
        for (int64_t i = 0; i < C; ++i) s += static_cast<double>(wc[k * C + i]) * pooled[static_cast<size_t>(i)];
        lg[k] = static_cast<float>(s);
      }
      const int32_t y = rows.labels[static_cast<size_t>(first + b)];
      const int64_t pred = std::max_element(lg, lg + K) - lg;
      double mx = lg[0], z = 0.0;
      for (int64_t k = 1; k < K; ++k) mx = std::max<double>(mx, lg[k]);
      for (int64_t k = 0; k < K; ++k) z += std::exp(lg[k] - mx);
      loss_sum += std::log(z) + mx - lg[y];
      correct += pred == y;
      counts[static_cast<size_t>(y)]++;
      if (K == 2) {
        tp += pred == 1 && y == 1;
        fp += pred == 1 && y == 0;
        fn += pred == 0 && y == 1;
      }
    }
  }
  r.loss = loss_sum / static_cast<double>(N);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(N);
  r.majority_label = std::max_element(counts.begin(), counts.end()) - counts.begin();
  r.majority = static_cast<double>(counts[static_cast<size_t>(r.majority_label)]) / static_cast<double>(N);
  if (K == 2) {
    r.precision = tp + fp > 0 ? static_cast<double>(tp) / static_cast<double>(tp + fp) : 0.0;
    r.recall = tp + fn > 0 ? static_cast<double>(tp) / static_cast<double>(tp + fn) : 0.0;
    r.f1 = 2 * tp + fp + fn > 0 ? 2.0 * static_cast<double>(tp) / static_cast<double>(2 * tp + fp + fn) : 0.0;
  }
  return r;
}

Result<MlmEval> EvaluateMlm(worker::ReferenceTrainer* model, const ClassifyRows& rows, const MlmConfig& mlm,
                            uint64_t seed, int64_t batch) {
  const ModelSpec& spec = model->spec();
  const int64_t V = spec.vocab_size, L = rows.max_len, N = rows.rows();
  if (spec.num_labels != 0) return InvalidArgument("not a masked-LM model (num_labels " + std::to_string(spec.num_labels) + ")");
  if (!(mlm.first_word_id < V && mlm.mask_id < V)) {
    return InvalidArgument("--mask-id / --first-word-id must be below the vocabulary size " + std::to_string(V));
  }
  MlmEval r;
  double loss_sum = 0.0;
  int64_t correct = 0;
  std::vector<float> probs;
  for (int64_t first = 0; first < N; first += batch) {
    const int64_t n = std::min(batch, N - first);
    worker::MicroBatch mb = RowsBatch(rows, first, n);
    std::vector<int32_t> ids = mb.inputs;
    for (int64_t b = 0; b < n; ++b) {
      worker::MaskMlmRow(mlm, V, seed, /*epoch=*/0, first + b, ids.data() + b * L,
                         rows.attention.data() + (first + b) * L, L, mb.inputs.data() + b * L,
                         mb.targets.data() + b * L);
    }
    probs.resize(static_cast<size_t>(n * L * V));
    L2L_RETURN_IF_ERROR(model->Probs(mb, probs.data()));
    for (int64_t i = 0; i < n * L; ++i) {
      const int32_t y = mb.targets[static_cast<size_t>(i)];
      if (y == kernels::kIgnoreTarget) continue;
      const float* p = probs.data() + i * V;
      loss_sum -= std::log(std::max(static_cast<double>(p[y]), 1e-30));
      correct += (std::max_element(p, p + V) - p) == y;
      ++r.masked;
    }
  }
  if (r.masked == 0) return InvalidArgument("no position was masked (rows too short or mlm.first_word_id too high)");
  r.loss = loss_sum / static_cast<double>(r.masked);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(r.masked);
  return r;
}

Result<std::vector<float>> MeanPooledEmbeddings(worker::ReferenceTrainer* model, const ClassifyRows& rows,
                                                int64_t batch) {
  const int64_t C = model->spec().d_model, L = rows.max_len, N = rows.rows();
  std::vector<float> out(static_cast<size_t>(N * C)), hidden;
  for (int64_t first = 0; first < N; first += batch) {
    const int64_t n = std::min(batch, N - first);
    worker::MicroBatch mb = RowsBatch(rows, first, n);
    std::fill(mb.targets.begin(), mb.targets.end(), kernels::kIgnoreTarget);
    hidden.resize(static_cast<size_t>(n * L * C));
    L2L_RETURN_IF_ERROR(model->Hidden(mb, hidden.data()));
    for (int64_t b = 0; b < n; ++b) {
      std::vector<double> sum(static_cast<size_t>(C), 0.0);
      int64_t count = 0;
      for (int64_t t = 0; t < L; ++t) {
        if (rows.attention[static_cast<size_t>((first + b) * L + t)] == 0) continue;
        const float* h = hidden.data() + (b * L + t) * C;
        for (int64_t c = 0; c < C; ++c) sum[static_cast<size_t>(c)] += h[c];
        ++count;
      }
      for (int64_t c = 0; c < C; ++c) {
        out[static_cast<size_t>((first + b) * C + c)] = static_cast<float>(sum[static_cast<size_t>(c)] / std::max<int64_t>(count, 1));
      }
    }
  }
  return out;
}

}  // namespace l2l::tools

// Evaluation of encoder (BERT) models on classification rows (common/formats/rows_file.h), on the
// CPU reference trainer's forward pass:
//   - classification (num_labels > 0): mean cross-entropy, accuracy, and for two classes
//     precision / recall / F1 of the positive class 1 (as GLUE's MRPC reports F1), plus
//     the accuracy of always predicting the rows' most frequent label;
//   - masked LM (num_labels 0): the rows masked as the data loader masks them in epoch 0
//     (worker::MaskMlmRow with the given seed), mean cross-entropy and accuracy (argmax ==
//     original id) over the masked positions;
//   - sentence embeddings: the attention-mask-weighted mean of the last hidden state.
// Logits of the classification head are computed here on the host from the last hidden
// state and the head's weights (pooler dense + tanh, classifier), the head's definition.
//
// Thread-safety: free functions; the trainer is used by one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/formats/rows_file.h"
#include "common/status.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::tools {

// Rows [first, first + n) as a micro-batch (targets: the label at position 0, -1 elsewhere).
worker::MicroBatch RowsBatch(const ClassifyRows& rows, int64_t first, int64_t n);

struct ClassifyEval {
  int64_t rows = 0;
  double loss = 0.0;        // mean cross-entropy (natural log) over the rows
  double accuracy = 0.0;    // fraction with argmax(logits) == label
  double majority = 0.0;    // accuracy of always predicting the most frequent label
  int64_t majority_label = 0;
  // Two classes only (else 0): positive class 1.
  double precision = 0.0, recall = 0.0, f1 = 0.0;
  std::vector<float> logits;  // (rows, num_labels)
};
Result<ClassifyEval> EvaluateClassify(worker::ReferenceTrainer* model, const ClassifyRows& rows, int64_t batch);

struct MlmEval {
  int64_t masked = 0;       // positions predicted
  double loss = 0.0;        // mean cross-entropy over them
  double accuracy = 0.0;    // fraction with argmax == the original id
};
Result<MlmEval> EvaluateMlm(worker::ReferenceTrainer* model, const ClassifyRows& rows, const MlmConfig& mlm,
                            uint64_t seed, int64_t batch);

// (rows, d_model): the attention-mask-weighted mean of the last hidden state per row.
Result<std::vector<float>> MeanPooledEmbeddings(worker::ReferenceTrainer* model, const ClassifyRows& rows,
                                                int64_t batch);

}  // namespace l2l::tools

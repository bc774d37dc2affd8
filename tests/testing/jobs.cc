// See jobs.h.
#include "tests/testing/jobs.h"

namespace l2l::testing {

ModelSpec GptModel(const GptShape& shape) {
  ModelSpec m;
  m.vocab_size = shape.vocab_size;
  m.seq_len = shape.seq_len;
  m.d_model = shape.d_model;
  m.n_layer = shape.n_layer;
  m.n_head = shape.n_head;
  m.d_ff = shape.d_ff;
  m.tied_embeddings = shape.tied_embeddings;
  return m;
}

ModelSpec LlamaModel(const LlamaShape& shape) {
  ModelSpec m;
  m.family = ModelFamily::kLlama;
  m.vocab_size = shape.vocab_size;
  m.seq_len = shape.seq_len;
  m.d_model = shape.d_model;
  m.n_layer = shape.n_layer;
  m.n_head = shape.n_head;
  m.n_kv_heads = shape.n_kv_heads;
  m.d_ff = shape.d_ff;
  m.tied_embeddings = shape.tied_embeddings;
  return m;
}

ModelSpec BertModel(const BertShape& shape, int64_t num_labels) {
  ModelSpec m;
  m.family = ModelFamily::kBert;
  m.vocab_size = shape.vocab_size;
  m.seq_len = shape.seq_len;
  m.d_model = shape.d_model;
  m.n_layer = shape.n_layer;
  m.n_head = shape.n_head;
  m.d_ff = shape.d_ff;
  m.type_vocab_size = shape.type_vocab_size;
  m.layer_norm_eps = shape.layer_norm_eps;
  m.num_labels = num_labels;
  m.tied_embeddings = num_labels == 0;
  return m;
}

JobConfig GptJob(const GptShape& shape, const TrainKnobs& k) {
  JobConfig job;
  job.model = GptModel(shape);
  if (k.steps) job.train.steps = *k.steps;
  if (k.micro_batch_size) job.train.micro_batch_size = *k.micro_batch_size;
  if (k.micro_batches) job.train.micro_batches = *k.micro_batches;
  if (k.seq_len) job.train.seq_len = *k.seq_len;
  if (k.seed) job.train.seed = *k.seed;
  if (k.clip) job.train.clip = *k.clip;
  if (k.lr) job.optim.lr = *k.lr;
  if (k.warmup_steps) job.optim.warmup_steps = *k.warmup_steps;
  if (k.total_steps) job.optim.total_steps = *k.total_steps;
  if (k.eps) job.optim.eps = *k.eps;
  if (k.weight_decay) job.optim.weight_decay = *k.weight_decay;
  if (k.grad_clip) job.optim.grad_clip = *k.grad_clip;
  return job;
}

}  // namespace l2l::testing

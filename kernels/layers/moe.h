// The mixture-of-experts MLP of Hugging Face's MixtralSparseMoeBlock, independent of the
// attention around it (a family calls it on its post-attention norm's output): a router
// (E, C) gives each token E logits; softmax over them in fp32; the token runs through the
// k experts of largest probability (ties: the lower index), each a SwiGLU MLP
// (w1 = gate, w3 = up, w2 = down, nn.Linear layouts), and the outputs are summed weighted
// by those k probabilities, renormalised to sum 1 when spec.norm_topk_prob.
//
// Compute: the router product runs on the backend; its logits (N, E) come to the host,
// which chooses the experts and builds each expert's token list (in torch.where's order:
// top-k slot, then token); per expert, in order 0..E-1: gather its rows (GatherRows),
// gate|up product, SwiGLU, down product, and add the weighted rows into the output
// (ScatterAddRows), as the Hugging Face loop and its index_add_ do. The backward
// recomputes the routing and each expert's forward from the saved norm output, then runs
// the expert's backward; the routing weights' gradient (RowDot of the output gradient and
// the expert output) goes back through the renormalisation and the softmax on the host.
//
// The auxiliary load-balancing loss (spec.output_router_logits): Hugging Face's
// load_balancing_loss_func over the router logits of all blocks of a micro-batch,
//   aux = E * sum_e (count_e / R) * (prob_sum_e / R),
// R = rows over all blocks (n_layer * B * T), count_e = top-k selections of e, prob_sum_e =
// the summed softmax probabilities of e. The counts are not differentiated (one_hot), so
// d aux / d p[r, e] = E * count_e / R^2 in every block: the forward of every block adds
// its counts and sums into the micro-batch's MoeStats, the backward reads the totals.
//
// Thread-safety: as the Backend (one thread); MoeStats belongs to one micro-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::layers {

// Routing statistics of one micro-batch, filled by the forward of each MoE block (passed
// as SequenceInputs::moe) and read by its backward.
struct MoeStats {
  std::vector<int64_t> counts;    // (E) top-k selections, summed over rows and blocks
  std::vector<double> prob_sums;  // (E) router probabilities, summed over rows and blocks
  int64_t rows = 0;               // router rows seen: blocks x tokens
  // (n_layer x E): 1 when expert e of block b got at least one token (its weights then
  // have a gradient: Hugging Face runs only those experts, so the others' .grad is None).
  std::vector<uint8_t> touched;
  // d(the caller's loss) / d(aux): router_aux_loss_coef * the micro-batch's loss scale.
  // Set before the backward; used when spec.output_router_logits.
  float aux_grad_scale = 0.0f;

  // Empties the statistics for a micro-batch of `spec` (sizes from the spec).
  void Reset(const ModelSpec& spec);
};

// The auxiliary loss of the blocks the stats have seen (0 when none): as above.
double MoeAuxLoss(const ModelSpec& spec, const MoeStats& stats);

// The weights (or, for the backward, gradients) of one MoE block: router (E, C), and per
// expert a (2F, C) gate|up matrix (w1 then w3, adjacent) and a (C, F) down matrix.
struct MoeWeights {
  float* router = nullptr;
  std::vector<float*> gate_up;
  std::vector<float*> down;
};

// Device buffers the MoE MLP needs for N rows beside the family's (fch (N,2F), fch_gelu
// (N,F), g0, g1 (N, >= 2F)): allocated into ws by AllocMoeWorkspace.
Status AllocMoeWorkspace(kernels::Backend* be, const ModelSpec& spec, int64_t N, LayerWorkspace* ws);

// y (N,C) = the MoE MLP of x (N,C) (overwritten). stats (may be null: not recorded):
// counts, probability sums, rows and touched[block] += this call's routing.
void MoeForward(kernels::Backend& be, const ModelSpec& spec, const MoeWeights& w, const float* x, float* y,
                int64_t N, LayerWorkspace& ws, MoeStats* stats, int64_t block);

// dx (N,C) += d/dx of (dy . MoE(x)) (+ the aux loss's share through this block's router
// when spec.output_router_logits: REQUIRES stats filled by the forward of every block);
// dw += the weights' gradients (experts without tokens get nothing).
void MoeBackward(kernels::Backend& be, const ModelSpec& spec, const MoeWeights& w, const MoeWeights& dw,
                 const float* x, const float* dy, float* dx, int64_t N, LayerWorkspace& ws, const MoeStats* stats);

}  // namespace l2l::layers

// Rotary position embeddings' inverse frequencies, shared by the families that rotate q and
// k (llama.cc, gemma3.cc). Pure function of its arguments.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_spec.h"

namespace l2l::layers {

// The inverse frequencies (dim/2) of rotary embeddings of head size `dim` with base `theta`
// and `scaling`, as transformers' modeling_rope_utils.py computes them (default, linear,
// llama3), in double precision.
std::vector<double> RopeInverseFrequencies(int64_t dim, double theta, const RopeScaling& scaling);

}  // namespace l2l::layers

// Rotary inverse frequencies (see rope.h).
#include "kernels/layers/rope.h"

#include <cmath>

namespace l2l::layers {

std::vector<double> RopeInverseFrequencies(int64_t dim, double theta, const RopeScaling& r) {
  std::vector<double> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    inv[i] = 1.0 / std::pow(theta, double(2 * i) / double(dim));
  }
  switch (r.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      for (double& f : inv) f /= r.factor;
      break;
    case RopeScalingType::kLlama3: {
      const double old_len = double(r.original_max_position_embeddings);
      const double low_wavelen = old_len / r.low_freq_factor;
      const double high_wavelen = old_len / r.high_freq_factor;
      constexpr double kPi = 3.14159265358979323846;
      for (double& f : inv) {
        const double wavelen = 2.0 * kPi / f;
        const double scaled = wavelen > low_wavelen ? f / r.factor : f;
        const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        if (medium) {
          const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f = (1.0 - smooth) * scaled / r.factor + smooth * scaled;
        } else {
          f = scaled;
        }
      }
      break;
    }
  }
  return inv;
}

}  // namespace l2l::layers

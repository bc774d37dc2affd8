// Tests for common/adamw: the AdamW update against a double-precision transcription of
// the algorithm (Loshchilov & Hutter, as torch.optim.AdamW documents it), the learning
// rate schedule at chosen steps (values worked out by hand below), and the clip
// coefficient (torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6)); a step's
// AdamWStepArgs formed from the job's OptimizerConfig, and their wire form
// (proto/adamw_proto.h) field for field.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/adamw.h"
#include "proto/adamw_proto.h"

namespace l2l {
namespace {

TEST_CASE("AdamWStep matches the double-precision AdamW formula over several steps", "[adamw]") {
  const size_t n = 257;
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  for (double wd : {0.0, 0.1}) {
    for (float grad_scale : {1.0f, 0.25f}) {
      std::vector<float> p(n), m(n, 0.f), v(n, 0.f), g(n);
      std::vector<double> pd(n), md(n, 0.0), vd(n, 0.0);
      for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<float>(std::sin(0.37 * i) * 0.5);
        pd[i] = p[i];
      }
      for (int t = 1; t <= 5; ++t) {
        for (size_t i = 0; i < n; ++i) {
          // Different magnitudes per element, including tiny gradients where eps matters.
          g[i] = static_cast<float>(std::cos(1.3 * i + t) * std::pow(10.0, -static_cast<double>(i % 9)));
        }
        AdamWStep(p.data(), g.data(), m.data(), v.data(), n,
                  {.lr = static_cast<float>(lr), .beta1 = static_cast<float>(b1), .beta2 = static_cast<float>(b2),
                   .eps = static_cast<float>(eps), .weight_decay = static_cast<float>(wd), .t = t,
                   .grad_scale = grad_scale});
        for (size_t i = 0; i < n; ++i) {
          const double gi = static_cast<double>(g[i]) * grad_scale;
          pd[i] *= 1.0 - lr * wd;
          md[i] = b1 * md[i] + (1.0 - b1) * gi;
          vd[i] = b2 * vd[i] + (1.0 - b2) * gi * gi;
          const double mhat = md[i] / (1.0 - std::pow(b1, t));
          const double vhat = vd[i] / (1.0 - std::pow(b2, t));
          pd[i] -= lr * mhat / (std::sqrt(vhat) + eps);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        INFO("wd=" << wd << " scale=" << grad_scale << " i=" << i);
        // fp32 rounding in ~10 ops per step over 5 steps: a few ulps of |p| plus the
        // update size; updates are ~lr, so 1e-6 absolute is far above rounding noise
        // and far below any formula error (which would be ~lr = 3e-3).
        REQUIRE(std::abs(p[i] - pd[i]) <= 1e-6 + 1e-6 * std::abs(pd[i]));
        // m can cancel towards 0 (signs alternate), so bound its error by the gradient
        // magnitude of element i rather than by |m|.
        const double gmag = std::pow(10.0, -static_cast<double>(i % 9)) * grad_scale;
        REQUIRE(std::abs(m[i] - md[i]) <= 1e-6 * gmag);
        REQUIRE(std::abs(v[i] - vd[i]) <= 1e-6 * gmag * gmag);
      }
    }
  }
}

TEST_CASE("AdamWStep's first step moves each parameter by about lr*sign(grad)", "[adamw]") {
  // After one step with zero moments, mhat = g and vhat = g^2, so the update is
  // lr * g / (|g| + eps): a fact of the algorithm, independent of the implementation.
  float p[3] = {1.f, -2.f, 0.5f}, g[3] = {0.3f, -5.f, 1e-3f}, m[3] = {}, v[3] = {};
  AdamWStep(p, g, m, v, 3,
            {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.f, .t = 1, .grad_scale = 1.f});
  CHECK(p[0] == Approx(0.99f).epsilon(1e-6));
  CHECK(p[1] == Approx(-1.99f).epsilon(1e-6));
  CHECK(p[2] == Approx(0.49f).epsilon(1e-5));
  // Decoupled weight decay with zero gradient: p *= (1 - lr*wd) exactly, nothing else.
  float q[1] = {2.f}, z[1] = {0.f}, mq[1] = {}, vq[1] = {};
  AdamWStep(q, z, mq, vq, 1,
            {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.5f, .t = 1, .grad_scale = 1.f});
  CHECK(q[0] == Approx(2.f * (1 - 0.05f)).epsilon(1e-7));
}

TEST_CASE("LearningRate warms up linearly then follows a cosine to min_lr", "[adamw]") {
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.min_lr_ratio = 0.1f;
  c.warmup_steps = 10;
  c.total_steps = 110;
  // Warmup: (step+1)/10 * lr.
  CHECK(LearningRate(c, 0) == Approx(1e-4).epsilon(1e-6));
  CHECK(LearningRate(c, 4) == Approx(5e-4).epsilon(1e-6));
  CHECK(LearningRate(c, 9) == Approx(1e-3).epsilon(1e-6));
  // Cosine over steps 10..110: start at lr, halfway (60) at (lr+min)/2 = 5.5e-4,
  // a quarter in (35) at min + (lr-min)*(1+cos(pi/4))/2 = 1e-4 + 9e-4*0.853553390593 = 8.68198052e-4.
  CHECK(LearningRate(c, 10) == Approx(1e-3).epsilon(1e-6));
  CHECK(LearningRate(c, 35) == Approx(8.68198052e-4).epsilon(1e-6));
  CHECK(LearningRate(c, 60) == Approx(5.5e-4).epsilon(1e-6));
  CHECK(LearningRate(c, 110) == Approx(1e-4).epsilon(1e-6));
  CHECK(LearningRate(c, 500) == Approx(1e-4).epsilon(1e-6));
  // total_steps = 0: constant after warmup.
  c.total_steps = 0;
  CHECK(LearningRate(c, 3) == Approx(4e-4).epsilon(1e-6));
  CHECK(LearningRate(c, 1000) == Approx(1e-3).epsilon(1e-6));
  // No warmup.
  c.warmup_steps = 0;
  c.total_steps = 100;
  CHECK(LearningRate(c, 0) == Approx(1e-3).epsilon(1e-6));
  CHECK(LearningRate(c, 50) == Approx(5.5e-4).epsilon(1e-6));
}

TEST_CASE("ClipCoefficient clips like torch clip_grad_norm_", "[adamw]") {
  CHECK(ClipCoefficient(2.0, 1.0f) == Approx(1.0 / (2.0 + 1e-6)).epsilon(1e-7));
  CHECK(ClipCoefficient(10.0, 0.5f) == Approx(0.05).epsilon(1e-6));
  CHECK(ClipCoefficient(0.5, 1.0f) == 1.0f);
  CHECK(ClipCoefficient(0.0, 1.0f) == 1.0f);
  CHECK(ClipCoefficient(1e9, 0.0f) == 1.0f);   // disabled
  CHECK(ClipCoefficient(1e9, -1.0f) == 1.0f);  // disabled
  const float x[4] = {1.f, -2.f, 3.f, 0.5f};
  CHECK(SumSquares(x, 4) == 14.25);
}

TEST_CASE("AdamWStepArgsAt forms a step's arguments from the job's optimizer config", "[adamw]") {
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.warmup_steps = 10;
  c.beta1 = 0.8f;
  c.beta2 = 0.99f;
  c.eps = 1e-6f;
  c.weight_decay = 0.05f;
  const AdamWStepArgs a = AdamWStepArgsAt(c, 4, 0.25f);
  CHECK(a.lr == LearningRate(c, 4));
  CHECK(a.beta1 == 0.8f);
  CHECK(a.beta2 == 0.99f);
  CHECK(a.eps == 1e-6f);
  CHECK(a.weight_decay == 0.05f);
  CHECK(a.t == 5);
  CHECK(a.grad_scale == 0.25f);
  CHECK(WithDecay(a, true).weight_decay == 0.05f);
  const AdamWStepArgs nd = WithDecay(a, false);
  CHECK(nd.weight_decay == 0.0f);
  CHECK((nd.lr == a.lr && nd.beta1 == a.beta1 && nd.beta2 == a.beta2 && nd.eps == a.eps && nd.t == a.t &&
         nd.grad_scale == a.grad_scale));
}

TEST_CASE("AdamWStepArgs cross the wire (data.proto AdamWStep) bit for bit", "[adamw]") {
  const AdamWStepArgs a{.lr = 3.0e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                        .t = int64_t{1} << 40, .grad_scale = 1.0f / 3.0f};
  data::v1::AdamWStep msg;
  ToProto(a, &msg);
  data::v1::AdamWStep wire;
  REQUIRE(wire.ParseFromString(msg.SerializeAsString()));
  const AdamWStepArgs b = FromProto(wire);
  CHECK(b.lr == a.lr);
  CHECK(b.beta1 == a.beta1);
  CHECK(b.beta2 == a.beta2);
  CHECK(b.eps == a.eps);
  CHECK(b.weight_decay == a.weight_decay);
  CHECK(b.t == a.t);
  CHECK(b.grad_scale == a.grad_scale);
}

}  // namespace
}  // namespace l2l

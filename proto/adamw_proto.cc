// AdamWStepArgs <-> data.proto AdamWStep. See adamw_proto.h.
#include "proto/adamw_proto.h"

namespace l2l {

void ToProto(const AdamWStepArgs& a, data::v1::AdamWStep* out) {
  out->set_lr(a.lr);
  out->set_beta1(a.beta1);
  out->set_beta2(a.beta2);
  out->set_eps(a.eps);
  out->set_weight_decay(a.weight_decay);
  out->set_t(a.t);
  out->set_grad_scale(a.grad_scale);
}

AdamWStepArgs FromProto(const data::v1::AdamWStep& p) {
  AdamWStepArgs a;
  a.lr = p.lr();
  a.beta1 = p.beta1();
  a.beta2 = p.beta2();
  a.eps = p.eps();
  a.weight_decay = p.weight_decay();
  a.t = p.t();
  a.grad_scale = p.grad_scale();
  return a;
}

}  // namespace l2l

// The JobStart of a job whose model comes from a pretrained file (model.from): the
// store's masters are filled layer by layer from the file (one layer's fp32 values plus
// one layer of zeros resident at a time, so a store on the SSD tier fills without holding
// the model), moments start at zero. Rollbacks to the initial state re-read the file.
//
// Thread-safety: the returned loader may run on any thread; Pretrained is immutable.
#pragma once

#include <memory>

#include "common/pretrained/pretrained.h"
#include "eps_server/eps_core.h"

namespace l2l::eps {

JobStart ImportStart(std::shared_ptr<const Pretrained> model);

}  // namespace l2l::eps

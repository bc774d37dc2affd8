// The one conversion between common/adamw.h AdamWStepArgs and its wire form,
// proto/data.proto AdamWStep (inside TakeUpdateReply): the daemon's TakeUpdate handler
// (eps_server/grpc_server.cc) writes it, the worker's client (worker/eps_client_grpc.cc)
// reads it. Field for field; no validation (the values are the daemon's own).
//
// Thread-safety: pure functions.
#pragma once

#include "common/adamw.h"
#include "proto/data.pb.h"

namespace l2l {

void ToProto(const AdamWStepArgs& a, data::v1::AdamWStep* out);
AdamWStepArgs FromProto(const data::v1::AdamWStep& p);

}  // namespace l2l

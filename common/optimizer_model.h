// Performance model of the interleaved GPU/CPU optimizer: given the daemon's CPU AdamW
// and cast rates, a device's AdamW rate, the host<->device bandwidths and the backward
// time and size of every layer, it predicts a relay step's time for a given split of the
// update between the daemon (CPU) and the workers' devices, and picks the split.
//
// The timeline it simulates (one step's backward and update, layers in update order
// L-1 .. 0, which is the order backward produces their gradients):
//  * The device runs layer l's backward; a layer assigned to the device then runs its
//    AdamW on the same device stream right after its backward (it delays the backward of
//    the next layers by params/U_g), once its fp32 p, m, v (12 bytes/param) have crossed
//    the H2D link. That copy starts when the layer's backward starts (one layer of
//    optimizer state is resident besides the relay's working set) and the link carries
//    one layer at a time.
//  * The updated p, m, v cross the D2H link (12 bytes/param, one layer at a time); the
//    daemon then casts the master to the publish dtype (params/D_c of CPU time).
//  * A layer the daemon keeps is updated and cast on the CPU (params/U_c + params/D_c)
//    once its gradient has arrived. The CPU runs its jobs one at a time in the order they
//    become ready.
//  * Step time = forward + max(device done, CPU done, last D2H done). The part after the
//    pure backward is the exposed update tail.
// Assumptions (what it does not model): the optimizer's copies share the PCIe links with
// the relay's own weight fetches and gradient pushes without slowing them (seed 003
// observes the links idle for most of backward); rates are constant per parameter.
//
// Policy: a device whose AdamW rate is not above the CPU's never takes updates. Its
// update time comes out of the relay's compute, which the rest of the system exists to
// keep busy; the pure-parallelism gain of a slower device is below this model's accuracy.
//
// Thread-safety: pure functions over caller-owned values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace l2l {

// Measured or given rates. Parameter rates are fp32 parameters per second; bandwidths
// bytes per second. +infinity is allowed for a rate or bandwidth (free); 0 for the device
// update rate means there is no device that can take updates.
struct OptimizerRates {
  double cpu_update_params_per_s = 0;  // U_c: AdamW on the daemon, all its threads
  double cpu_cast_params_per_s = 0;    // D_c: fp32 -> publish dtype on the daemon
  double gpu_update_params_per_s = 0;  // U_g: AdamW on the device taking updates
  double h2d_bytes_per_s = 0;          // host -> device, pinned
  double d2h_bytes_per_s = 0;          // device -> host, pinned
};

// One layer as the model sees it.
struct LayerCost {
  int64_t params = 0;      // fp32 parameters updated
  double backward_s = 0;   // the relay's backward of this layer (fetch, recompute, push)
};

struct OptimizerModelInput {
  OptimizerRates rates;
  std::vector<LayerCost> layers;  // by layer index 0 .. L-1 (update order is L-1 .. 0)
  double forward_s = 0;           // the step's forward, added to the prediction
};

// A split of the update and its predicted cost.
struct InterleavePlan {
  std::vector<bool> on_gpu;      // per layer index: the device updates it
  double gpu_fraction = 0;       // share of parameters the device updates
  double step_s = 0;             // predicted step time with this split
  double tail_s = 0;             // of which exposed after the pure backward
  double daemon_only_step_s = 0; // predicted step time with the daemon updating all
};

// Checks the input: rates and bandwidths > 0 (device rate >= 0), layers non-empty with
// params > 0 and backward_s >= 0, forward_s >= 0. Errors name the field.
Status ValidateOptimizerModelInput(const OptimizerModelInput& in);

// Predicted step time for the split `on_gpu` (size L); *tail_s (optional) receives the
// exposed update tail. REQUIRES: a valid input; on_gpu.size() == layers.size(); a device
// rate > 0 when any layer is on the device.
double PredictStepTime(const OptimizerModelInput& in, const std::vector<bool>& on_gpu,
                       double* tail_s = nullptr);

// The layers a fixed fraction (of parameters) hands to the device, spread evenly over
// the update order as seed 003's stride does: walking L-1 .. 0, a layer goes to the
// device while the device's share stays within half a layer of `fraction`. 0 gives none,
// 1 gives all. REQUIRES: 0 <= fraction <= 1.
std::vector<bool> SpreadLayers(const std::vector<LayerCost>& layers, double fraction);

// The split for a fixed fraction, with its prediction.
Result<InterleavePlan> PlanFixedFraction(const OptimizerModelInput& in, double fraction);

// The split the model predicts fastest among: none; every evenly spread fraction
// m/L (m = 1..L); the last m layers of the update order. Ties (within 1e-9 relative) go
// to the smaller device share (less PCIe traffic). Fraction 0 whenever the device rate
// is not above the CPU's.
Result<InterleavePlan> PlanAuto(const OptimizerModelInput& in);

// Seed 003's closed form (its Equation 1) for the update stride k: the CPU updates k
// subgroups per one on the device, with U_c, D_c, U_g as above and B the H2D/D2H rate in
// fp32 parameters per second (the seed's units), when the CPU's fp16 copies also cross
// the H2D link. Returns +infinity when the denominator is <= 0 (the CPU side can never
// balance: give the device everything it can take).
double SeedUpdateStride(double cpu_update_params_per_s, double cpu_cast_params_per_s,
                        double gpu_update_params_per_s, double link_params_per_s);

// One line for the job-start log: the inputs and the choice.
std::string DescribePlan(const OptimizerModelInput& in, const InterleavePlan& plan);

}  // namespace l2l

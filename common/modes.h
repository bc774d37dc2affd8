// Modes: the closed sets of choices a job, the daemon and a worker are configured with
// (training mode, gradient clipping, stash placement, transport, what to do when a
// worker is lost, a worker's state), as enums. Each enum has one ToString / Parse pair
// next to it. Text exists only at the edges: YAML, command-line flags and proto string
// fields are parsed here once; everything behind them compares enums. (The publish
// dtype is common/dtype.h's DType; a worker's rejoin reason is common/status.h's
// RejoinReason, because it travels inside a Status.)
//
// Parse accepts exactly the names ToString produces and returns INVALID_ARGUMENT
// "'<text>' is not one of: a, b, c" otherwise; callers add the key ("train.mode=...").
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace l2l {

// train.mode: "sync" (every step uses every layer at exactly its version) or "lockfree"
// (a layer's version may lag the step by up to train.staleness).
enum class TrainMode { kSync, kLockfree };
const char* ToString(TrainMode m);
Result<TrainMode> ParseTrainMode(std::string_view s);

// train.clip: "none", "per_layer" (each layer's gradient norm on its own) or "global"
// (one norm over the whole model).
enum class ClipMode { kNone, kPerLayer, kGlobal };
const char* ToString(ClipMode m);
Result<ClipMode> ParseClipMode(std::string_view s);

// train.stash: where a worker keeps the layer outputs between forward and backward:
// "device" (backend memory) or "host" (host memory; page-locked on a GPU).
enum class StashPlacement { kDevice, kHost };
const char* ToString(StashPlacement p);
Result<StashPlacement> ParseStashPlacement(std::string_view s);

// train.recompute: what the backward does with a block's forward intermediates (norm
// outputs, qkv, attention probabilities, MLP pre-activations): "always" recompute them
// from the stashed block input (least memory), "never" keep them from the forward for
// every block and micro-batch (fails at start if they do not fit
// train.activation_budget_mb), "auto" keep them for as many blocks as fit the budget and
// recompute the rest.
enum class RecomputeMode { kAlways, kNever, kAuto };
const char* ToString(RecomputeMode m);
Result<RecomputeMode> ParseRecomputeMode(std::string_view s);

// How a worker exchanges layers and gradients with the EPS: "shm" (shared memory, same
// host) or "grpc"; "auto" is a request or policy only (shm where possible), never the
// transport a registration settles on.
enum class Transport { kAuto, kShm, kGrpc };
const char* ToString(Transport t);
Result<Transport> ParseTransport(std::string_view s);

// The daemon's on_worker_loss: "pause" (the job waits for the lost worker to rejoin, or
// for Resume) or "continue" (the other workers go on without it).
enum class OnWorkerLoss { kPause, kContinue };
const char* ToString(OnWorkerLoss w);
Result<OnWorkerLoss> ParseOnWorkerLoss(std::string_view s);

// A registered worker, as the EPS sees it: "active"; "lost" (missed heartbeats); "left"
// (Deregister); "rejoin" (its step was abandoned: it must re-register).
enum class WorkerState { kActive, kLost, kLeft, kRejoin };
const char* ToString(WorkerState s);
Result<WorkerState> ParseWorkerState(std::string_view s);

// The job's `task`: what a training row is and what the head learns from it.
//   "lm": next-token prediction on a token stream (decoders; the default);
//   "mlm": masked-language modelling on rows (family bert, model.num_labels 0): a seeded
//          15% of each row's word tokens are masked and predicted;
//   "classify": sequence classification on labelled rows (family bert, num_labels > 0).
enum class Task { kLm, kMlm, kClassify };
const char* ToString(Task t);
Result<Task> ParseTask(std::string_view s);

// optim.gpu_fraction: the share of the AdamW update (in parameters) the workers' devices
// run instead of the daemon: "auto" (the performance model in common/optimizer_model.h
// picks it from measured rates) or a number in [0, 1] (0: the daemon updates everything).
// Not an enum, but parsed once here like one.
struct GpuFraction {
  bool automatic = true;  // "auto"
  double value = 0;       // the fixed share when !automatic, in [0, 1]
  bool operator==(const GpuFraction&) const = default;
};
std::string ToString(GpuFraction f);
// Accepts "auto" or a decimal number in [0, 1]; anything else (text, NaN, 1.5, -0.1) is
// INVALID_ARGUMENT saying what is accepted.
Result<GpuFraction> ParseGpuFraction(std::string_view s);

}  // namespace l2l

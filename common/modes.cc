// The name tables of the mode enums (common/name_table.h: one table per enum, read by
// both its ToString and its Parse). See modes.h.
#include "common/modes.h"

#include <charconv>
#include <cmath>
#include <string>
#include <utility>

#include "common/name_table.h"

namespace l2l {
namespace {

constexpr std::pair<TrainMode, const char*> kTrainModes[] = {
    {TrainMode::kSync, "sync"}, {TrainMode::kLockfree, "lockfree"}};
constexpr std::pair<ClipMode, const char*> kClipModes[] = {
    {ClipMode::kNone, "none"}, {ClipMode::kPerLayer, "per_layer"}, {ClipMode::kGlobal, "global"}};
constexpr std::pair<StashPlacement, const char*> kStashPlacements[] = {
    {StashPlacement::kDevice, "device"}, {StashPlacement::kHost, "host"}};
constexpr std::pair<RecomputeMode, const char*> kRecomputeModes[] = {
    {RecomputeMode::kAlways, "always"}, {RecomputeMode::kNever, "never"}, {RecomputeMode::kAuto, "auto"}};
constexpr std::pair<Transport, const char*> kTransports[] = {
    {Transport::kAuto, "auto"}, {Transport::kShm, "shm"}, {Transport::kGrpc, "grpc"}};
constexpr std::pair<OnWorkerLoss, const char*> kOnWorkerLoss[] = {
    {OnWorkerLoss::kPause, "pause"}, {OnWorkerLoss::kContinue, "continue"}};
constexpr std::pair<WorkerState, const char*> kWorkerStates[] = {
    {WorkerState::kActive, "active"},
    {WorkerState::kLost, "lost"},
    {WorkerState::kLeft, "left"},
    {WorkerState::kRejoin, "rejoin"}};
constexpr std::pair<Task, const char*> kTasks[] = {
    {Task::kLm, "lm"}, {Task::kMlm, "mlm"}, {Task::kClassify, "classify"}};

}  // namespace

const char* ToString(TrainMode m) { return NameOf(kTrainModes, m); }
Result<TrainMode> ParseTrainMode(std::string_view s) { return ParseName(kTrainModes, s); }
const char* ToString(ClipMode m) { return NameOf(kClipModes, m); }
Result<ClipMode> ParseClipMode(std::string_view s) { return ParseName(kClipModes, s); }
const char* ToString(StashPlacement p) { return NameOf(kStashPlacements, p); }
Result<StashPlacement> ParseStashPlacement(std::string_view s) { return ParseName(kStashPlacements, s); }
const char* ToString(RecomputeMode m) { return NameOf(kRecomputeModes, m); }
Result<RecomputeMode> ParseRecomputeMode(std::string_view s) { return ParseName(kRecomputeModes, s); }
const char* ToString(Transport t) { return NameOf(kTransports, t); }
Result<Transport> ParseTransport(std::string_view s) { return ParseName(kTransports, s); }
const char* ToString(OnWorkerLoss w) { return NameOf(kOnWorkerLoss, w); }
Result<OnWorkerLoss> ParseOnWorkerLoss(std::string_view s) { return ParseName(kOnWorkerLoss, s); }
const char* ToString(WorkerState s) { return NameOf(kWorkerStates, s); }
Result<WorkerState> ParseWorkerState(std::string_view s) { return ParseName(kWorkerStates, s); }
const char* ToString(Task t) { return NameOf(kTasks, t); }
Result<Task> ParseTask(std::string_view s) { return ParseName(kTasks, s); }

std::string ToString(GpuFraction f) {
  if (f.automatic) return "auto";
  char buf[40];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f.value);  // shortest round-trip text
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

Result<GpuFraction> ParseGpuFraction(std::string_view s) {
  if (s == "auto") return GpuFraction{};
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !(v >= 0 && v <= 1)) {
    return InvalidArgument("'" + std::string(s) + "' is not auto or a number in [0, 1]");
  }
  return GpuFraction{.automatic = false, .value = v};
}

}  // namespace l2l

// Tests of the mode enums' ToString/Parse pairs (common/modes.h) and of the rejoin reason a
// Status carries (common/status.h): every name round-trips, a bad name is an error that
// lists the accepted ones, and the reason survives the context callers add.
#include <catch2/catch.hpp>

#include "common/modes.h"
#include "common/status.h"

namespace l2l {
namespace {

template <typename E>
void CheckRoundTrip(std::initializer_list<E> all, Result<E> (*parse)(std::string_view),
                    std::initializer_list<const char*> names) {
  REQUIRE(all.size() == names.size());
  auto name = names.begin();
  for (E e : all) {
    CAPTURE(*name);
    CHECK(std::string(ToString(e)) == *name);
    Result<E> back = parse(*name);
    REQUIRE(back.ok());
    CHECK(*back == e);
    ++name;
  }
}

TEST_CASE("every mode name round-trips through its Parse", "[modes]") {
  CheckRoundTrip({TrainMode::kSync, TrainMode::kLockfree}, ParseTrainMode, {"sync", "lockfree"});
  CheckRoundTrip({ClipMode::kNone, ClipMode::kPerLayer, ClipMode::kGlobal}, ParseClipMode,
                 {"none", "per_layer", "global"});
  CheckRoundTrip({StashPlacement::kDevice, StashPlacement::kHost}, ParseStashPlacement, {"device", "host"});
  CheckRoundTrip({RecomputeMode::kAlways, RecomputeMode::kNever, RecomputeMode::kAuto}, ParseRecomputeMode,
                 {"always", "never", "auto"});
  CheckRoundTrip({Transport::kAuto, Transport::kShm, Transport::kGrpc}, ParseTransport, {"auto", "shm", "grpc"});
  CheckRoundTrip({OnWorkerLoss::kPause, OnWorkerLoss::kContinue}, ParseOnWorkerLoss, {"pause", "continue"});
  CheckRoundTrip({WorkerState::kActive, WorkerState::kLost, WorkerState::kLeft, WorkerState::kRejoin},
                 ParseWorkerState, {"active", "lost", "left", "rejoin"});
  CheckRoundTrip({RejoinReason::kNone, RejoinReason::kStepAbandoned, RejoinReason::kDeclaredLost,
                  RejoinReason::kRolledBack},
                 ParseRejoinReason, {"none", "step_abandoned", "declared_lost", "rolled_back"});
}

TEST_CASE("a bad mode name is INVALID_ARGUMENT naming it and the choices", "[modes]") {
  Result<ClipMode> c = ParseClipMode("Global");  // names are case-sensitive
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(c.status().message(), Catch::Contains("'Global'") && Catch::Contains("none, per_layer, global"));
  CHECK_FALSE(ParseTransport("").ok());
  CHECK_FALSE(ParseTrainMode("async").ok());
}

TEST_CASE("a Status carries its rejoin reason through WithContext", "[modes]") {
  const Status plain = FailedPrecondition("wrong step");
  CHECK(plain.rejoin_reason() == RejoinReason::kNone);
  const Status s = RejoinRequired(RejoinReason::kDeclaredLost, "worker 1 was declared lost");
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK(s.rejoin_reason() == RejoinReason::kDeclaredLost);
  const Status wrapped = s.WithContext("FetchLayer(layer 3)");
  CHECK(wrapped.rejoin_reason() == RejoinReason::kDeclaredLost);
  CHECK(wrapped.message() == "FetchLayer(layer 3): worker 1 was declared lost");
}

}  // namespace
}  // namespace l2l

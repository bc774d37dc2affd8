// Status helpers and the L2L_CHECK failure path. See status.h.
#include "common/status.h"

#include <cstring>

namespace l2l {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kIoError: return "IO_ERROR";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + msg_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + msg_).WithRejoinReason(rejoin_);
}

const char* ToString(RejoinReason r) {
  switch (r) {
    case RejoinReason::kNone: return "none";
    case RejoinReason::kStepAbandoned: return "step_abandoned";
    case RejoinReason::kDeclaredLost: return "declared_lost";
    case RejoinReason::kRolledBack: return "rolled_back";
  }
  return "?";
}

Result<RejoinReason> ParseRejoinReason(std::string_view s) {
  for (RejoinReason r : {RejoinReason::kNone, RejoinReason::kStepAbandoned, RejoinReason::kDeclaredLost,
                         RejoinReason::kRolledBack}) {
    if (s == ToString(r)) return r;
  }
  return InvalidArgument("rejoin reason '" + std::string(s) +
                         "' is not one of: none, step_abandoned, declared_lost, rolled_back");
}

Status RejoinRequired(RejoinReason why, std::string msg) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg)).WithRejoinReason(why);
}

Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status AlreadyExists(std::string m) { return Status(StatusCode::kAlreadyExists, std::move(m)); }
Status OutOfRange(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
Status FailedPrecondition(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
Status ResourceExhausted(std::string m) { return Status(StatusCode::kResourceExhausted, std::move(m)); }
Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status DataLoss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
Status Unimplemented(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
Status Aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
Status PermissionDenied(std::string m) { return Status(StatusCode::kPermissionDenied, std::move(m)); }

Status ErrnoError(const std::string& op, const std::string& path, int err) {
  return StatusFromErrno(err, op + "(" + path + "): " + std::strerror(err));
}

Status StatusFromErrno(int err, std::string msg) {
  switch (err) {
    case ENOENT: return NotFound(msg);
    case EEXIST: return AlreadyExists(msg);
    case ENOSPC:
    case ENOMEM:
    case EDQUOT: return ResourceExhausted(msg);
    case EACCES:
    case EPERM: return PermissionDenied(msg);
    case EINVAL: return InvalidArgument(msg);
    default: return Status(StatusCode::kIoError, msg);
  }
}

namespace internal {
void CheckFailed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: L2L_CHECK(%s) failed%s%s\n", file, line, cond, msg.empty() ? "" : ": ",
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace internal

}  // namespace l2l

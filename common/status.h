// Status and Result<T>: how l2l reports recoverable failures (I/O, RPC, bad config,
// bad input, out of memory at setup). Our code does not throw; functions that can fail
// return [[nodiscard]] Status or Result<T> and callers propagate with
// L2L_RETURN_IF_ERROR / L2L_ASSIGN_OR_RETURN. A broken invariant is a bug: L2L_CHECK
// aborts with file:line. Modelled on leveldb's include/leveldb/status.h.
//
// Thread-safety: values; copy freely.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace l2l {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad config, bad file contents, bad RPC arguments
  kNotFound,         // missing file, unknown layer/worker
  kAlreadyExists,    // duplicate gradient, segment exists
  kOutOfRange,       // token >= vocab, offset past end
  kFailedPrecondition,  // wrong step, job not running
  kResourceExhausted,   // memory budget, disk full
  kUnavailable,         // peer unreachable
  kDataLoss,            // truncated or corrupt file
  kIoError,             // errno from the OS
  kInternal,
  kUnimplemented,
  kAborted,
  kDeadlineExceeded,
  kPermissionDenied,
};

const char* StatusCodeName(StatusCode code);

// Why the EPS tells a worker to re-register (Register with previous_worker_id) and restart
// at the step Register names. A FAILED_PRECONDITION Status that asks for this carries the
// reason as a field, never as words in its message, so clients decide on the field
// (worker/eps_client.h NeedsRejoin) and messages stay free to change. Over gRPC it travels
// as the status detail data.v1.RejoinDetail (eps_server/grpc_server.cc ToGrpc); the
// numbers are the proto enum's.
enum class RejoinReason {
  kNone = 0,           // not a rejoin request
  kStepAbandoned = 1,  // another worker was lost mid-step; the step is redone without it
  kDeclaredLost = 2,   // this worker missed its heartbeats and was declared lost
  kRolledBack = 3,     // the state was rolled back while this worker waited for a layer
};
const char* ToString(RejoinReason r);  // "none" | "step_abandoned" | "declared_lost" | "rolled_back"

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string msg) : code_(code), msg_(std::move(msg)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return msg_; }
  // "INVALID_ARGUMENT: config model.n_head=12 does not divide ..."
  std::string ToString() const;
  // Prepends context: "loading configs/x.yaml: <old message>".
  Status WithContext(const std::string& context) const;
  void IgnoreError() const {}
  // kNone unless this error asks the worker to re-register (see RejoinReason).
  RejoinReason rejoin_reason() const { return rejoin_; }
  Status WithRejoinReason(RejoinReason r) const {
    Status s = *this;
    s.rejoin_ = r;
    return s;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string msg_;
  RejoinReason rejoin_ = RejoinReason::kNone;
};

Status InvalidArgument(std::string msg);
Status NotFound(std::string msg);
Status AlreadyExists(std::string msg);
Status OutOfRange(std::string msg);
Status FailedPrecondition(std::string msg);
Status ResourceExhausted(std::string msg);
Status Unavailable(std::string msg);
Status DataLoss(std::string msg);
Status Internal(std::string msg);
Status Unimplemented(std::string msg);
Status Aborted(std::string msg);
Status PermissionDenied(std::string msg);
// FAILED_PRECONDITION asking the worker to re-register, for `why`.
Status RejoinRequired(RejoinReason why, std::string msg);
// Maps errno to a Status naming the operation and path: "open(/x/y): No such file".
Status ErrnoError(const std::string& op, const std::string& path, int err);
// The code errno `err` maps to, with `msg` as it is (it names the operation and path).
Status StatusFromErrno(int err, std::string msg);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {    // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from OK Status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

Result<RejoinReason> ParseRejoinReason(std::string_view s);  // inverse of ToString

namespace internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);

// Collects "<< context" after a failed L2L_CHECK, then aborts in the destructor.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* cond) : file_(file), line_(line), cond_(cond) {}
  [[noreturn]] ~CheckMessage() { CheckFailed(file_, line_, cond_, os_.str()); }
  template <typename V>
  CheckMessage& operator<<(const V& v) {
    os_ << v;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  const char* cond_;
  std::ostringstream os_;
};
struct Voidify {
  void operator&(const CheckMessage&) {}
};
}  // namespace internal

}  // namespace l2l

#define L2L_STATUS_CONCAT_INNER(a, b) a##b
#define L2L_STATUS_CONCAT(a, b) L2L_STATUS_CONCAT_INNER(a, b)

#define L2L_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::l2l::Status l2l_status_ = (expr);           \
    if (!l2l_status_.ok()) return l2l_status_;    \
  } while (0)

#define L2L_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// L2L_ASSIGN_OR_RETURN(auto x, MaybeX());
#define L2L_ASSIGN_OR_RETURN(lhs, expr) \
  L2L_ASSIGN_OR_RETURN_IMPL(L2L_STATUS_CONCAT(l2l_result_, __LINE__), lhs, expr)

// L2L_CHECK(n > 0) << "n=" << n;  aborts with file:line when false.
#define L2L_CHECK(cond) \
  (cond) ? (void)0 : ::l2l::internal::Voidify() & ::l2l::internal::CheckMessage(__FILE__, __LINE__, #cond)

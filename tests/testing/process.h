// Process: the tests' name for common/child_process.h's ChildProcess (a real binary run
// as a child with its output in a log file; it dies with the test process).
#pragma once

#include "common/child_process.h"

namespace l2l::testing {

using Process = ::l2l::ChildProcess;

}  // namespace l2l::testing

// ScopedEnv: sets an environment variable for its lifetime (for the code under test and
// the child processes started meanwhile) and restores what was there before, also when a
// failing REQUIRE unwinds the test. An empty value means "unset while I live".
// Setting and restoring also drop common/env.h's snapshot, so code in this process that
// reads the variable through the registry sees the new value.
// Thread-safety: setenv/unsetenv are process-wide; use it on the test's own thread while
// no other thread reads the environment.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "common/env.h"

namespace l2l::testing {

class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) previous_ = old;
    if (value.empty()) {
      unsetenv(name_.c_str());
    } else {
      setenv(name_.c_str(), value.c_str(), 1);
    }
    ResetEnvForTesting();
  }
  ~ScopedEnv() {
    if (previous_) {
      setenv(name_.c_str(), previous_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
    ResetEnvForTesting();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

}  // namespace l2l::testing

// libFuzzer target: the job YAML parser (common/config.cc ParseJobConfig), as CreateJob
// and --config feed it untrusted text. A config that parses must also serialise and parse
// back (JobConfigToYaml) without error, and its model's layout and parameter count (what
// CreateJob and the workers compute next) must be computable.
//
// Thread-safety: libFuzzer's single input thread.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/config.h"
#include "common/model_spec.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  l2l::fuzz::QuietLogs();
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto job = l2l::ParseJobConfig(text, "<fuzz>", l2l::fuzz::ScratchDir());
  if (!job.ok()) return 0;
  if (job->model_from.empty()) {
    (void)job->model.NumParams();
    (void)l2l::BuildLayout(job->model);
  }
  const std::string again = l2l::JobConfigToYaml(*job);
  auto back = l2l::ParseJobConfig(again, "<fuzz round trip>", l2l::fuzz::ScratchDir());
  if (!back.ok() && job->model_from.empty()) {
    std::fprintf(stderr, "a job that parsed does not parse back after JobConfigToYaml: %s\n%s\n",
                 back.status().ToString().c_str(), again.c_str());
    std::abort();
  }
  return 0;
}

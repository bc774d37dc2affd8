// libFuzzer target: the checkpoint manifest reader (eps_server/checkpoint.cc
// ReadCheckpointManifest: manifest.json with the job's YAML and model spec inside), which
// --resume and rollbacks trust after a crash may have left anything on disk.
//
// Thread-safety: libFuzzer's single input thread.
#include <cstdint>
#include <string>

#include "eps_server/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  l2l::fuzz::QuietLogs();
  (void)l2l::fuzz::WriteScratchFile(l2l::eps::kCheckpointManifest, data, size);
  (void)l2l::eps::ReadCheckpointManifest(l2l::fuzz::ScratchDir());
  return 0;
}

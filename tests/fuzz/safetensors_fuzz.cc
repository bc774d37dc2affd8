// libFuzzer target: the safetensors reader (common/formats/safetensors.cc): the header JSON, the
// offsets and every tensor's conversion to fp32 (tensors of up to 1 Mi elements).
//
// Thread-safety: libFuzzer's single input thread.
#include <cstdint>
#include <string>

#include "common/formats/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  l2l::fuzz::QuietLogs();
  const std::string path = l2l::fuzz::WriteScratchFile("model.safetensors", data, size);
  auto r = l2l::SafeTensorsReader::Open(path);
  if (!r.ok()) return 0;
  for (const l2l::SafeTensorInfo& t : r->tensors()) {
    (void)r->Find(t.name);
    (void)r->Raw(t);
    if (t.numel() <= (size_t{1} << 20)) (void)r->ReadAsFloat(t.name);
  }
  return 0;
}

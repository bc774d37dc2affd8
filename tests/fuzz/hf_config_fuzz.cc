// libFuzzer target: the Hugging Face config.json reader (common/formats/model_config.cc
// ParseHfConfig), which model.from imports run on files they did not write.
//
// Thread-safety: libFuzzer's single input thread.
#include <cstdint>
#include <string>

#include "common/formats/model_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  l2l::fuzz::QuietLogs();
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = l2l::formats::ParseHfConfig(text, "config.json");
  if (cfg.ok()) (void)l2l::formats::HfConfigJson(*cfg).dump();
  return 0;
}

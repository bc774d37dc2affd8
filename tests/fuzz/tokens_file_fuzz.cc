// libFuzzer target: the tokens file reader and its .mask side file (common/formats/tokens_file.cc).
// The first input byte picks the reader (even: the tokens file through ReadTokensFile,
// ReadTokensFile32 and TokensFile::Open with a vocabulary bound; odd: the loss-mask
// file); the rest is the file.
//
// Thread-safety: libFuzzer's single input thread.
#include <cstdint>
#include <string>

#include "common/formats/tokens_file.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  l2l::fuzz::QuietLogs();
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string path = l2l::fuzz::WriteScratchFile("train.bin", data + 1, size - 1);
  if ((mode & 1) == 0) {
    (void)l2l::ReadTokensFile(path);
    (void)l2l::ReadTokensFile32(path);
    auto f = l2l::TokensFile::Open(path, 256 + mode);
    if (f.ok()) {
      uint64_t sum = 0;
      for (size_t i = 0; i < f->size(); ++i) sum += f->token(i);
      (void)sum;
    }
  } else {
    const std::string mask = l2l::fuzz::WriteScratchFile("train.bin.mask", data + 1, size - 1);
    (void)l2l::ReadLossMaskFile(mask);
    (void)l2l::ReadLossMaskFile(mask, mode >> 1);
  }
  return 0;
}

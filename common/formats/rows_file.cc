// Classification rows files: writer and checked reader. See common/formats/rows_file.h.
#include "common/formats/rows_file.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "common/file_util.h"
#include "common/formats/tokens_file.h"

namespace l2l {
namespace {

std::string LabelsPath(const std::string& path) { return path + ".labels"; }
std::string TypesPath(const std::string& path) { return path + ".types"; }
std::string AttnPath(const std::string& path) { return path + ".attn"; }

}  // namespace

Status WriteClassifyFiles(const std::string& path, const ClassifyRows& rows, int64_t first, int64_t n,
                          int64_t vocab_size) {
  if (first < 0 || n < 0 || first + n > rows.rows()) return InvalidArgument(path + ": rows out of range");
  const size_t L = static_cast<size_t>(rows.max_len);
  const size_t b = static_cast<size_t>(first) * L, e = static_cast<size_t>(first + n) * L;
  L2L_RETURN_IF_ERROR(WriteTokensFileForVocab(path, std::span<const uint32_t>(rows.ids).subspan(b, e - b), vocab_size));
  L2L_RETURN_IF_ERROR(WriteLossMaskFile(TypesPath(path), std::span<const uint8_t>(rows.type_ids).subspan(b, e - b)));
  L2L_RETURN_IF_ERROR(WriteLossMaskFile(AttnPath(path), std::span<const uint8_t>(rows.attention).subspan(b, e - b)));
  std::vector<int32_t> buf(kTokensHeaderInts + static_cast<size_t>(n), 0);
  buf[0] = kLabelsMagic;
  buf[1] = kLabelsVersion;
  buf[2] = static_cast<int32_t>(n);
  buf[3] = static_cast<int32_t>(rows.max_len);
  buf[4] = static_cast<int32_t>(rows.num_classes);
  std::copy(rows.labels.begin() + first, rows.labels.begin() + first + n, buf.begin() + kTokensHeaderInts);
  return WriteFileAtomic(LabelsPath(path), buf.data(), buf.size() * sizeof(int32_t));
}

Result<ClassifyRows> ReadClassifyFiles(const std::string& path, int64_t vocab_size) {
  const std::string lpath = LabelsPath(path);
  L2L_ASSIGN_OR_RETURN(std::string lbytes, ReadFileToString(lpath));
  if (lbytes.size() < kTokensHeaderBytes) return DataLoss(lpath + ": shorter than the 1024-byte header");
  int32_t h[8];
  std::memcpy(h, lbytes.data(), sizeof(h));
  if (h[0] != kLabelsMagic) return InvalidArgument(lpath + ": bad magic " + std::to_string(h[0]) + " (a labels file has 20240525)");
  if (h[1] != kLabelsVersion) return InvalidArgument(lpath + ": unsupported version " + std::to_string(h[1]));
  if (h[2] < 0 || h[3] <= 0 || h[4] <= 0) {
    return InvalidArgument(lpath + ": bad header (rows " + std::to_string(h[2]) + ", row length " + std::to_string(h[3]) +
                           ", classes " + std::to_string(h[4]) + ")");
  }
  const size_t n = static_cast<size_t>(h[2]);
  if (lbytes.size() != kTokensHeaderBytes + n * sizeof(int32_t)) {
    return DataLoss(lpath + ": " + std::to_string(lbytes.size()) + " bytes, expected " +
                    std::to_string(kTokensHeaderBytes + n * sizeof(int32_t)) + " for " + std::to_string(n) + " rows");
  }
  ClassifyRows rows;
  rows.max_len = h[3];
  rows.num_classes = h[4];
  rows.labels.resize(n);
  std::memcpy(rows.labels.data(), lbytes.data() + kTokensHeaderBytes, n * sizeof(int32_t));
  for (size_t i = 0; i < n; ++i) {
    if (rows.labels[i] < 0 || rows.labels[i] >= rows.num_classes) {
      return InvalidArgument(lpath + ": label " + std::to_string(rows.labels[i]) + " of row " + std::to_string(i) +
                             " is outside [0, " + std::to_string(rows.num_classes) + ")");
    }
  }
  const int64_t count = static_cast<int64_t>(n) * rows.max_len;
  L2L_ASSIGN_OR_RETURN(rows.ids, ReadTokensFile32(path, vocab_size));
  if (static_cast<int64_t>(rows.ids.size()) != count) {
    return InvalidArgument(path + ": " + std::to_string(rows.ids.size()) + " tokens, but " + lpath + " says " +
                           std::to_string(n) + " rows of " + std::to_string(rows.max_len));
  }
  L2L_ASSIGN_OR_RETURN(rows.type_ids, ReadLossMaskFile(TypesPath(path), count));
  L2L_ASSIGN_OR_RETURN(rows.attention, ReadLossMaskFile(AttnPath(path), count));
  return rows;
}

}  // namespace l2l

// Tests for common/host_buffer.h (alignment, zero-fill, move-only ownership, bad
// arguments), common/logging.h (lines reach the file with time, level and tag; bad level
// or file rejected) and common/file_util.h (atomic writes leave no temp files).
#include <cstdint>
#include <filesystem>
#include <regex>
#include <string>

#include <catch2/catch.hpp>

#include "common/file_util.h"
#include "common/host_buffer.h"
#include "common/logging.h"
#include "tests/common/temp_dir.h"

namespace l2l {

TEST_CASE("AlignedBuffer is aligned, zero-filled on request and move-only", "[host_buffer]") {
  for (size_t align : {size_t{64}, kPageAlign}) {
    Result<AlignedBuffer<float>> b = AlignedBuffer<float>::Create(1001, align, /*zero=*/true);
    REQUIRE(b.ok());
    CHECK(reinterpret_cast<uintptr_t>(b->data()) % align == 0);
    CHECK(b->size() == 1001);
    CHECK(b->bytes() == 4004);
    for (float x : *b) REQUIRE(x == 0.0f);
    (*b)[1000] = 3.0f;
    AlignedBuffer<float> moved = std::move(b).value();
    CHECK(moved[1000] == 3.0f);
    AlignedBuffer<float> other;
    CHECK(other.empty());
    other = std::move(moved);
    CHECK(moved.data() == nullptr);  // NOLINT: moved-from state is documented empty
    CHECK(other.size() == 1001);
  }
  static_assert(!std::is_copy_constructible_v<AlignedBuffer<float>>);
  Result<AlignedBuffer<uint16_t>> empty = AlignedBuffer<uint16_t>::Create(0);
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE("AlignedBuffer reports bad alignment and impossible sizes as errors", "[host_buffer][errors]") {
  Result<AlignedBuffer<float>> bad = AlignedBuffer<float>::Create(10, 48);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("alignment 48") != std::string::npos);
  Result<AlignedBuffer<double>> huge = AlignedBuffer<double>::Create(size_t{1} << 62);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("Log lines reach the log file with time, level and tag", "[logging]") {
  testing::TempDir dir;
  const std::string file = dir.File("l2l.log");
  REQUIRE(InitLogging("debug", file, "unit").ok());
  L2L_LOG_DEBUG("debug line {}", 1);
  L2L_LOG_INFO("hello {} {}", "world", 42);
  L2L_LOG_ERROR("bad thing");
  REQUIRE(SetLogLevel("warn").ok());
  L2L_LOG_INFO("suppressed");
  FlushLogs();
  const std::string text = testing::ReadAll(file);
  INFO(text);
  CHECK(std::regex_search(text, std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} I unit \d+\] hello world 42)")));
  CHECK(text.find("D unit") != std::string::npos);
  CHECK(text.find("E unit") != std::string::npos);
  CHECK(text.find("suppressed") == std::string::npos);
  REQUIRE(InitLogging("info").ok());  // back to stderr only, releasing the file

  Status bad = InitLogging("loud");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.message().find("loud") != std::string::npos);
  Status nofile = InitLogging("info", dir.File("no/such/dir/") );
  REQUIRE_FALSE(nofile.ok());
  CHECK(nofile.message().find("no/such/dir") != std::string::npos);
  REQUIRE(InitLogging("info").ok());
}

TEST_CASE("An AtomicFileWriter dropped before Commit leaves neither file nor temp", "[file_util]") {
  testing::TempDir dir;
  const std::string p = dir.File("f.bin");
  {
    Result<AtomicFileWriter> w = AtomicFileWriter::Create(p);
    REQUIRE(w.ok());
    REQUIRE(w->Append("abc", 3).ok());
  }
  CHECK(std::filesystem::is_empty(dir.path()));
  REQUIRE(WriteFileAtomic(p, "xyz", 3).ok());
  CHECK(testing::ReadAll(p) == "xyz");
  CHECK(ReadFileToString(p).value() == "xyz");
  Result<AtomicFileWriter> w = AtomicFileWriter::Create(p);
  REQUIRE(w.ok());
  REQUIRE(w->Append("new", 3).ok());
  CHECK(testing::ReadAll(p) == "xyz");  // readers see the old file until Commit
  REQUIRE(w->Commit().ok());
  CHECK(testing::ReadAll(p) == "new");
  CHECK_FALSE(w->Commit().ok());
  Status missing_dir = WriteFileAtomic(dir.File("nodir/x"), "a", 1);
  REQUIRE_FALSE(missing_dir.ok());
  CHECK(missing_dir.message().find("nodir/x") != std::string::npos);
  CHECK_FALSE(MappedFile::Open(dir.path()).ok());  // a directory is not a regular file
}

}  // namespace l2l

// Tests of eps_server/spill_io.h: SpillFile (sizes, O_DIRECT and its fallback, wrong
// sizes, must_exist), IoEngine (round trips through the FIFO, concurrency, truncated
// files, injected faults), FaultPlan parsing and AlignedBufferPool's all-or-nothing
// acquisition. The oracle for file contents is plain pread/pwrite on a second
// descriptor, never the engine itself. Every test works in its own temp dir, removed.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "eps_server/spill_io.h"
#include "tests/testing/temp_dir.h"

namespace l2l::eps {
namespace {

// Under /tmp unless told (not $TMPDIR: the O_DIRECT cases want a disk-backed directory).
struct TempDir : testing::TempDir {
  explicit TempDir(const std::string& parent = "/tmp") : testing::TempDir("l2l-spill-io-test", parent) {}
};

// A 4096-aligned heap buffer.
struct Aligned {
  explicit Aligned(size_t n) : size(n) {
    void* p = nullptr;
    REQUIRE(posix_memalign(&p, 4096, n == 0 ? 4096 : n) == 0);
    data = static_cast<char*>(p);
    std::memset(data, 0, n);
  }
  ~Aligned() { free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  char* data = nullptr;
  size_t size = 0;
};

void FillRandom(char* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<char>(rng());
}

// The file's bytes through an independent descriptor (the oracle).
std::vector<char> PreadAll(const std::string& path, size_t n, uint64_t off = 0) {
  std::vector<char> out(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out.data() + got, n - got, static_cast<off_t>(off + got));
    REQUIRE(r > 0);
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return out;
}

std::unique_ptr<IoEngine> MakeEngine(int qd, size_t block, FaultPlan* faults = nullptr) {
  auto e = IoEngine::Create(IoEngineOptions{qd, block}, faults);
  REQUIRE(e.ok());
  return std::move(e).value();
}

SpillFile MakeFile(const std::string& path, uint64_t bytes, bool direct = true, FaultPlan* faults = nullptr) {
  SpillFileOptions o;
  o.direct = direct;
  auto f = SpillFile::Open(path, bytes, o, faults);
  INFO(f.status().ToString());
  REQUIRE(f.ok());
  return std::move(f).value();
}

bool Contains(const Status& st, const std::string& s) { return st.message().find(s) != std::string::npos; }

// Kernel probe used as the oracle for "does this directory take O_DIRECT".
bool KernelTakesODirect(const std::string& dir) {
  const std::string p = dir + "/probe";
  const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(p.c_str());
  return fd >= 0;
}

// Writes src to the file through the engine, reads it back, compares; returns the read-back.
void RoundTrip(IoEngine& eng, const SpillFile& f, size_t n, uint64_t seed) {
  Aligned src(n), back(n);
  FillRandom(src.data, n, seed);
  REQUIRE(eng.Write(f, src.data, n, 0).ok());
  REQUIRE(PreadAll(f.path(), n) == std::vector<char>(src.data, src.data + n));
  Status st = eng.Read(f, back.data, n, 0);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(std::memcmp(src.data, back.data, n) == 0);
}

}  // namespace

TEST_CASE("IoEngine round-trips random data through small blocks and a shallow queue", "[eps][spill_io]") {
  TempDir dir;
  const size_t n = 6 << 20;
  SpillFile f = MakeFile(dir.File("a.spill"), n);
  auto eng = MakeEngine(/*qd=*/4, /*block=*/64 << 10);  // 96 blocks per transfer, 4 in flight
  Aligned src(n);
  FillRandom(src.data, n, 7);
  // One transfer for the whole file: most blocks wait in the FIFO.
  Status st = eng->Write(f, src.data, n, 0);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(PreadAll(f.path(), n) == std::vector<char>(src.data, src.data + n));

  // Read back as three concurrent transfers of uneven sizes.
  Aligned back(n);
  const size_t cuts[4] = {0, 1 << 20, (1 << 20) + (3 << 20) + 4096 * 5, n};
  std::vector<std::promise<Status>> ps(3);
  for (int i = 0; i < 3; ++i) {
    eng->Submit(f, IoOp::kRead, back.data + cuts[i], cuts[i + 1] - cuts[i], cuts[i],
                [&ps, i](Status s) { ps[i].set_value(std::move(s)); });
  }
  for (auto& p : ps) {
    Status s = p.get_future().get();
    INFO(s.ToString());
    CHECK(s.ok());
  }
  CHECK(std::memcmp(src.data, back.data, n) == 0);
  const IoStats stats = eng->stats();
  CHECK(stats.bytes_written == n);
  CHECK(stats.bytes_read == n);
  CHECK(stats.writes == 1);
  CHECK(stats.reads == 3);
  CHECK(stats.read_busy_s > 0);
}

TEST_CASE("IoEngine serves many concurrent Submits from 4 threads, each callback once", "[eps][spill_io]") {
  TempDir dir;
  constexpr int kThreads = 4, kPerThread = 24;
  constexpr size_t kXfer = 48 << 10;  // 3 blocks of 16 KiB
  const size_t n = kThreads * kPerThread * kXfer;
  SpillFile f = MakeFile(dir.File("c.spill"), n);
  auto eng = MakeEngine(/*qd=*/6, /*block=*/16 << 10);
  Aligned src(n), back(n);
  FillRandom(src.data, n, 11);
  std::vector<std::atomic<int>> calls(kThreads * kPerThread);
  std::atomic<int> failures{0};
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  auto run = [&](IoOp op, char* base) {
    finished = 0;
    for (auto& c : calls) c = 0;
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const int id = t * kPerThread + k;
          const size_t off = static_cast<size_t>(id) * kXfer;
          eng->Submit(f, op, base + off, kXfer, off, [&, id](Status s) {
            if (!s.ok()) ++failures;
            ++calls[id];
            std::lock_guard<std::mutex> lock(mu);
            ++finished;
            cv.notify_all();
          });
        }
      });
    }
    for (auto& th : ts) th.join();
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished == kThreads * kPerThread; }));
  };
  run(IoOp::kWrite, src.data);
  CHECK(failures == 0);
  for (auto& c : calls) CHECK(c == 1);
  REQUIRE(PreadAll(f.path(), n) == std::vector<char>(src.data, src.data + n));
  run(IoOp::kRead, back.data);
  CHECK(failures == 0);
  for (auto& c : calls) CHECK(c == 1);
  CHECK(std::memcmp(src.data, back.data, n) == 0);
  CHECK(eng->stats().writes == kThreads * kPerThread);
}

TEST_CASE("SpillFile uses O_DIRECT under /tmp, 0600, size rounded up to the alignment", "[eps][spill_io]") {
  TempDir dir;
  const std::string path = dir.File("d.spill");
  SpillFile f = MakeFile(path, 3 * 4096 + 1);
  CHECK(f.direct());
  CHECK((::fcntl(f.fd(), F_GETFL) & O_DIRECT) != 0);
  CHECK(f.align() >= 4096);
  CHECK(f.align() % 4096 == 0);
  CHECK(f.size() == (3 * 4096 + 1 + f.align() - 1) / f.align() * f.align());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(static_cast<uint64_t>(st.st_size) == f.size());
  CHECK(static_cast<uint64_t>(st.st_blocks) * 512 >= f.size());  // preallocated, not sparse
  auto eng = MakeEngine(4, 4096);
  RoundTrip(*eng, f, f.size(), 3);
  CHECK(eng->Fsync(f).ok());
}

TEST_CASE("SpillFile falls back to buffered I/O where O_DIRECT is refused, data intact", "[eps][spill_io]") {
  auto eng = MakeEngine(4, 64 << 10);
  SECTION("tmpfs (/dev/shm): direct() is what the kernel allows") {
    // Linux >= 6.6 accepts O_DIRECT on tmpfs; older kernels refuse it with EINVAL.
    TempDir dir("/dev/shm");
    const bool kernel_direct = KernelTakesODirect(dir.path());
    SpillFile f = MakeFile(dir.File("s.spill"), 1 << 20);
    CHECK(f.direct() == kernel_direct);
    CHECK(((::fcntl(f.fd(), F_GETFL) & O_DIRECT) != 0) == kernel_direct);
    RoundTrip(*eng, f, 1 << 20, 5);
  }
  SECTION("open refusing O_DIRECT (injected EINVAL) -> buffered") {
    TempDir dir;
    auto plan = FaultPlan::Parse("open:1:EINVAL");
    REQUIRE(plan.ok());
    SpillFile f = MakeFile(dir.File("b.spill"), 1 << 20, true, &*plan);
    CHECK_FALSE(f.direct());
    CHECK((::fcntl(f.fd(), F_GETFL) & O_DIRECT) == 0);
    RoundTrip(*eng, f, 1 << 20, 6);
  }
}

TEST_CASE("SpillFile refuses an existing file of another size unless resizing", "[eps][spill_io]") {
  TempDir dir;
  const std::string path = dir.File("w.spill");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 8192) == 0);
  ::close(fd);
  SpillFileOptions o;
  auto f = SpillFile::Open(path, 16384, o);
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().code() == StatusCode::kDataLoss);
  CHECK(Contains(f.status(), path));
  CHECK(Contains(f.status(), "8192"));
  CHECK(Contains(f.status(), "16384"));
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(st.st_size == 8192);  // left alone

  o.resize_existing = true;
  auto g = SpillFile::Open(path, 16384, o);
  REQUIRE(g.ok());
  CHECK(g->size() == 16384);
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(st.st_size == 16384);

  // The same size again opens without complaint (a restart).
  o.resize_existing = false;
  o.must_exist = true;
  CHECK(SpillFile::Open(path, 16384, o).ok());
}

TEST_CASE("SpillFile must_exist on a missing file is NOT_FOUND and creates nothing", "[eps][spill_io]") {
  TempDir dir;
  const std::string path = dir.File("missing.spill");
  SpillFileOptions o;
  o.must_exist = true;
  auto f = SpillFile::Open(path, 4096, o);
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().code() == StatusCode::kNotFound);
  CHECK(Contains(f.status(), path));
  CHECK_FALSE(std::filesystem::exists(path));
  // A missing directory is NOT_FOUND too.
  auto g = SpillFile::Open(dir.File("no/such/dir.spill"), 4096, SpillFileOptions{});
  CHECK(g.status().code() == StatusCode::kNotFound);
}

TEST_CASE("A read of a spill file truncated behind the engine fails naming path and offset", "[eps][spill_io]") {
  TempDir dir;
  const std::string path = dir.File("t.spill");
  const size_t n = 1 << 20;
  SpillFile f = MakeFile(path, n);
  auto eng = MakeEngine(4, 256 << 10);
  Aligned src(n), back(n);
  FillRandom(src.data, n, 9);
  REQUIRE(eng->Write(f, src.data, n, 0).ok());

  SECTION("cut in the middle of a block, not at an alignment boundary") {
    REQUIRE(::truncate(path.c_str(), (300 << 10) + 100) == 0);
    Status st = eng->Read(f, back.data, n, 0);
    INFO(st.ToString());
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK(Contains(st, "short read of " + path + " at offset 262144"));
    CHECK(Contains(st, "got " + std::to_string((44 << 10) + 100) + " of 262144 bytes"));
  }
  SECTION("cut at a block boundary: the next block reads 0 bytes") {
    REQUIRE(::truncate(path.c_str(), 512 << 10) == 0);
    Status st = eng->Read(f, back.data, n, 0);
    INFO(st.ToString());
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK(Contains(st, "short read of " + path + " at offset 524288: got 0 of 262144"));
  }
  // The engine is still usable afterwards for the part that exists.
  CHECK(eng->Read(f, back.data, 256 << 10, 0).ok());
  CHECK(std::memcmp(back.data, src.data, 256 << 10) == 0);
}

TEST_CASE("Injected read/write/fsync faults fail that transfer only, naming op and path", "[eps][spill_io]") {
  TempDir dir;
  const std::string path = dir.File("f.spill");
  const size_t n = 256 << 10;
  struct Case {
    const char* plan;
    IoOp op;
    StatusCode code;
    const char* text;
  };
  const Case cases[] = {
      {"write:2:EIO", IoOp::kWrite, StatusCode::kIoError, "spill write of "},
      {"write:2:ENOSPC", IoOp::kWrite, StatusCode::kResourceExhausted, "spill write of "},
      {"write:2:short", IoOp::kWrite, StatusCode::kDataLoss, "short write of "},
      {"read:2:EIO", IoOp::kRead, StatusCode::kIoError, "spill read of "},
      {"read:2:ENOSPC", IoOp::kRead, StatusCode::kResourceExhausted, "spill read of "},
      {"read:2:short", IoOp::kRead, StatusCode::kDataLoss, "short read of "},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.plan) {
      auto plan = FaultPlan::Parse(c.plan);
      REQUIRE(plan.ok());
      SpillFile f = MakeFile(path, n);
      auto eng = MakeEngine(2, 64 << 10, &*plan);  // 4 blocks per transfer
      Aligned buf(n);
      FillRandom(buf.data, n, 1);
      auto xfer = [&] {
        return c.op == IoOp::kWrite ? eng->Write(f, buf.data, n, 0) : eng->Read(f, buf.data, n, 0);
      };
      CHECK(xfer().ok());  // occurrence 1
      Status st = xfer();  // occurrence 2: fails
      INFO(st.ToString());
      REQUIRE_FALSE(st.ok());
      CHECK(st.code() == c.code);
      CHECK(Contains(st, c.text + path));
      CHECK(Contains(st, "offset 0"));
      CHECK(Contains(st, "[injected fault]"));
      CHECK(xfer().ok());  // occurrence 3: only the 2nd was planned
      if (c.op == IoOp::kRead) CHECK(eng->stats().reads == 2);
    }
  }
  SECTION("nth+ fails that one and every later one; fsync faults") {
    auto plan = FaultPlan::Parse("read:2+:EIO,fsync:1:EIO");
    REQUIRE(plan.ok());
    SpillFile f = MakeFile(path, n);
    auto eng = MakeEngine(2, 64 << 10, &*plan);
    Aligned buf(n);
    CHECK(eng->Read(f, buf.data, n, 0).ok());
    CHECK_FALSE(eng->Read(f, buf.data, n, 0).ok());
    CHECK_FALSE(eng->Read(f, buf.data, n, 0).ok());
    Status st = eng->Fsync(f);
    CHECK(st.code() == StatusCode::kIoError);
    CHECK(Contains(st, "spill fsync of " + path));
    CHECK(eng->Fsync(f).ok());
    CHECK(eng->Write(f, buf.data, n, 0).ok());
  }
}

TEST_CASE("Injected open and fallocate faults: ENOSPC is RESOURCE_EXHAUSTED with the numbers", "[eps][spill_io]") {
  TempDir dir;
  const std::string path = dir.File("n.spill");
  {
    auto plan = FaultPlan::Parse("fallocate:1:ENOSPC");
    REQUIRE(plan.ok());
    auto f = SpillFile::Open(path, 3 << 20, SpillFileOptions{}, &*plan);
    REQUIRE_FALSE(f.ok());
    INFO(f.status().ToString());
    CHECK(f.status().code() == StatusCode::kResourceExhausted);
    CHECK(Contains(f.status(), "fallocate(" + path));
    CHECK(Contains(f.status(), "needs 3145728 bytes"));
    CHECK(Contains(f.status(), "bytes free"));
    CHECK_FALSE(std::filesystem::exists(path));  // the half-made file is removed
  }
  {
    auto plan = FaultPlan::Parse("open:1:EIO");
    REQUIRE(plan.ok());
    auto f = SpillFile::Open(path, 4096, SpillFileOptions{}, &*plan);
    CHECK(f.status().code() == StatusCode::kIoError);
    CHECK(Contains(f.status(), "open(" + path));
    CHECK(SpillFile::Open(path, 4096, SpillFileOptions{}, &*plan).ok());  // 2nd open is fine
  }
}

TEST_CASE("IoEngine reports misaligned and out-of-range transfers and bad options", "[eps][spill_io]") {
  TempDir dir;
  SpillFile f = MakeFile(dir.File("m.spill"), 64 << 10);
  auto eng = MakeEngine(2, 4096);
  Aligned buf(128 << 10);
  Status st = eng->Read(f, buf.data + 512, 4096, 0);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(Contains(st, f.path()));
  CHECK(eng->Write(f, buf.data, 4096, 100).code() == StatusCode::kInvalidArgument);
  st = eng->Read(f, buf.data, 8192, 60 << 10);
  CHECK(st.code() == StatusCode::kOutOfRange);
  CHECK(Contains(st, "65536"));
  CHECK(eng->Read(f, buf.data, 0, 0).ok());
  CHECK(IoEngine::Create(IoEngineOptions{0, 4096}).status().code() == StatusCode::kInvalidArgument);
  CHECK(IoEngine::Create(IoEngineOptions{4, 1000}).status().code() == StatusCode::kInvalidArgument);
  CHECK(SpillFile::Open(dir.File("z.spill"), 0, SpillFileOptions{}).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("FaultPlan parses rules, counts occurrences, and names a bad rule", "[eps][spill_io]") {
  auto empty = FaultPlan::Parse("");
  REQUIRE(empty.ok());
  CHECK(empty->empty());
  CHECK(empty->Next(IoOp::kRead) == FaultPlan::Kind::kNone);

  auto plan = FaultPlan::Parse("read:2:EIO, write:3+:enospc,read:4:short");
  REQUIRE(plan.ok());
  using K = FaultPlan::Kind;
  const K reads[] = {K::kNone, K::kEio, K::kNone, K::kShort, K::kNone};
  for (K k : reads) CHECK(plan->Next(IoOp::kRead) == k);
  const K writes[] = {K::kNone, K::kNone, K::kEnospc, K::kEnospc, K::kEnospc};
  for (K k : writes) CHECK(plan->Next(IoOp::kWrite) == k);
  CHECK(plan->Next(IoOp::kOpen) == K::kNone);

  const char* bad[] = {"read:0:EIO",  "reed:1:EIO", "read:1:EBADF", "read:1",          "read:1:EIO:x",
                       "open:1:short", "read:x+:EIO", "read:-1:EIO", "write:1:EINVAL"};
  for (const char* b : bad) {
    INFO(b);
    auto p = FaultPlan::Parse(b);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(p.status(), std::string("'") + b + "'"));
  }
  auto p = FaultPlan::Parse("read:1:EIO,,write:1:EIO");
  REQUIRE_FALSE(p.ok());
  CHECK(Contains(p.status(), "rule 2"));
  CHECK(Contains(p.status(), "empty rule"));
}

TEST_CASE("AlignedBufferPool: aligned zeroed buffers, all-or-nothing, timeouts, wake-ups", "[eps][spill_io]") {
  auto pool_r = AlignedBufferPool::Create(8192, 4);
  REQUIRE(pool_r.ok());
  AlignedBufferPool& pool = **pool_r;
  CHECK(pool.capacity() == 4);
  CHECK(pool.buffer_bytes() == 8192);

  auto all = pool.TryAcquire(4);
  REQUIRE(all.size() == 4);
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < 4; ++i) {
    CHECK(reinterpret_cast<uintptr_t>(all[i]) % 4096 == 0);
    if (i > 0) CHECK(static_cast<char*>(all[i]) - static_cast<char*>(all[i - 1]) >= 8192);
    for (size_t k = 0; k < 8192; k += 511) CHECK(static_cast<char*>(all[i])[k] == 0);
  }
  CHECK(pool.free_count() == 0);
  CHECK(pool.TryAcquire(1).empty());
  pool.Release(all);
  CHECK(pool.free_count() == 4);

  auto three = pool.Acquire(3, std::chrono::milliseconds(0));
  REQUIRE(three.ok());
  CHECK(three->size() == 3);
  // n - 1 free: TryAcquire(n) takes nothing.
  CHECK(pool.TryAcquire(2).empty());
  CHECK(pool.free_count() == 1);

  const auto t0 = std::chrono::steady_clock::now();
  auto late = pool.Acquire(2, std::chrono::milliseconds(60));
  CHECK(late.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(55));
  CHECK(pool.free_count() == 1);  // the timed-out taker holds nothing

  auto too_many = pool.Acquire(5, std::chrono::milliseconds(10));
  CHECK(too_many.status().code() == StatusCode::kInvalidArgument);
  CHECK(Contains(too_many.status(), "5"));

  // A blocked Acquire(2) is woken by the Release that makes 2 free.
  std::promise<Result<std::vector<void*>>> got;
  std::thread waiter([&] { got.set_value(pool.Acquire(2, std::chrono::seconds(20))); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(pool.free_count() == 1);  // still waiting: it took nothing meanwhile
  const auto t1 = std::chrono::steady_clock::now();
  pool.Release({(*three)[0]});
  auto r = got.get_future().get();
  waiter.join();
  REQUIRE(r.ok());
  CHECK(r->size() == 2);
  CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::seconds(5));
  CHECK(pool.free_count() == 0);
  pool.Release(*r);
  pool.Release({(*three)[1], (*three)[2]});
  CHECK(pool.free_count() == 4);
}

}  // namespace l2l::eps

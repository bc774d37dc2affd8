// Tests of common/shm.h RemoveJobSegments: a job's start-up clean-up removes the
// segments a crashed run of that job left, and never another job's whose id starts
// with the same text (the Slurm launcher's "l2l-<cluster>-<id>" jobs beside a daemon
// whose job id is "l2l": each shard's weight segment was removed by the other daemon).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/shm.h"

namespace l2l {
namespace {

TEST_CASE("RemoveJobSegments removes exactly the job's own segment names", "[shm]") {
  const std::string job = "shmtest" + std::to_string(getpid());
  const std::vector<std::string> mine = {"/l2l-" + job + "-w", "/l2l-" + job + "-g0", "/l2l-" + job + "-g12r3",
                                         "/l2l-" + job + "-u1", "/l2l-" + job + "-u2r10"};
  // Another job's, whose id starts with this one's; and names that only look alike.
  const std::vector<std::string> theirs = {"/l2l-" + job + "-s1-w", "/l2l-" + job + "-g1-w",
                                           "/l2l-" + job + "-wx", "/l2l-" + job + "-g", "/l2l-" + job + "-gr1",
                                           "/l2l-" + job + "-g1r", "/l2l-" + job + "x-w"};
  std::vector<ShmSegment> keep;
  for (const auto& n : mine) {  // left behind, as by a crashed daemon
    const int fd = shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 4096) == 0);
    close(fd);
  }
  for (const auto& n : theirs) {
    auto s = ShmSegment::Create(n, 4096);
    REQUIRE(s.ok());
    keep.push_back(std::move(s).value());  // unlinked by its destructor at the end
  }
  auto removed = RemoveJobSegments(job);
  REQUIRE(removed.ok());
  CHECK(*removed == static_cast<int>(mine.size()));
  for (const auto& n : mine) {
    INFO(n);
    CHECK_FALSE(ShmSegment::Open(n, false).ok());
  }
  for (const auto& n : theirs) {
    INFO(n);
    CHECK(ShmSegment::Open(n, false).ok());
  }
  CHECK_FALSE(RemoveJobSegments("").ok());
}

}  // namespace
}  // namespace l2l

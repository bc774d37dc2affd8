// RemoveStaleCheckpointTemps (eps_server/checkpoint.h): the temporary directory of a
// checkpoint whose writer died is removed at the next start; completed checkpoints,
// `latest`, other files and a live writer's temporary directory are left alone.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "eps_server/checkpoint.h"

namespace l2l::eps {
namespace {

namespace fs = std::filesystem;

// A pid that no running process has: a child that exited and was reaped.
pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return pid;
}

void Touch(const fs::path& p) { std::ofstream(p) << "x"; }

}  // namespace

TEST_CASE("RemoveStaleCheckpointTemps removes a dead writer's temporary directory and nothing else",
          "[eps][checkpoint]") {
  const fs::path root = fs::temp_directory_path() / ("l2l-stale-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "step-00000002");
  Touch(root / "step-00000002" / "manifest.json");
  Touch(root / "latest");
  const pid_t dead = DeadPid();
  const fs::path stale = root / (".step-00000003.tmp-" + std::to_string(dead) + "-0");
  fs::create_directories(stale);
  Touch(stale / "layer-0000.bin");
  // A live writer (pid 1 always runs), this process's own leftover, and look-alikes.
  const fs::path live = root / ".step-00000004.tmp-1-7";
  const fs::path own = root / (".step-00000005.tmp-" + std::to_string(::getpid()) + "-3");
  fs::create_directories(live);
  fs::create_directories(own);
  fs::create_directories(root / (".step-00000006.tmp-" + std::to_string(dead)));  // no counter
  fs::create_directories(root / ("step-00000007.tmp-" + std::to_string(dead) + "-0"));  // no dot
  Touch(root / (".latest.tmp-" + std::to_string(dead) + "-0x"));  // trailing junk

  auto removed = RemoveStaleCheckpointTemps(root.string());
  INFO(removed.status().ToString());
  REQUIRE(removed.ok());
  CHECK(*removed == 2);
  CHECK_FALSE(fs::exists(stale));
  CHECK_FALSE(fs::exists(own));
  CHECK(fs::exists(live));
  CHECK(fs::exists(root / "step-00000002" / "manifest.json"));
  CHECK(fs::exists(root / "latest"));
  CHECK(fs::exists(root / (".step-00000006.tmp-" + std::to_string(dead))));
  CHECK(fs::exists(root / ("step-00000007.tmp-" + std::to_string(dead) + "-0")));
  CHECK(fs::exists(root / (".latest.tmp-" + std::to_string(dead) + "-0x")));

  // A root that does not exist holds nothing to remove.
  auto none = RemoveStaleCheckpointTemps((root / "nowhere").string());
  REQUIRE(none.ok());
  CHECK(*none == 0);
  fs::remove_all(root);
}

}  // namespace l2l::eps

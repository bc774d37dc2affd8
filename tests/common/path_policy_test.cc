// common/path_policy.h: ConfinePath resolves a named path (symlinks included) and checks it
// against the allowed roots; a refusal names the key and the roots and nothing about the
// refused file; ConfineJobPaths and the job parser's `roots` confine every path a job names.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/path_policy.h"
#include "tests/testing/temp_dir.h"

namespace l2l {
namespace {

namespace fs = std::filesystem;

// The directory's own canonical name (TMPDIR may itself be a symlink).
std::string Real(const std::string& p) { return fs::canonical(p).string(); }

void ExpectRefusal(const Result<std::string>& r, const std::string& key, const std::vector<std::string>& roots,
                   const std::string& secret = "") {
  REQUIRE(!r.ok());
  CHECK(r.status().code() == StatusCode::kPermissionDenied);
  const std::string& m = r.status().message();
  CHECK(m.rfind(key + ": refused: allowed only inside [", 0) == 0);
  for (const std::string& root : roots) CHECK(m.find(root) != std::string::npos);
  if (!secret.empty()) CHECK(m.find(secret) == std::string::npos);
}

}  // namespace

TEST_CASE("ConfinePath allows paths inside a root and returns them resolved", "[common][path_policy]") {
  testing::TempDir tmp("l2l-pp");
  const std::string root = tmp.path() + "/root";
  fs::create_directories(root + "/sub");
  tmp.Write("root/sub/a.bin", "x");
  const std::vector<std::string> roots = {root};

  CHECK(ConfinePath("k", root + "/sub/a.bin", "", roots, "hint").value() == Real(root) + "/sub/a.bin");
  CHECK(ConfinePath("k", "sub/a.bin", root, roots, "hint").value() == Real(root) + "/sub/a.bin");
  // '..' that stays inside is fine: the path is normalised before it is checked.
  CHECK(ConfinePath("k", "sub/../sub/a.bin", root, roots, "hint").value() == Real(root) + "/sub/a.bin");
  // The root itself.
  CHECK(ConfinePath("k", root, "", roots, "hint").value() == Real(root));
  // An export target: the file (and a directory below) need not exist yet.
  CHECK(ConfinePath("k", "out/new/model.safetensors", root, roots, "hint").value() ==
        Real(root) + "/out/new/model.safetensors");
  // A symlink inside the root that points inside it resolves to its target.
  fs::create_symlink(root + "/sub/a.bin", root + "/link.bin");
  CHECK(ConfinePath("k", "link.bin", root, roots, "hint").value() == Real(root) + "/sub/a.bin");
  // Any of several roots.
  fs::create_directories(tmp.path() + "/other");
  CHECK(ConfinePath("k", tmp.path() + "/other/x", "", {root, tmp.path() + "/other"}, "hint").ok());
}

TEST_CASE("ConfinePath refuses escapes naming the key and roots, not the file", "[common][path_policy]") {
  testing::TempDir tmp("l2l-pp");
  const std::string root = tmp.path() + "/root";
  const std::string outside = tmp.path() + "/outside";
  fs::create_directories(root);
  fs::create_directories(outside);
  tmp.Write("outside/secret.bin", "RIFFsecret");
  const std::vector<std::string> roots = {root};
  const std::vector<std::string> shown = {Real(root)};

  SECTION("'..' traversal") {
    ExpectRefusal(ConfinePath("data.train_path", "../outside/secret.bin", root, roots, "paths.data"),
                  "data.train_path", shown, "secret");
  }
  SECTION("an absolute path outside") {
    ExpectRefusal(ConfinePath("eval.data", outside + "/secret.bin", "", roots, "paths.data"), "eval.data", shown,
                  "secret");
  }
  SECTION("a symlink inside the root pointing out (file and directory)") {
    fs::create_symlink(outside + "/secret.bin", root + "/innocent.bin");
    ExpectRefusal(ConfinePath("model.from", "innocent.bin", root, roots, "paths.models"), "model.from", shown,
                  "secret");
    fs::create_directory_symlink(outside, root + "/dir");
    ExpectRefusal(ConfinePath("Export path", "dir/new.safetensors", root, roots, "state dir"), "Export path", shown,
                  "outside");
  }
  SECTION("a missing file outside gets the very same message as an existing one") {
    auto a = ConfinePath("k", outside + "/secret.bin", "", roots, "hint");
    auto b = ConfinePath("k", outside + "/missing.bin", "", roots, "hint");
    REQUIRE((!a.ok() && !b.ok()));
    CHECK(a.status().message() == b.status().message());
  }
  SECTION("a root that is a prefix of the name is not a parent") {
    fs::create_directories(root + "-evil");
    ExpectRefusal(ConfinePath("k", root + "-evil/x", "", roots, "hint"), "k", shown);
  }
  SECTION("no roots: nothing is allowed; an empty path is refused") {
    CHECK(ConfinePath("k", root + "/x", "", {}, "hint").status().code() == StatusCode::kPermissionDenied);
    CHECK(ConfinePath("k", "", root, roots, "hint").status().code() == StatusCode::kPermissionDenied);
  }
  SECTION("the hint says how to allow more") {
    auto r = ConfinePath("k", outside, "", roots, kAllowDataHint);
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("--allow-data") != std::string::npos);
  }
}

TEST_CASE("A job parsed with roots has every path it names confined before anything is opened",
          "[common][path_policy][config]") {
  testing::TempDir tmp("l2l-pp");
  const std::string jobs = tmp.path() + "/jobs";
  fs::create_directories(jobs);
  // A file outside whose first bytes must not show in any error.
  tmp.Write("outside/val.bin", "RIFF-not-a-tokens-file");
  tmp.Write("outside/p.yaml", "model:\n  n_layer: 2\n");
  PathRoots roots;
  roots.AddToAll(jobs);
  const std::string model = "model: {vocab_size: 64, seq_len: 8, d_model: 16, n_layer: 1, n_head: 2, d_ff: 32}\n";
  auto parse = [&](const std::string& yaml) { return ParseJobConfig(yaml, "<rpc>", jobs, &roots); };
  struct Case {
    std::string key, yaml;
  };
  const std::vector<Case> cases = {
      {"data.train_path", model + "data: {train_path: ../outside/val.bin}\n"},
      {"data.val_path", model + "data: {val_path: " + tmp.path() + "/outside/val.bin}\n"},
      {"eval.data", model + "eval: {data: ../outside/val.bin, every: 1, tokens: 33}\n"},
      {"model.from", "model: {from: ../outside}\n"},
      {"model.preset", "model: {preset: ../outside/p.yaml}\n"},
  };
  for (const Case& c : cases) {
    INFO(c.key);
    auto r = parse(c.yaml);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
    CHECK(r.status().message().find(c.key + ": refused: allowed only inside [" + Real(jobs) + "]") !=
          std::string::npos);
    CHECK(r.status().message().find("outside") == std::string::npos);
    CHECK(r.status().message().find("RIFF") == std::string::npos);
    CHECK(r.status().message().find("magic") == std::string::npos);
  }
  // A local job file: its eval.data outside is refused, not opened (no "magic" from
  // CheckEvalData, which LoadJobConfig runs on files inside).
  const std::string file = tmp.Write("jobs/job.yaml", model + "eval: {data: " + tmp.path() +
                                                         "/outside/val.bin, every: 1, tokens: 33}\n");
  auto local = LoadJobConfig(file, &roots);
  REQUIRE(!local.ok());
  CHECK(local.status().code() == StatusCode::kPermissionDenied);
  CHECK(local.status().message().find("eval.data: refused") != std::string::npos);
  CHECK(local.status().message().find("magic") == std::string::npos);
  // Without roots (a user's own tool) the same file is read and described.
  auto unconfined = LoadJobConfig(file);
  REQUIRE(!unconfined.ok());
  CHECK(unconfined.status().code() != StatusCode::kPermissionDenied);

  // Inside: resolved and kept; a bare preset name still finds the repo's presets.
  tmp.Write("jobs/train.bin", "");
  auto ok = parse(model + "data: {train_path: train.bin}\n");
  REQUIRE(ok.ok());
  CHECK(ok->data.train_path == Real(jobs) + "/train.bin");
  auto preset = ParseJobConfig("model: {preset: tiny}\n", "<rpc>", std::string(L2L_SOURCE_DIR) + "/configs", &roots);
  CHECK(preset.ok());
}

}  // namespace l2l

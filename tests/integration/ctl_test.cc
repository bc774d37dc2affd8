// l2lctl against a real l2l-eps (tests/integration/harness.h) on loopback: status (JSON
// compared with the harness's own Control client), pause/resume, checkpoint, export
// (the file opened with common/formats/safetensors.h and compared with the initialisation the
// test computes itself, since no step has run), watch (non-TTY and JSON, with a real
// worker, and its timeout), stop (the daemon exits 0), and the message and exit status
// when no daemon answers.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/formats/safetensors.h"
#include "common/model_spec.h"
#include "tests/integration/harness.h"
#include "tests/testing/jobs.h"

namespace l2l::itest {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

struct CtlRun {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs build/bin/l2lctl with `args`, stdout and stderr captured separately.
CtlRun Ctl(const TempDir& dir, const std::vector<std::string>& args, std::chrono::seconds timeout = 60s) {
  static int n = 0;
  const std::string out = dir.File("ctl" + std::to_string(n) + ".out");
  const std::string err = dir.File("ctl" + std::to_string(n++) + ".err");
  std::string cmd = "exec '" + BinaryPath("l2lctl") + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>'" + err + "'";
  const auto t0 = std::chrono::steady_clock::now();
  auto p = Process::Spawn({"/bin/sh", "-c", cmd}, out);
  REQUIRE(p.ok());
  auto code = (*p)->Wait(timeout);
  INFO(code.status().ToString());
  REQUIRE(code.ok());
  CtlRun r;
  r.code = *code;
  r.out = Slurp(out);
  r.err = Slurp(err);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Json ParseJson(const CtlRun& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  Json j = Json::parse(r.out, nullptr, false);
  REQUIRE(!j.is_discarded());
  return j;
}

JobConfig TinyJob(const std::string& tokens_path, int64_t steps) {
  JobConfig job = testing::GptJob({64, 8, 16, 2, 2, 32},
                                  {.steps = steps, .micro_batch_size = 2, .micro_batches = 2, .seed = 4242});
  job.data.train_path = tokens_path;
  return job;
}

std::unique_ptr<TempDir> MakeDir(const std::string& name) {
  auto d = TempDir::Create("l2l-ctl-" + name);
  REQUIRE(d.ok());
  return std::move(d).value();
}

void WriteSomeTokens(const std::string& path, int vocab) {
  std::vector<int32_t> t(4096);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 7 + i / 13) % vocab);
  REQUIRE(WriteTokens(path, t).ok());
}

// A loopback port nobody listens on (bound, then released).
int DeadPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

TEST_CASE("l2lctl status, pause, checkpoint, export and stop drive a real l2l-eps", "[integration][ctl]") {
  auto dir = MakeDir("ops");
  const JobConfig job = TinyJob(dir->File("train.bin"), 3);
  WriteSomeTokens(job.data.train_path, static_cast<int>(job.model.vocab_size));
  auto eps = EpsDaemon::Start(job, DaemonOptions{}, *dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  EpsDaemon& d = **eps;
  const std::string addr = d.address();
  const std::string state_dir = dir->File("eps-state-" + d.job_id());  // harness layout

  // status --json agrees with the harness's own client.
  const CtlRun st = Ctl(*dir, {"--eps", addr, "status", "--json"});
  INFO(st.err);
  REQUIRE(st.code == 0);
  const Json j = ParseJson(st);
  auto ref = d.GetStatus();
  REQUIRE(ref.ok());
  CHECK(j.at("ok") == true);
  CHECK(j.at("address") == addr);
  CHECK(j.at("job_id") == d.job_id());
  CHECK(j.at("state") == ref->state);
  CHECK(j.at("step") == 0);
  CHECK(j.at("total_steps") == job.train.steps);
  CHECK(j.at("layer_version").get<std::vector<int64_t>>() == ref->layer_version);
  CHECK(j.at("layer_version").size() == BuildLayout(job.model).size());
  CHECK(j.at("workers").is_array());
  CHECK(j.at("num_params").get<int64_t>() > 0);
  bool has_ram = false;
  for (const auto& m : j.at("memory")) has_ram |= m.at("tier") == "ram" && m.at("used_bytes").get<int64_t>() > 0;
  CHECK(has_ram);

  // The human screen, with the address found through the state dir's eps.port.
  const CtlRun human = Ctl(*dir, {"--state-dir", state_dir, "status"});
  INFO(human.err);
  REQUIRE(human.code == 0);
  CHECK(human.out.find(addr) != std::string::npos);
  CHECK(human.out.find("step 0/3") != std::string::npos);
  CHECK(human.out.find(d.job_id()) != std::string::npos);
  CHECK(human.out.find("memory") != std::string::npos);

  CHECK(Ctl(*dir, {"--eps", addr, "pause"}).code == 0);
  CHECK(Ctl(*dir, {"--eps", addr, "resume", "--json"}).code == 0);

  // watch with no workers: nothing moves, so --timeout ends it with status 3.
  const CtlRun w = Ctl(*dir, {"--eps", addr, "watch", "--timeout", "1", "--interval", "0.2"});
  CHECK(w.code == 3);
  CHECK(w.err.find("timed out") != std::string::npos);
  CHECK(w.out.find("step 0/3") != std::string::npos);  // not a TTY: plain lines

  // checkpoint to an explicit directory: relative paths land in the daemon's state dir.
  const std::string ckpt = state_dir + "/ckpt-manual";
  const CtlRun c = Ctl(*dir, {"--eps", addr, "checkpoint", "--dir", "ckpt-manual", "--json"});
  INFO(c.out << c.err);
  CHECK(c.code == 0);
  if (c.code == 0) {
    const Json cj = ParseJson(c);
    CHECK(cj.at("step") == 0);
    CHECK(cj.at("bytes").get<int64_t>() > 0);
    CHECK(fs::is_directory(ckpt));
    CHECK(!fs::is_empty(ckpt));
  }

  // export: a valid safetensors file holding the initial weights (no step has run).
  const std::string out = state_dir + "/exports/model.safetensors";
  fs::create_directories(state_dir + "/exports");
  const CtlRun e = Ctl(*dir, {"--eps", addr, "export", "--format", "safetensors", out});
  INFO(e.out << e.err);
  REQUIRE(e.code == 0);
  CHECK(e.out.find("model.safetensors") != std::string::npos);
  auto reader = SafeTensorsReader::Open(out);
  INFO(reader.status().ToString());
  REQUIRE(reader.ok());
  REQUIRE(reader->Find("wte.weight") != nullptr);
  CHECK(reader->Find("wte.weight")->shape == std::vector<int64_t>{job.model.vocab_size, job.model.d_model});
  size_t compared = 0;
  for (const LayerLayout& l : BuildLayout(job.model)) {
    std::vector<float> init(l.numel);
    InitLayerParams(job.model, l, job.train.seed, init.data());
    for (const ParamInfo& p : l.params) {
      if (!reader->Find(p.name)) continue;  // lm_head.weight is tied to wte, not stored
      auto got = reader->ReadAsFloat(p.name);
      REQUIRE(got.ok());
      REQUIRE(got->size() == p.numel);
      for (size_t i = 0; i < p.numel; ++i) REQUIRE((*got)[i] == init[p.offset + i]);
      ++compared;
    }
  }
  CHECK(compared == reader->tensors().size());
  CHECK(compared >= 4 + 12 * static_cast<size_t>(job.model.n_layer));

  // Bad usage is refused before any rpc; a path the daemon refuses (outside its state
  // dir, the default policy) is exit status 1 with the daemon's reason on stderr.
  CHECK(Ctl(*dir, {"--eps", addr, "export", "--format", "onnx", out}).code == 64);
  const CtlRun refused = Ctl(*dir, {"--eps", addr, "export", dir->File("outside.safetensors")});
  CHECK(refused.code == 1);
  // The reason names the key and the allowed directory, nothing of the refused file
  // (common/path_policy.h).
  CHECK(refused.err.find("Export path: refused: allowed only inside [") != std::string::npos);
  CHECK(refused.err.find(fs::canonical(d.state_dir()).string()) != std::string::npos);
  CHECK(refused.err.find("outside.safetensors") == std::string::npos);
  CHECK(!fs::exists(dir->File("outside.safetensors")));
  // A job without `lora:` has no adapter to export and nothing to merge (exit status 1,
  // the daemon's FAILED_PRECONDITION naming what to use; eps_server/export_choice.h).
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--format", "peft", "adapter"},
                                               std::vector<std::string>{"--format", "gguf-lora", "adapter.gguf"},
                                               std::vector<std::string>{"--format", "hf", "--merge", "merged"}}) {
    std::vector<std::string> argv = {"--eps", addr, "export"};
    argv.insert(argv.end(), args.begin(), args.end());
    const CtlRun r = Ctl(*dir, argv);
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(r.err.find("no lora: section") != std::string::npos);
    CHECK(!fs::exists(d.state_dir() + "/" + args.back()));
  }

  // stop: the daemon exits 0 and l2lctl waited for it.
  const CtlRun s = Ctl(*dir, {"--eps", addr, "stop", "--skip-checkpoint", "--json"});
  INFO(s.out << s.err);
  CHECK(s.code == 0);
  CHECK(ParseJson(s).at("exited") == true);
  auto exit_code = d.process().Wait(30s);
  REQUIRE(exit_code.ok());
  CHECK(*exit_code == 0);
  CHECK(d.ShmSegments().empty());
}

TEST_CASE("l2lctl watch follows a training job with a real worker to its end", "[integration][ctl]") {
  auto dir = MakeDir("watch");
  const JobConfig job = TinyJob(dir->File("train.bin"), 6);
  WriteSomeTokens(job.data.train_path, static_cast<int>(job.model.vocab_size));
  auto eps = EpsDaemon::Start(job, DaemonOptions{}, *dir);
  REQUIRE(eps.ok());
  const std::string addr = (*eps)->address();
  auto worker = StartWorker(addr, "w0", dir->File("worker.log"));
  REQUIRE(worker.ok());

  const CtlRun w = Ctl(*dir, {"--eps", addr, "watch", "--json", "--interval", "0.05", "--timeout", "120"}, 180s);
  INFO("stdout:\n" << w.out << "\nstderr:\n" << w.err << "\nworker:\n" << (*worker)->LogTail());
  REQUIRE(w.code == 0);
  std::istringstream lines(w.out);
  std::string line;
  int64_t prev = -1;
  Json last;
  int n = 0;
  while (std::getline(lines, line)) {
    last = Json::parse(line);
    CHECK(last.at("step").get<int64_t>() >= prev);  // progress never goes backwards
    CHECK(last.at("total_steps") == job.train.steps);
    prev = last.at("step");
    ++n;
  }
  REQUIRE(n >= 1);
  CHECK(last.at("done") == true);
  CHECK(last.at("step") == job.train.steps);
  CHECK(std::isfinite(last.at("loss").get<double>()));
  CHECK(last.at("loss").get<double>() > 0);
  // The update of the last completed step: work done and the part the workers could see.
  CHECK(last.at("update_s").get<double>() > 0);
  CHECK(last.at("update_lag_s").get<double>() >= 0);

  // Once finished, a plain watch returns at once with the final line.
  const CtlRun again = Ctl(*dir, {"--eps", addr, "watch"});
  CHECK(again.code == 0);
  CHECK(again.out.find("step 6/6") != std::string::npos);
  auto wc = (*worker)->Wait(60s);
  REQUIRE(wc.ok());
  CHECK(*wc == 0);
}

TEST_CASE("l2lctl names the address it tried and what to check when no daemon answers", "[integration][ctl]") {
  auto dir = MakeDir("dead");
  const std::string dead = "127.0.0.1:" + std::to_string(DeadPort());

  const CtlRun r = Ctl(*dir, {"--eps", dead, "status"});
  CHECK(r.code == 2);
  CHECK(r.err.find(dead) != std::string::npos);
  CHECK(r.err.find("is l2l-eps running") != std::string::npos);
  CHECK(r.err.find("eps.port") != std::string::npos);
  CHECK(r.seconds < 6.0);  // bounded: default connect timeout 3 s
  CHECK(r.out.empty());

  // --json: the error is machine-readable too.
  const CtlRun j = Ctl(*dir, {"--eps", dead, "--json", "stop"});
  CHECK(j.code == 2);
  const Json e = ParseJson(j);
  CHECK(e.at("ok") == false);
  CHECK(e.at("address") == dead);
  CHECK(e.at("error").at("code") == "UNAVAILABLE");

  // A stale eps.port in the state dir: the message names the file it came from.
  fs::create_directories(dir->File("state"));
  std::ofstream(dir->File("state/eps.port")) << dead.substr(dead.find(':') + 1) << "\n";
  const CtlRun s = Ctl(*dir, {"--state-dir", dir->File("state"), "--connect-timeout-ms", "500", "checkpoint"});
  CHECK(s.code == 2);
  CHECK(s.err.find(dir->File("state/eps.port")) != std::string::npos);
  CHECK(s.seconds < 4.0);

  // No eps.port at all: says where it looked.
  const CtlRun none = Ctl(*dir, {"--state-dir", dir->File("empty"), "status"});
  CHECK(none.code == 2);
  CHECK(none.err.find(dir->File("empty") + "/eps.port") != std::string::npos);
}

}  // namespace
}  // namespace l2l::itest

// Every path a job names is confined (common/path_policy.h, docs/operations.md "Files a
// job may name"), checked against the daemon and worker as operators run them:
//  * over the CreateJob rpc (an in-process daemon behind its real gRPC server): each of
//    data.train_path, data.val_path, eval.data, model.from, model.preset,
//    init_safetensors and imported_from (Export copies that directory's tokenizer files)
//    escaping the state dir by '..', by an absolute path and by a
//    symlink inside the state dir is PERMISSION_DENIED, naming the key and the allowed
//    roots and nothing of the file (a file starting "SECRET": today's eval.data error
//    printed "magic 1380140371", its first four bytes); no job is created;
//  * Export and Checkpoint targets escaping the state dir likewise;
//  * paths.data lets a CreateJob name a data file in a listed directory, and the
//    worker-facing Register reply carries the allowed data roots;
//  * a local job file (l2l-eps --job) naming files outside its own directory, the state
//    dir and paths.*: l2l-eps exits 1 before serving, with the same refusal;
//  * the positive end to end: l2l-eps --allow-data DIR with data in DIR trains (a real
//    worker runs the job's steps);
//  * a worker refuses data paths outside the roots its daemon sent (a fake daemon's
//    Register reply), before opening them.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "proto/control.grpc.pb.h"
#include "proto/data.grpc.pb.h"
#include "tests/integration/eps_test_util.h"
#include "tests/integration/harness.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace ctl = ::l2l::control::v1;
namespace data = ::l2l::data::v1;

constexpr const char* kSecret = "SECRET file, first four bytes 'SECR' = magic 1380140371";

std::string Real(const std::string& p) { return fs::canonical(p).string(); }

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A refusal names the key and the roots, and nothing of the refused file.
void CheckRefusal(const std::string& message, const std::string& key, const std::string& root) {
  INFO(message);
  CHECK(Has(message, key + ": refused: allowed only inside ["));
  CHECK(Has(message, root));
  CHECK(!Has(message, "SECR"));
  CHECK(!Has(message, "magic"));
  CHECK(!Has(message, "secret"));
  CHECK(!Has(message, "outside"));
  CHECK(!Has(message, "no such file"));
}

// A state dir, and beside it a directory the job must not reach holding a tokens-file
// name, a model dir, a preset and a safetensors file (none valid: the refusal must come
// before any is read).
struct Layout {
  std::unique_ptr<TempDir> tmp;
  std::string state, outside;
  Layout() {
    auto t = TempDir::Create("l2l-paths");
    REQUIRE(t.ok());
    tmp = std::move(t).value();
    state = tmp->File("state");
    outside = tmp->File("outside");
    fs::create_directories(state);
    tmp->Write("outside/secret.bin", kSecret);
    tmp->Write("outside/model/config.json", kSecret);
    tmp->Write("outside/secret.yaml", std::string("model:\n  n_layer: 2\n# ") + kSecret + "\n");
    tmp->Write("outside/secret.safetensors", kSecret);
    // Symlinks inside the state dir that lead out.
    fs::create_symlink(outside + "/secret.bin", state + "/link.bin");
    fs::create_directory_symlink(outside + "/model", state + "/link-model");
    fs::create_symlink(outside + "/secret.yaml", state + "/link.yaml");
    fs::create_symlink(outside + "/secret.safetensors", state + "/link.safetensors");
  }
};

// An in-process daemon behind its real gRPC server, for the rpc cases.
struct RpcDaemon {
  RpcDaemon(const std::string& state_dir, const PathRoots& paths) : core(Opts(state_dir, paths)) {
    auto s = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
    L2L_CHECK(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port()),
                                       grpc::InsecureChannelCredentials());
    control = ctl::Control::NewStub(channel);
    data_stub = data::Data::NewStub(channel);
  }
  ~RpcDaemon() {
    server->Shutdown();
    core.Stop();
  }
  static eps::CoreOptions Opts(const std::string& state_dir, const PathRoots& paths) {
    static int n = 0;
    eps::CoreOptions o;
    o.job_id = "paths" + std::to_string(getpid()) + "x" + std::to_string(n++);
    o.state_dir = state_dir;
    o.transport = Transport::kGrpc;
    o.paths = paths;
    return o;
  }
  grpc::Status CreateJob(const std::string& yaml, const std::string& init = "") {
    grpc::ClientContext c;
    ctl::CreateJobRequest req;
    req.set_config_yaml(yaml);
    req.set_init_safetensors(init);
    ctl::CreateJobReply rep;
    return control->CreateJob(&c, req, &rep);
  }
  eps::EpsCore core;
  std::unique_ptr<eps::EpsGrpcServer> server;
  std::unique_ptr<ctl::Control::Stub> control;
  std::unique_ptr<data::Data::Stub> data_stub;
};

// The job YAML naming `path` under `key` (init_safetensors travels beside the YAML).
std::string JobNaming(const std::string& key, const std::string& path) {
  JobConfig job = epstest::TinyJob();
  if (key == "model.from") return "model: {from: " + path + "}\n";
  if (key == "model.preset") return "model: {preset: " + path + "}\n";
  if (key == "imported_from") job.imported_from = path;
  if (key == "data.train_path") job.data.train_path = path;
  if (key == "data.val_path") job.data.val_path = path;
  if (key == "eval.data") {
    job.eval.data_path = path;
    job.eval.every = 1;
    job.eval.tokens = job.train.micro_batch_size * job.seq_len() + 1;
  }
  return JobConfigToYaml(job);
}

// The three escapes of each key: '..', an absolute path, a symlink inside leading out.
struct Escape {
  std::string key, dotdot, absolute, symlink;
};
std::vector<Escape> Escapes(const Layout& l) {
  return {
      {"data.train_path", "../outside/secret.bin", l.outside + "/secret.bin", "link.bin"},
      {"data.val_path", "../outside/secret.bin", l.outside + "/secret.bin", "link.bin"},
      {"eval.data", "../outside/secret.bin", l.outside + "/secret.bin", "link.bin"},
      {"model.from", "../outside/model", l.outside + "/model", "link-model"},
      {"imported_from", "../outside/model", l.outside + "/model", "link-model"},
      {"model.preset", "../outside/secret.yaml", l.outside + "/secret.yaml", "link.yaml"},
      {"init_safetensors", "../outside/secret.safetensors", l.outside + "/secret.safetensors", "link.safetensors"},
  };
}

}  // namespace

TEST_CASE("CreateJob refuses every path key escaping the state dir, naming the key and roots only",
          "[integration][security][paths]") {
  Layout l;
  RpcDaemon d(l.state, PathRoots{});
  for (const Escape& e : Escapes(l)) {
    for (const std::string& path : {e.dotdot, e.absolute, e.symlink}) {
      INFO(e.key << " = " << path);
      const grpc::Status s = e.key == "init_safetensors" ? d.CreateJob(JobNaming("", ""), path)
                                                         : d.CreateJob(JobNaming(e.key, path));
      CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
      CheckRefusal(s.error_message(), e.key, Real(l.state));
      CHECK(!d.core.has_job());
    }
  }
}

TEST_CASE("Export and Checkpoint targets escaping the state dir are refused naming the key and root",
          "[integration][security][paths]") {
  Layout l;
  RpcDaemon d(l.state, PathRoots{});
  REQUIRE(d.CreateJob(JobConfigToYaml(epstest::TinyJob())).ok());
  fs::create_directory_symlink(l.outside, l.state + "/out-link");
  for (const std::string& path : {std::string("../outside/x.safetensors"), l.outside + "/x.safetensors",
                                  std::string("out-link/x.safetensors")}) {
    INFO(path);
    grpc::ClientContext c;
    ctl::ExportRequest req;
    req.set_path(path);
    ctl::ExportReply rep;
    const grpc::Status s = d.control->Export(&c, req, &rep);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CheckRefusal(s.error_message(), "Export path", Real(l.state));
  }
  for (const std::string& dir : {std::string("../outside/ckpt"), l.outside + "/ckpt", std::string("out-link/ckpt")}) {
    INFO(dir);
    grpc::ClientContext c;
    ctl::CheckpointRequest req;
    req.set_dir(dir);
    ctl::CheckpointReply rep;
    const grpc::Status s = d.control->Checkpoint(&c, req, &rep);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CheckRefusal(s.error_message(), "Checkpoint dir", Real(l.state));
  }
  CHECK(!fs::exists(l.outside + "/x.safetensors"));
  CHECK(!fs::exists(l.outside + "/ckpt"));
}

TEST_CASE("paths.data lets a CreateJob name files in a listed directory, and Register sends the roots",
          "[integration][security][paths]") {
  Layout l;
  auto data_dir = TempDir::Create("l2l-paths-data");
  REQUIRE(data_dir.ok());
  auto job = SmallOpsJob(**data_dir);  // writes <data_dir>/train.bin
  REQUIRE(job.ok());
  PathRoots paths;
  paths.data = {(*data_dir)->path()};
  {
    RpcDaemon without(l.state, PathRoots{});
    const grpc::Status s = without.CreateJob(JobConfigToYaml(*job));
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CheckRefusal(s.error_message(), "data.train_path", Real(l.state));
  }
  RpcDaemon d(l.state, paths);
  // paths.data does not open model.from there.
  const grpc::Status from = d.CreateJob(JobNaming("model.from", (*data_dir)->path()));
  CHECK(from.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(d.CreateJob(JobConfigToYaml(*job)).ok());
  CHECK(d.core.job_config().data.train_path == Real((*data_dir)->File("train.bin")));

  grpc::ClientContext c;
  data::RegisterRequest req;
  req.set_worker_name("probe");
  req.set_transport("grpc");
  data::RegisterReply rep;
  REQUIRE(d.data_stub->Register(&c, req, &rep).ok());
  const std::vector<std::string> roots(rep.data_roots().begin(), rep.data_roots().end());
  CHECK(roots == std::vector<std::string>{Real((*data_dir)->path()), Real(l.state)});
}

TEST_CASE("A local job file naming a file outside its directory, the state dir and paths.* stops l2l-eps",
          "[integration][security][paths]") {
  Layout l;
  // The job file in its own directory; the state dir elsewhere.
  const std::string jobs = l.tmp->File("jobs");
  fs::create_directories(jobs);
  fs::create_symlink(l.outside + "/secret.bin", jobs + "/link.bin");
  fs::create_directory_symlink(l.outside + "/model", jobs + "/link-model");
  const std::string eps_yaml = l.tmp->Write("eps.yaml", "listen: 127.0.0.1:0\nstate_dir: " + l.state + "\n");
  struct Case {
    std::string key, path;
  };
  const std::vector<Case> cases = {
      {"data.train_path", l.outside + "/secret.bin"},      // absolute
      {"eval.data", "../outside/secret.bin"},              // '..'
      {"data.val_path", "link.bin"},                       // a symlink inside leading out
      {"model.from", "link-model"},                        // a symlink to a directory
      {"model.preset", "../outside/secret.yaml"},          // a preset path
  };
  int n = 0;
  for (const Case& c : cases) {
    INFO(c.key << " = " << c.path);
    const std::string job = l.tmp->Write("jobs/job" + std::to_string(n) + ".yaml", JobNaming(c.key, c.path));
    auto p = Process::Spawn({BinaryPath("l2l-eps"), "--config", eps_yaml, "--job", job, "--job-id",
                             "pathsl" + std::to_string(getpid()) + "x" + std::to_string(n)},
                            l.tmp->File("eps" + std::to_string(n) + ".log"));
    ++n;
    REQUIRE(p.ok());
    auto code = (*p)->Wait(30s);
    REQUIRE(code.ok());  // today's code serves the job instead of exiting
    CHECK(*code == 1);
    CheckRefusal((*p)->Log(), c.key, Real(jobs));
    CHECK(Has((*p)->Log(), Real(l.state)));
  }
}

TEST_CASE("l2l-eps --allow-data DIR: a job file naming data in DIR trains with a real worker",
          "[integration][security][paths]") {
  auto data_dir = TempDir::Create("l2l-paths-data");
  auto run_dir = TempDir::Create("l2l-paths-run");
  REQUIRE((data_dir.ok() && run_dir.ok()));
  auto job = SmallOpsJob(**data_dir);
  REQUIRE(job.ok());
  job->train.steps = 2;
  {  // Without the flag: refused at start.
    DaemonOptions o;
    o.wait_ready = false;
    auto d = EpsDaemon::Start(*job, o, **run_dir);
    REQUIRE(d.ok());
    auto code = (*d)->process().Wait(30s);
    REQUIRE(code.ok());
    CHECK(*code == 1);
    CheckRefusal((*d)->process().Log(), "data.train_path", Real((*run_dir)->path()));
  }
  DaemonOptions o;
  o.extra_args = {"--allow-data", (*data_dir)->path()};
  auto d = EpsDaemon::Start(*job, o, **run_dir);
  REQUIRE(d.ok());
  auto w = StartWorker((*d)->address(), "allowed", (*run_dir)->File("w.log"));
  REQUIRE(w.ok());
  auto c = (*w)->Wait(120s);
  REQUIRE(c.ok());
  INFO((*w)->LogTail());
  CHECK(*c == 0);
  CHECK(ParseSummary((*w)->Log()).at("steps") == 2);
}

namespace {

// A daemon that registers a worker with a job whose data file lies outside the roots it
// sends (a compromised or buggy daemon); every other call is unimplemented.
class OutOfRootsDaemon final : public data::Data::Service {
 public:
  OutOfRootsDaemon(JobConfig job, std::vector<std::string> roots) : job_(std::move(job)), roots_(std::move(roots)) {}
  grpc::Status Register(grpc::ServerContext*, const data::RegisterRequest*, data::RegisterReply* rep) override {
    rep->set_worker_id(0);
    rep->set_num_workers(1);
    rep->set_job_yaml(JobConfigToYaml(job_));
    rep->set_data_rank(0);
    rep->set_data_world(1);
    rep->set_transport("grpc");
    rep->set_registration_id(1);
    for (const LayerLayout& l : BuildLayout(job_.model)) rep->add_layer_numel(static_cast<int64_t>(l.numel));
    for (const std::string& r : roots_) rep->add_data_roots(r);
    return grpc::Status::OK;
  }

 private:
  JobConfig job_;
  std::vector<std::string> roots_;
};

}  // namespace

TEST_CASE("A worker refuses the daemon's data paths outside the roots the daemon sent",
          "[integration][security][paths]") {
  auto data_dir = TempDir::Create("l2l-paths-wdata");
  auto allowed = TempDir::Create("l2l-paths-wallowed");
  REQUIRE((data_dir.ok() && allowed.ok()));
  auto job = SmallOpsJob(**data_dir);  // a valid tokens file, outside `allowed`
  REQUIRE(job.ok());
  OutOfRootsDaemon service(*job, {Real((*allowed)->path())});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server);
  REQUIRE(port > 0);
  auto w = StartWorker("127.0.0.1:" + std::to_string(port), "strict", (*allowed)->File("w.log"),
                       {"--connect-timeout-ms", "5000"});
  REQUIRE(w.ok());
  auto c = (*w)->Wait(60s);
  REQUIRE(c.ok());
  const std::string log = (*w)->Log();
  INFO(log);
  CHECK(*c == 1);
  CHECK(Has(log, "data.train_path: refused: allowed only inside [" + Real((*allowed)->path()) + "]"));
  server->Shutdown();
}

}  // namespace l2l::itest

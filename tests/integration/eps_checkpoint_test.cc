// Checkpoints, resume, export/import and shutdown of the real l2l-eps daemon (a child
// process, so kill -9 is real), driven by scripted fake workers (worker/eps_client.h:
// one over shared memory, one over gRPC) that push known gradients. Expected weights
// come from the test's own AdamW reference (eps_test_util.h).
#include <catch2/catch.hpp>

#include <algorithm>

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/dtype.h"
#include "common/file_util.h"
#include "common/formats/model_io.h"
#include "eps_server/checkpoint.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "proto/control.grpc.pb.h"
#include "tests/integration/eps_test_util.h"
#include "tests/integration/harness.h"
#include "worker/eps_client.h"

namespace l2l {
namespace {

namespace fs = std::filesystem;
namespace ctl = ::l2l::control::v1;
using namespace std::chrono_literals;
using epstest::Grad;
using epstest::Reference;
using epstest::TinyJob;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// An l2l-eps child process with its own state dir.
struct EpsProcess {
  // extra: more daemon YAML lines.
  static std::unique_ptr<EpsProcess> Start(const itest::TempDir& dir, const std::string& job_id,
                                           const std::vector<std::string>& args, const std::string& extra = "") {
    auto p = std::make_unique<EpsProcess>();
    p->state_dir = dir.File("state");
    p->cfg = dir.File(job_id + "-eps.yaml");
    std::ofstream e(p->cfg);
    e << "listen: 127.0.0.1:0\nstate_dir: " << p->state_dir << "\njob_id: " << job_id
      << "\nexpected_workers: 2\nheartbeat_timeout_ms: 0\n" << extra;
    e.close();
    fs::remove(p->state_dir + "/eps.port");
    std::vector<std::string> argv = {itest::BinaryPath("l2l-eps"), "--config", p->cfg};
    argv.insert(argv.end(), args.begin(), args.end());
    static int n = 0;
    auto proc = itest::Process::Spawn(argv, dir.File(job_id + "-eps" + std::to_string(n++) + ".log"));
    L2L_CHECK(proc.ok()) << proc.status().ToString();
    p->proc = std::move(proc).value();
    return p;
  }
  // Waits for eps.port; false when the process exited first.
  bool WaitReady() {
    for (int i = 0; i < 1500; ++i) {
      std::ifstream pf(state_dir + "/eps.port");
      int port = 0;
      if (pf >> port && port > 0) {
        address = "127.0.0.1:" + std::to_string(port);
        control = ctl::Control::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
        return true;
      }
      if (!proc->Running()) return false;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  ctl::GetStatusReply Status() {
    grpc::ClientContext c;
    ctl::GetStatusReply rep;
    grpc::Status s = control->GetStatus(&c, ctl::GetStatusRequest(), &rep);
    L2L_CHECK(s.ok()) << s.error_message();
    return rep;
  }
  grpc::Status Checkpoint(const std::string& dir, ctl::CheckpointReply* rep) {
    grpc::ClientContext c;
    ctl::CheckpointRequest req;
    req.set_dir(dir);
    return control->Checkpoint(&c, req, rep);
  }
  std::string state_dir, cfg, address;
  std::unique_ptr<itest::Process> proc;
  std::unique_ptr<ctl::Control::Stub> control;
};

std::unique_ptr<worker::EpsClient> Connect(const std::string& address, const std::string& transport) {
  worker::ClientOptions o;
  o.transport = ParseTransport(transport).value();
  o.connect_timeout = 5000ms;
  o.heartbeat_interval = 100ms;
  auto c = worker::ConnectEps(address, o);
  L2L_CHECK(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

std::string Position(int id, int64_t step) { return "pos-w" + std::to_string(id) + "-s" + std::to_string(step); }

// Runs steps [first, last) on one client: every layer checked against expect[step]
// (f32, exact), gradients pushed in backward order, StepDone with a data position.
void RunSteps(worker::EpsClient* c, int64_t first, int64_t last, int64_t mb,
              const std::vector<std::vector<std::vector<float>>>& expect, std::atomic<int>* bad) {
  const int id = c->registration().worker_id;
  const auto layouts = BuildLayout(c->registration().job.model);
  for (int64_t step = first; step < last; ++step) {
    for (int64_t l = 0; l < static_cast<int64_t>(layouts.size()); ++l) {
      auto w = c->AcquireLayer(l, step, 20s);
      if (!w.ok() || w->version != step) {
        ++*bad;
        continue;
      }
      const float* got = static_cast<const float*>(w->data);
      if (!std::equal(got, got + w->numel, expect[step][l].begin())) ++*bad;
      c->ReleaseLayer(l);
    }
    for (int64_t l = static_cast<int64_t>(layouts.size()) - 1; l >= 0; --l) {
      auto g = Grad(step, id, l, layouts[l].numel);
      if (!c->PushGradient(l, step, mb, g.data(), g.size()).ok()) ++*bad;
    }
    worker::StepReport r;
    r.step = step;
    r.loss = 1.0;
    r.tokens = 10;
    r.data_position = Position(id, step + 1);
    if (!c->StepDone(r).ok()) ++*bad;
  }
}

// Reference weights at every version 0..steps for workers {0,1} with mbs {2,3}.
std::vector<std::vector<std::vector<float>>> Expected(const JobConfig& job, Reference* ref = nullptr) {
  Reference r(job);
  std::vector<std::vector<std::vector<float>>> out;
  for (int64_t s = 0; s <= job.train.steps; ++s) {
    out.push_back(r.p);
    if (s < job.train.steps) r.Step(s, {0, 1}, {2, 3});
  }
  if (ref != nullptr) *ref = r;
  return out;
}

void RunBoth(worker::EpsClient* a, worker::EpsClient* b, int64_t first, int64_t last,
             const std::vector<std::vector<std::vector<float>>>& expect) {
  std::atomic<int> bad{0};
  auto mb = [](worker::EpsClient* c) { return c->registration().worker_id == 0 ? int64_t{2} : int64_t{3}; };
  std::thread ta([&] { RunSteps(a, first, last, mb(a), expect, &bad); });
  std::thread tb([&] { RunSteps(b, first, last, mb(b), expect, &bad); });
  ta.join();
  tb.join();
  REQUIRE(bad.load() == 0);
}

std::vector<std::string> LayerFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("layer-", 0) == 0) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("EPS checkpoint survives kill -9: resume is byte-identical and training continues exactly",
          "[integration][eps][checkpoint]") {
  auto tmp = itest::TempDir::Create("eps-ckpt");
  REQUIRE(tmp.ok());
  const auto& dir = **tmp;
  JobConfig job = TinyJob(DType::kF32, 4);
  job.train.clip = l2l::ClipMode::kNone;  // layers update as their gradients arrive (see the half step)
  // The EPS sees flat layer buffers only: a Llama-family job checkpoints the same way.
  const bool llama = GENERATE(false, true);
  if (llama) {
    job.model.family = ModelFamily::kLlama;
    job.model.n_kv_heads = 2;
    job.model.tied_embeddings = false;
    job.model.rope_scaling = {RopeScalingType::kLinear, 2.0, 1.0, 4.0, 8192};
  }
  INFO("family " << ToString(job.model.family));
  {
    std::ofstream(dir.File("job.yaml")) << JobConfigToYaml(job);
  }
  const std::string job_id = "ckpt" + std::string(llama ? "llama" : "") + std::to_string(getpid());
  const auto expect = Expected(job);
  std::string ckpt;
  {
    auto eps = EpsProcess::Start(dir, job_id, {"--job", dir.File("job.yaml")});
    REQUIRE(eps->WaitReady());
    auto a = Connect(eps->address, "shm");
    auto b = Connect(eps->address, "grpc");
    RunBoth(a.get(), b.get(), 0, 2, expect);
    ctl::CheckpointReply rep;
    grpc::Status s = eps->Checkpoint("", &rep);
    REQUIRE(s.ok());
    CHECK(rep.step() == 2);
    ckpt = rep.dir();
    CHECK(fs::path(ckpt).filename() == "step-00000002");
    CHECK(ReadAll(eps->state_dir + "/checkpoints/latest") == "step-00000002\n");
    CHECK(eps->Status().last_checkpoint() == ckpt);
    // Step 2 half done (layer L-1 pushed by both, so it is updated at once; the step is
    // published only when complete), then kill -9.
    const auto layouts = BuildLayout(job.model);
    const int64_t top = static_cast<int64_t>(layouts.size()) - 1;
    for (auto* c : {a.get(), b.get()}) {
      auto g = Grad(2, c->registration().worker_id, top, layouts[top].numel);
      REQUIRE(c->PushGradient(top, 2, 1, g.data(), g.size()).ok());
    }
    std::this_thread::sleep_for(300ms);  // the top layer's update runs meanwhile
    eps->proc->Signal(SIGKILL);
    auto rc = eps->proc->Wait(10s);
    REQUIRE(rc.ok());
    CHECK(*rc == 128 + SIGKILL);
  }
  // The checkpoint on disk is complete and untouched by the crash.
  const auto files = LayerFiles(ckpt);
  REQUIRE(files.size() == static_cast<size_t>(job.model.NumLayers()));
  std::vector<std::string> before;
  for (const auto& f : files) before.push_back(ReadAll(ckpt + "/" + f));

  // Resume from the checkpoint root (follows `latest`).
  auto eps = EpsProcess::Start(dir, job_id, {"--resume", dir.File("state/checkpoints")});
  REQUIRE(eps->WaitReady());
  auto st = eps->Status();
  CHECK(st.step() == 2);
  for (int64_t v : st.layer_version()) CHECK(v == 2);
  // Its state, written out again, is the checkpoint byte for byte.
  ctl::CheckpointReply again;
  grpc::Status s = eps->Checkpoint("again", &again);
  REQUIRE(s.ok());
  CHECK(again.dir() == fs::weakly_canonical(eps->state_dir + "/again").string());
  REQUIRE(LayerFiles(again.dir()) == files);
  for (size_t i = 0; i < files.size(); ++i) {
    if (ReadAll(again.dir() + "/" + files[i]) != before[i]) FAIL("layer file " << files[i] << " differs after resume");
  }
  // An explicit dir does not move `latest`.
  CHECK(ReadAll(eps->state_dir + "/checkpoints/latest") == "step-00000002\n");
  // Workers get start step 2 and their data positions; steps 2 and 3 equal the
  // uninterrupted reference exactly.
  auto a = Connect(eps->address, "shm");
  auto b = Connect(eps->address, "grpc");
  for (auto* c : {a.get(), b.get()}) {
    CHECK(c->registration().start_step == 2);
    CHECK(c->registration().data_position == Position(c->registration().worker_id, 2));
  }
  RunBoth(a.get(), b.get(), 2, 4, expect);
  for (int64_t l = 0; l < job.model.NumLayers(); ++l) {
    auto w = a->AcquireLayer(l, 4, 10s);
    REQUIRE(w.ok());
    CHECK(w->version == 4);
    const float* got = static_cast<const float*>(w->data);
    CHECK(std::equal(got, got + w->numel, expect[4][l].begin()));
    a->ReleaseLayer(l);
  }
  a.reset();
  b.reset();
  // SIGTERM: exit 0, final checkpoint of step 4, shared memory removed.
  eps->proc->Signal(SIGTERM);
  auto rc = eps->proc->Wait(20s);
  REQUIRE(rc.ok());
  CHECK(*rc == 0);
  CHECK(ReadAll(eps->state_dir + "/checkpoints/latest") == "step-00000004\n");
  auto m = ReadFileToString(eps->state_dir + "/checkpoints/step-00000004/manifest.json");
  REQUIRE(m.ok());
  CHECK(m->find(Position(1, 4)) != std::string::npos);
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    CHECK(e.path().filename().string().rfind("l2l-" + job_id + "-", 0) != 0);
  }
}

TEST_CASE("EPS --resume of a bad checkpoint fails naming the file and changes nothing",
          "[integration][eps][checkpoint]") {
  auto tmp = itest::TempDir::Create("eps-badckpt");
  REQUIRE(tmp.ok());
  const auto& dir = **tmp;
  const JobConfig job = TinyJob(DType::kF32, 4);
  const std::string root = dir.File("state/checkpoints");
  {
    eps::CoreOptions o;
    o.job_id = "badckpt" + std::to_string(getpid());
    o.state_dir = dir.File("state");
    o.transport = l2l::Transport::kGrpc;
    eps::EpsCore core(o);
    REQUIRE(core.CreateJob(job).ok());
    auto r = core.Checkpoint("");
    REQUIRE(r.ok());
    CHECK(r->dir == root + "/step-00000000");
  }
  const std::string ck = root + "/step-00000000";
  auto snapshot = [&] {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) files[e.path().string()] = ReadAll(e.path().string());
    }
    return files;
  };
  const std::string job_id = "bad" + std::to_string(getpid());
  auto expect_fail = [&](const std::string& what, const std::string& needle) {
    const auto before = snapshot();
    auto eps = EpsProcess::Start(dir, job_id, {"--resume", root});
    auto rc = eps->proc->Wait(20s);
    REQUIRE(rc.ok());
    INFO(what << ": " << eps->proc->Log());
    CHECK(*rc == 1);
    CHECK(eps->proc->Log().find(needle) != std::string::npos);
    CHECK(snapshot() == before);
  };
  SECTION("truncated layer file") {
    fs::resize_file(ck + "/layer-0002.bin", fs::file_size(ck + "/layer-0002.bin") - 8);
    expect_fail("truncated", "layer-0002.bin");
  }
  SECTION("corrupt layer file") {
    std::fstream f(ck + "/layer-0001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    const char c = static_cast<char>(f.get());
    f.seekp(200);
    f.put(static_cast<char>(c ^ 0x55));
    f.close();
    expect_fail("corrupt", "layer-0001.bin is corrupt");
  }
  SECTION("missing layer file") {
    fs::remove(ck + "/layer-0003.bin");
    expect_fail("missing", "layer-0003.bin is missing");
  }
  SECTION("corrupt manifest") {
    std::ofstream(ck + "/manifest.json") << "{\"format\": \"l2l-checkpoint\", \"version\": 1, \"step\": ";
    expect_fail("manifest", "manifest.json");
  }
  SECTION("a manifest integer given as a float") {
    // 1.4e21 overflowed the integer conversion (undefined behaviour) before: now refused.
    std::string text = ReadAll(ck + "/manifest.json");
    const std::regex workers(R"("expected_workers"\s*:\s*[0-9]+)");
    REQUIRE(std::regex_search(text, workers));
    text = std::regex_replace(text, workers, R"("expected_workers": 1.4e21)");
    std::ofstream(ck + "/manifest.json") << text;
    expect_fail("float", "expected_workers");
  }
  SECTION("latest names a missing directory") {
    std::ofstream(root + "/latest") << "step-00000099\n";
    expect_fail("latest", "step-00000099");
  }
  SECTION("no checkpoint at all") {
    auto eps = EpsProcess::Start(dir, job_id, {"--resume", dir.File("nowhere")});
    auto rc = eps->proc->Wait(20s);
    REQUIRE(rc.ok());
    CHECK(*rc == 1);
    CHECK(eps->proc->Log().find("nowhere") != std::string::npos);
  }
}

namespace {

// In-process daemon for the Export / CreateJob rpc tests.
struct LocalDaemon {
  explicit LocalDaemon(const std::string& state_dir, bool allow_abs = false) : core(Opts(state_dir, allow_abs)) {
    auto s = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
    L2L_CHECK(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    control = ctl::Control::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port()),
                                                        grpc::InsecureChannelCredentials()));
  }
  ~LocalDaemon() {
    server->Shutdown();
    core.Stop();
  }
  static eps::CoreOptions Opts(const std::string& state_dir, bool allow_abs) {
    static int n = 0;
    eps::CoreOptions o;
    o.job_id = "exp" + std::to_string(getpid()) + "x" + std::to_string(n++);
    o.state_dir = state_dir;
    o.transport = l2l::Transport::kGrpc;
    o.allow_absolute_paths = allow_abs;
    return o;
  }
  grpc::Status Export(const std::string& path, const std::string& dtype, ctl::ExportReply* rep,
                      const std::string& format = "", int64_t max_shard_bytes = 0) {
    grpc::ClientContext c;
    ctl::ExportRequest req;
    req.set_path(path);
    req.set_dtype(dtype);
    req.set_format(format);
    req.set_max_shard_bytes(max_shard_bytes);
    return control->Export(&c, req, rep);
  }
  grpc::Status CreateJob(const JobConfig& job, const std::string& init) {
    grpc::ClientContext c;
    ctl::CreateJobRequest req;
    req.set_config_yaml(JobConfigToYaml(job));
    req.set_init_safetensors(init);
    ctl::CreateJobReply rep;
    return control->CreateJob(&c, req, &rep);
  }
  eps::EpsCore core;
  std::unique_ptr<eps::EpsGrpcServer> server;
  std::unique_ptr<ctl::Control::Stub> control;
};

std::vector<std::vector<float>> Master(eps::EpsCore* core) {
  std::vector<std::vector<float>> out;
  for (int64_t l = 0; l < core->store()->num_layers(); ++l) {
    out.emplace_back(core->store()->layout(l).numel);
    REQUIRE(core->store()->ReadState(l, 0, out.back().data()).ok());
  }
  return out;
}

}  // namespace

TEST_CASE("EPS Export writes HF-named safetensors inside the state dir and CreateJob loads them",
          "[integration][eps][export]") {
  auto tmp = itest::TempDir::Create("eps-export");
  REQUIRE(tmp.ok());
  const std::string state = (*tmp)->File("state");
  fs::create_directories(state);
  JobConfig job = TinyJob(DType::kF32, 4);
  job.train.seed = 5;
  LocalDaemon d(state);
  REQUIRE(d.CreateJob(job, "").ok());
  const auto master = Master(&d.core);

  ctl::ExportReply rep;
  REQUIRE(d.Export("out/model.safetensors", "", &rep).ok());
  CHECK(rep.path() == fs::weakly_canonical(state + "/out/model.safetensors").string());
  CHECK(rep.bytes() == static_cast<int64_t>(fs::file_size(rep.path())));
  auto loaded = LoadModel(rep.path(), job.model);
  REQUIRE(loaded.ok());
  CHECK(loaded->layers == master);

  REQUIRE(d.Export("model-bf16.safetensors", "bf16", &rep).ok());
  auto lb = LoadModel(rep.path(), job.model);
  REQUIRE(lb.ok());
  for (size_t l = 0; l < master.size(); ++l) {
    for (size_t i = 0; i < master[l].size(); ++i) {
      if (lb->layers[l][i] != Bf16ToFloat(FloatToBf16(master[l][i]))) FAIL("bf16 export differs at " << l << "," << i);
    }
  }

  SECTION("escapes are refused") {
    auto code = [&](const std::string& p) { return d.Export(p, "", &rep).error_code(); };
    CHECK(code("../escape.safetensors") == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(code("out/../../escape.safetensors") == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(code((*tmp)->File("abs.safetensors")) == grpc::StatusCode::PERMISSION_DENIED);
    fs::create_directories((*tmp)->File("outside"));
    fs::create_directory_symlink((*tmp)->File("outside"), state + "/link");
    CHECK(code("link/x.safetensors") == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(!fs::exists((*tmp)->File("escape.safetensors")));
    CHECK(!fs::exists((*tmp)->File("abs.safetensors")));
    CHECK(fs::is_empty((*tmp)->File("outside")));
    CHECK(d.Export("x.safetensors", "f16", &rep).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    // An absolute path inside the state dir is fine.
    CHECK(d.Export(state + "/inside.safetensors", "", &rep).ok());
  }
  SECTION("hf export shards at max_shard_bytes as transformers names them; other formats refuse it") {
    REQUIRE(d.Export("hf-sharded", "", &rep, "hf", 4096).ok());
    const std::string dir = state + "/hf-sharded";
    CHECK(fs::exists(dir + "/model.safetensors.index.json"));
    CHECK(!fs::exists(dir + "/model.safetensors"));
    std::vector<std::string> shards;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("model-", 0) == 0) shards.push_back(n);
    }
    std::sort(shards.begin(), shards.end());
    REQUIRE(shards.size() >= 2);
    char want[64];
    std::snprintf(want, sizeof(want), "model-00001-of-%05zu.safetensors", shards.size());
    CHECK(shards.front() == want);
    // 0 is transformers' 5 GB: one file.
    REQUIRE(d.Export("hf-one", "", &rep, "hf", 0).ok());
    CHECK(fs::exists(state + "/hf-one/model.safetensors"));
    CHECK(!fs::exists(state + "/hf-one/model.safetensors.index.json"));
    CHECK(d.Export("x.safetensors", "", &rep, "", 4096).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(d.Export("x.gguf", "", &rep, "gguf", 4096).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    const grpc::Status neg = d.Export("hf-neg", "", &rep, "hf", -1);
    CHECK(neg.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(neg.error_message().find("max_shard_bytes=-1") != std::string::npos);
  }
  SECTION("absolute paths outside need allow_absolute_paths") {
    LocalDaemon open(state, /*allow_abs=*/true);
    REQUIRE(open.CreateJob(job, "").ok());
    CHECK(open.Export((*tmp)->File("abs.safetensors"), "", &rep).ok());
    CHECK(fs::exists((*tmp)->File("abs.safetensors")));
  }
  SECTION("CreateJob with init_safetensors starts from the file") {
    JobConfig other = job;
    other.train.seed = 99;  // a different seed: the weights must come from the file
    LocalDaemon e(state);
    REQUIRE(e.CreateJob(other, "out/model.safetensors").ok());
    CHECK(Master(&e.core) == master);
    std::vector<float> mv(e.core.store()->layout(1).numel);
    REQUIRE(e.core.store()->ReadState(1, 1, mv.data()).ok());
    CHECK(std::all_of(mv.begin(), mv.end(), [](float x) { return x == 0.0f; }));
  }
  SECTION("CreateJob with a file of another shape names the tensor") {
    JobConfig bigger = job;
    bigger.model.d_ff = 64;
    LocalDaemon e(state);
    grpc::Status s = e.CreateJob(bigger, "out/model.safetensors");
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("model.safetensors") != std::string::npos);
    CHECK(s.error_message().find("\"d_ff\":128") != std::string::npos);
    CHECK(!e.core.has_job());
    grpc::Status missing = e.CreateJob(job, "missing.safetensors");
    CHECK(!missing.ok());
    CHECK(missing.error_message().find("missing.safetensors") != std::string::npos);
    CHECK(!e.core.has_job());
  }
}

}  // namespace l2l

namespace l2l {

TEST_CASE("EPS checkpoints every N steps and at shutdown, but never a half-applied step",
          "[integration][eps][checkpoint]") {
  auto tmp = itest::TempDir::Create("eps-every");
  REQUIRE(tmp.ok());
  JobConfig job = TinyJob(DType::kF32, 4);
  job.train.clip = l2l::ClipMode::kNone;
  eps::CoreOptions o;
  o.job_id = "every" + std::to_string(getpid());
  o.expected_workers = 2;
  o.state_dir = (*tmp)->path();
  o.checkpoint_every = 2;
  eps::EpsCore core(o);
  REQUIRE(core.CreateJob(job).ok());
  auto server = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  REQUIRE(server.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  const auto expect = Expected(job);
  auto a = Connect(address, "shm");
  auto b = Connect(address, "grpc");
  RunBoth(a.get(), b.get(), 0, 3, expect);
  const std::string root = core.checkpoint_root();
  // Step 2 was checkpointed (at its boundary, before any step-2 update), step 1 was not.
  for (int i = 0; i < 500 && !fs::exists(root + "/step-00000002/manifest.json"); ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(fs::exists(root + "/step-00000002/manifest.json"));
  CHECK(!fs::exists(root + "/step-00000001"));
  CHECK(ReadAll(root + "/latest") == "step-00000002\n");
  {
    auto m = eps::ReadCheckpointManifest(root + "/step-00000002");
    REQUIRE(m.ok());
    CHECK(m->meta.step == 2);
    REQUIRE(m->meta.workers.size() == 2);
    for (const auto& w : m->meta.workers) CHECK(w.data_position == Position(w.id, 2));
    // Its master is the reference after two steps.
    auto store = eps::ParamStore::Create(job.model, eps::ParamStoreOptions{});
    REQUIRE(store.ok());
    REQUIRE(eps::LoadCheckpointState(*m, store->get()).ok());
    for (int64_t l = 0; l < job.model.NumLayers(); ++l) {
      std::vector<float> master((*store)->layout(l).numel);
      REQUIRE((*store)->ReadState(l, 0, master.data()).ok());
      CHECK(master == expect[2][l]);
    }
  }
  // Step 3 half applied (both pushed the top layer), then an aborting shutdown: no
  // checkpoint of a mixed state; `latest` stays at step 2.
  const auto layouts = BuildLayout(job.model);
  const int64_t top = static_cast<int64_t>(layouts.size()) - 1;
  for (auto* c : {a.get(), b.get()}) {
    // As a worker does, the step-3 forward first (version 3 of every layer: step 2's
    // updates, which StepDone(2) does not wait for, are done), then the gradient.
    for (int64_t l = 0; l <= top; ++l) {
      auto w = c->AcquireLayer(l, 3, 20s);
      REQUIRE(w.ok());
      c->ReleaseLayer(l);
    }
    auto g = Grad(3, c->registration().worker_id, top, layouts[top].numel);
    REQUIRE(c->PushGradient(top, 3, 1, g.data(), g.size()).ok());
  }
  // The top layer is updated at once (its master moves off step 3's), published only
  // with the whole step.
  std::vector<float> top_master(layouts[top].numel);
  for (int i = 0; i < 500; ++i) {
    REQUIRE(core.store()->ReadState(top, 0, top_master.data()).ok());
    if (top_master != expect[3][top]) break;
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(top_master != expect[3][top]);
  CHECK(core.store()->published_version(top) == 3);
  CHECK(core.PrepareShutdown(/*abort_step=*/true, /*skip_checkpoint=*/false, 1s).ok());
  CHECK(!fs::exists(root + "/step-00000003"));
  CHECK(!fs::exists(root + "/step-00000004"));
  CHECK(ReadAll(root + "/latest") == "step-00000002\n");
  (*server)->Shutdown();
  core.Stop();
}

TEST_CASE("EPS shutdown at a step boundary writes the final checkpoint", "[integration][eps][checkpoint]") {
  auto tmp = itest::TempDir::Create("eps-final");
  REQUIRE(tmp.ok());
  const JobConfig job = TinyJob(DType::kF32, 4);
  eps::CoreOptions o;
  o.job_id = "final" + std::to_string(getpid());
  o.expected_workers = 2;
  o.state_dir = (*tmp)->path();
  o.transport = l2l::Transport::kGrpc;
  eps::EpsCore core(o);
  REQUIRE(core.CreateJob(job).ok());
  auto server = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  REQUIRE(server.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  const auto expect = Expected(job);
  auto a = Connect(address, "grpc");
  auto b = Connect(address, "grpc");
  RunBoth(a.get(), b.get(), 0, 1, expect);
  // Gradients of step 1 that arrived but were applied nowhere (global clip) do not
  // stop the final checkpoint of step 1. Worker a pushes one as a worker does: after the
  // forward pass of step 1 fetched version 1 of every layer. (StepDone(0) does not wait
  // for step 0's updates; pushing before they published version 1 is refused, "the layer
  // expects step 0", and a step-0 update still running is no step boundary.)
  const auto layouts = BuildLayout(job.model);
  for (int64_t l = 0; l < static_cast<int64_t>(layouts.size()); ++l) {
    auto w = a->AcquireLayer(l, 1, 20s);
    REQUIRE(w.ok());
    CHECK(w->version == 1);
    a->ReleaseLayer(l);
  }
  auto g = Grad(1, 0, 3, layouts[3].numel);
  const Status pushed = a->PushGradient(3, 1, 1, g.data(), g.size());
  INFO(pushed.ToString());
  REQUIRE(pushed.ok());
  REQUIRE(core.PrepareShutdown(/*abort_step=*/true, false, 1s).ok());
  const std::string dir = core.checkpoint_root() + "/step-00000001";
  auto m = eps::ReadCheckpointManifest(dir);
  REQUIRE(m.ok());
  CHECK(m->meta.step == 1);
  CHECK(ReadAll(core.checkpoint_root() + "/latest") == "step-00000001\n");
  (*server)->Shutdown();
  core.Stop();
}

}  // namespace l2l

// The worker's interleaved-optimizer thread (see device_updater.h).
#include "worker/device_updater.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/adamw.h"
#include "common/env.h"
#include "common/logging.h"

namespace l2l::worker {

Result<OptimizerOffer> MeasureDeviceRates(kernels::Backend* be, size_t n) {
  OptimizerOffer o;
  o.takes_updates = true;
  o.device = be->name();
  const size_t bytes = n * sizeof(float);
  std::vector<float> host(4 * n, 1e-3f);
  L2L_ASSIGN_OR_RETURN(void* mem, be->Alloc(4 * bytes));
  float* d = static_cast<float*>(mem);
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  be->CopyToDevice(d, host.data(), 4 * bytes);
  AdamWStepArgs args{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .t = 1,
                     .grad_scale = 1.0f};
  be->AdamW(d, d + 3 * n, d + n, d + 2 * n, static_cast<int64_t>(n), args);
  be->Synchronize();  // the untimed pass: first-touch, kernel load
  auto t0 = clock::now();
  args.t = 2;
  be->AdamW(d, d + 3 * n, d + n, d + 2 * n, static_cast<int64_t>(n), args);
  be->Synchronize();
  double s = seconds(t0);
  o.update_params_per_s = s > 0 ? static_cast<double>(n) / s : 1e12;
  if (be->kind() != kernels::DeviceKind::kCpu) {
    // Pageable host memory: what the exchange segment's copies see (it is not pinned).
    t0 = clock::now();
    be->CopyToDevice(d, host.data(), 3 * bytes);
    be->Synchronize();
    s = seconds(t0);
    o.h2d_bytes_per_s = s > 0 ? 3.0 * static_cast<double>(bytes) / s : 0;
    t0 = clock::now();
    be->CopyToHost(host.data(), d, 3 * bytes);
    be->Synchronize();
    s = seconds(t0);
    o.d2h_bytes_per_s = s > 0 ? 3.0 * static_cast<double>(bytes) / s : 0;
  }
  be->Free(mem);
  return o;
}

DeviceUpdater::DeviceUpdater(std::unique_ptr<kernels::Backend> backend) : backend_(std::move(backend)) {
  if (const std::string s = EnvString(EnvVar::kTestUpdateFault); !s.empty()) {
    const size_t colon = s.find(':');
    const std::string kind = s.substr(0, colon);
    fault_after_ = colon == std::string::npos ? 0 : std::atoll(s.c_str() + colon + 1);
    fault_ = kind == "hang" ? Fault::kHang : kind == "bad-done" ? Fault::kBadDone : Fault::kNone;
    L2L_LOG_WARN("L2L_TEST_UPDATE_FAULT={}: this worker's update thread misbehaves on purpose (a test hook)", s);
  }
}

DeviceUpdater::~DeviceUpdater() {
  Stop();
  if (dev_ != nullptr) backend_->Free(dev_);
}

void DeviceUpdater::Start(EpsClient* client) {
  stop_ = false;
  thread_ = std::thread([this, client] { Loop(client); });
}

void DeviceUpdater::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Status DeviceUpdater::Run(const UpdateAssignment& a, char* base, size_t bytes) {
  const std::string where = "update task " + std::to_string(a.task_id) + " (layer " + std::to_string(a.layer) + ")";
  if (a.numel <= 0) return InvalidArgument(where + ": numel " + std::to_string(a.numel) + " must be > 0");
  const size_t n = static_cast<size_t>(a.numel);
  const uint64_t offs[] = {a.p_offset, a.m_offset, a.v_offset, a.g_offset};
  const char* names[] = {"p_offset", "m_offset", "v_offset", "g_offset"};
  for (int i = 0; i < 4; ++i) {
    if (offs[i] % alignof(float) != 0 || offs[i] > bytes || bytes - offs[i] < n * sizeof(float)) {
      return InvalidArgument(where + ": " + names[i] + " " + std::to_string(offs[i]) + " + " +
                             std::to_string(n) + " floats lies outside the " + std::to_string(bytes) +
                             "-byte exchange segment");
    }
  }
  for (const auto& r : a.ranges) {
    if (r.begin < 0 || r.begin > r.end || r.end > a.numel) {
      return InvalidArgument(where + ": range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                             ") outside the layer's " + std::to_string(a.numel) + " floats");
    }
  }
  float* p = reinterpret_cast<float*>(base + a.p_offset);
  float* m = reinterpret_cast<float*>(base + a.m_offset);
  float* v = reinterpret_cast<float*>(base + a.v_offset);
  const float* g = reinterpret_cast<const float*>(base + a.g_offset);
  kernels::Backend* be = backend_.get();
  auto update = [&](float* dp, const float* dg, float* dm, float* dv) {
    for (const auto& r : a.ranges) {
      be->AdamW(dp + r.begin, dg + r.begin, dm + r.begin, dv + r.begin, r.end - r.begin,
                WithDecay(a.adamw, r.decay));
    }
  };
  if (be->kind() == kernels::DeviceKind::kCpu) {  // device memory is host memory: in place
    update(p, g, m, v);
    return Status::Ok();
  }
  if (dev_numel_ < n) {
    if (dev_ != nullptr) be->Free(dev_);
    dev_ = nullptr;
    dev_numel_ = 0;
    L2L_ASSIGN_OR_RETURN(void* mem, be->Alloc(4 * n * sizeof(float)));
    dev_ = static_cast<float*>(mem);
    dev_numel_ = n;
  }
  float *dp = dev_, *dm = dev_ + dev_numel_, *dv = dev_ + 2 * dev_numel_, *dg = dev_ + 3 * dev_numel_;
  be->CopyToDevice(dp, p, n * sizeof(float));
  be->CopyToDevice(dm, m, n * sizeof(float));
  be->CopyToDevice(dv, v, n * sizeof(float));
  be->CopyToDevice(dg, g, n * sizeof(float));
  update(dp, dg, dm, dv);
  be->CopyToHost(p, dp, n * sizeof(float));
  be->CopyToHost(m, dm, n * sizeof(float));
  be->CopyToHost(v, dv, n * sizeof(float));
  be->Synchronize();
  return Status::Ok();
}

Status DeviceUpdater::RunOnSegment(const UpdateAssignment& a) {
  if (seg_.data() == nullptr || seg_.name() != a.segment) {
    seg_ = ShmSegment();
    L2L_ASSIGN_OR_RETURN(seg_, ShmSegment::Open(a.segment, /*writable=*/true));
  }
  return Run(a, static_cast<char*>(seg_.data()), seg_.size());
}

void DeviceUpdater::Loop(EpsClient* client) {
  int64_t errors = 0;
  while (!stop_.load()) {
    Result<UpdateAssignment> a = client->TakeUpdate(std::chrono::milliseconds(1000));
    if (!a.ok()) {
      if (a.status().code() == StatusCode::kFailedPrecondition && !NeedsRejoin(a.status())) {
        L2L_LOG_WARN("device updates stop: {}", a.status().ToString());
        return;
      }
      // Rejoining, the daemon restarting or stopping: ask again shortly.
      if (++errors % 50 == 1) L2L_LOG_INFO("device updates: {} (asking again)", a.status().ToString());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    if (!a->has_task) continue;
    if (fault_ == Fault::kHang && done_.load() >= fault_after_) {
      L2L_LOG_WARN("L2L_TEST_UPDATE_FAULT: holding update task {} (layer {}) without answering", a->task_id,
                   a->layer);
      while (!stop_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return;
    }
    Status st = RunOnSegment(*a);
    int64_t numel = a->numel;
    if (fault_ == Fault::kBadDone && done_.load() >= fault_after_) numel += 1;
    if (!st.ok()) L2L_LOG_WARN("device update of layer {} failed: {}", a->layer, st.ToString());
    Status d = client->UpdateDone(a->task_id, a->layer, numel, st.ok() ? "" : st.ToString());
    if (!d.ok()) {
      L2L_LOG_WARN("device updates: {}", d.ToString());
    } else if (st.ok()) {
      done_.fetch_add(1);
    }
  }
}

}  // namespace l2l::worker
